/**
 * LUFFY's off-policy term against hand formulas: on off-policy tokens −f(p)·A with f(p) = p/(p + γ)
 * (p = π_θ, or π_θ/π_b with behaviour log-probs), no clip; its gradient by central differences and
 * in closed form (d/d log π of −f(p)·A is −A·γp/(p + γ)²); the 'sft' baseline's −log π; the
 * unclipped on-policy surrogate; and mixed-group advantages with statistics over the on-policy rows.
 */
import * as L from '@lathe/onnx';
import { grpoAdvantages, policyLoss, type PolicyLossConfig } from '@lathe/grpo';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';

const B = 3;
const T = 5;
const mask = [
  [1, 1, 1, 1, 0],
  [0, 1, 1, 1, 1],
  [1, 1, 1, 0, 0],
];
// row 1 is an off-policy trace
const off = [
  [0, 0, 0, 0, 0],
  [1, 1, 1, 1, 1],
  [0, 0, 0, 0, 0],
];

interface Inputs {
  logp: number[][];
  old: number[][];
  adv: number[][];
  ent: number[][];
}

function inputs(seed: number, behaviour: boolean): Inputs {
  const r = rng(seed);
  const u = (lo: number, hi: number) => lo + (hi - lo) * r();
  const inp: Inputs = { logp: [], old: [], adv: [], ent: [] };
  for (let b = 0; b < B; b++) {
    inp.logp.push(mask[b].map((m) => (m ? u(-4, -0.05) : -30)));
    // on-policy rows: ratios inside and outside the clip range; the trace: 0 (no behaviour log-probs) or its own
    inp.old.push(inp.logp[b].map((lp) => (off[b][0] ? (behaviour ? lp - u(-1, 1) : 0) : lp - u(-0.5, 0.5))));
    // one advantage per row, as an outcome estimator gives it
    const A = u(-2, 2);
    inp.adv.push(mask[b].map((m) => (m ? A : 9)));
    inp.ent.push(mask[b].map((m) => (m ? u(0, 2) : 50)));
  }
  return inp;
}

/** The loss on the host, float64, token-mean over every response token. */
function hostLoss(inp: Inputs, cfg: { gamma: number; term: 'shaped' | 'sft'; sftCoef: number; clip: number; entropyCoef: number; unclipped: boolean }) {
  let sum = 0;
  let n = 0;
  let offTokens = 0;
  let offProb = 0;
  let onRatio = 0;
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T; t++) {
      if (!mask[b][t]) continue;
      n++;
      const A = inp.adv[b][t];
      const lr = inp.logp[b][t] - inp.old[b][t];
      let pg: number;
      if (off[b][t]) {
        const p = Math.exp(lr);
        pg = cfg.term === 'sft' ? -cfg.sftCoef * inp.logp[b][t] : (-p / (p + cfg.gamma)) * A;
        offTokens++;
        offProb += p;
      } else {
        const r = Math.exp(lr);
        const rc = Math.min(Math.max(r, 1 - cfg.clip), 1 + cfg.clip);
        pg = cfg.unclipped ? -r * A : -Math.min(r * A, rc * A);
        onRatio += r;
      }
      sum += pg - cfg.entropyCoef * inp.ent[b][t];
    }
  }
  return { loss: sum / n, off_tokens: offTokens, off_prob_sum: offProb, on_ratio_sum: onRatio, tokens: n };
}

const f64 = (rows: number[][]): HostTensor => ({ data: Float64Array.from(rows.flat()), dims: [rows.length, rows[0].length] });

async function lossGraph(cfg: PolicyLossConfig) {
  const g = new L.Graph('off_policy_loss');
  const t = (name: string) => g.input(name, 'float64', ['B', 'T']);
  const logp = t('logp');
  const out = policyLoss({ logp, oldLogp: t('old'), advantages: t('adv'), entropy: t('entropy'), offPolicy: t('off'), mask: g.input('mask', 'int64', ['B', 'T']), normaliser: g.input('normaliser', 'float64', []) }, cfg);
  g.output(out.loss, 'loss');
  for (const [k, v] of Object.entries(out.metrics)) if (v) g.output(v, k);
  g.output(L.grad(out.loss, [logp])[0], 'd_logp');
  const run = await compile(g);
  const n = mask.flat().reduce((a, b) => a + b, 0);
  return (inp: Inputs) =>
    run({
      logp: f64(inp.logp),
      old: f64(inp.old),
      adv: f64(inp.adv),
      entropy: f64(inp.ent),
      off: f64(off),
      mask: { data: BigInt64Array.from(mask.flat().map(BigInt)), dims: [B, T] },
      normaliser: { data: Float64Array.from([n]), dims: [] },
    });
}

const cases = [
  { name: 'shaped, π_θ itself (no behaviour log-probs), PPO clip on the samples', behaviour: false, cfg: { offPolicy: { gamma: 0.1 }, entropyCoef: 0.001 } as PolicyLossConfig, host: { gamma: 0.1, term: 'shaped' as const, sftCoef: 1, clip: 0.2, entropyCoef: 0.001, unclipped: false } },
  { name: 'shaped, π_θ/π_b (behaviour log-probs), γ 0.5, unclipped samples', behaviour: true, cfg: { offPolicy: { gamma: 0.5 }, policyTerm: 'unclipped' } as PolicyLossConfig, host: { gamma: 0.5, term: 'shaped' as const, sftCoef: 1, clip: 0.2, entropyCoef: 0, unclipped: true } },
  { name: "the 'sft' baseline term", behaviour: false, cfg: { offPolicy: { term: 'sft', sftCoef: 0.7 } } as PolicyLossConfig, host: { gamma: 0.1, term: 'sft' as const, sftCoef: 0.7, clip: 0.2, entropyCoef: 0, unclipped: false } },
];

describe.each(cases)('$name', ({ behaviour, cfg, host }) => {
  const inp = inputs(behaviour ? 7 : 3, behaviour);

  test('loss and split metrics match the float64 host formula', async () => {
    const out = await (await lossGraph(cfg))(inp);
    const ref = hostLoss(inp, host);
    for (const [k, v] of Object.entries(ref)) expect([k, Number(out[k].data[0])]).toEqual([k, expect.closeTo(v, 10)]);
  });

  test('d loss / d log π: central differences, and on the trace the closed form', async () => {
    const run = await lossGraph(cfg);
    const grad = (await run(inp)).d_logp.data as Float64Array;
    const n = mask.flat().reduce((a, b) => a + b, 0);
    const h = 1e-6;
    for (let b = 0; b < B; b++) {
      for (let t = 0; t < T; t++) {
        const at = async (d: number) => {
          const logp = inp.logp.map((row) => row.slice());
          logp[b][t] += d;
          return Number((await run({ ...inp, logp })).loss.data[0]);
        };
        const fd = ((await at(h)) - (await at(-h))) / (2 * h);
        expect(grad[b * T + t]).toBeCloseTo(fd, 7);
        if (!mask[b][t]) expect(grad[b * T + t]).toBe(0);
        else if (off[b][t]) {
          const p = Math.exp(inp.logp[b][t] - inp.old[b][t]);
          const closed = host.term === 'sft' ? -host.sftCoef / n : (-inp.adv[b][t] * host.gamma * p) / (p + host.gamma) ** 2 / n;
          expect(grad[b * T + t]).toBeCloseTo(closed, 10);
        }
      }
    }
  });
});

test('the shaped term has no clip: its gradient stays nonzero where a PPO ratio would be clipped', async () => {
  // the trace's log-probs far above the (zero) old log-prob: a ratio clip would zero the gradient
  const inp = inputs(11, false);
  inp.logp[1] = inp.logp[1].map((lp, t) => (mask[1][t] ? -0.01 : lp));
  inp.adv[1] = inp.adv[1].map((a, t) => (mask[1][t] ? 1 : a));
  const grad = (await (await lossGraph({ offPolicy: { gamma: 0.1 } }))(inp)).d_logp.data as Float64Array;
  for (let t = 1; t < T; t++) expect(grad[T + t]).toBeLessThan(0);
});

test('mixed-group advantages: over the whole group (LUFFY), or with mean and std of the samples alone', () => {
  // one group: three samples scoring 0, 0, 1 and a trace scoring 1
  const rewards = [0, 0, 1, 1];
  const mixed = grpoAdvantages({ rewards, groupSize: 4 }, { scale: 'none' });
  expect(mixed.advantages).toEqual([-0.5, -0.5, 0.5, 0.5]);
  const on = grpoAdvantages({ rewards, groupSize: 4, statsFrom: [true, true, true, false] });
  const mu = 1 / 3;
  const sd = Math.sqrt(((2 * mu ** 2 + (1 - mu) ** 2) / 2));
  on.advantages.forEach((a, i) => expect(a).toBeCloseTo((rewards[i] - mu) / (sd + 1e-6), 12));
  // samples all wrong, the trace right: the samples' std is 0, so the group is centred on their mean only
  const zero = grpoAdvantages({ rewards: [0, 0, 0, 1], groupSize: 4, statsFrom: [true, true, true, false] });
  expect(zero.advantages).toEqual([0, 0, 0, 1]);
  // a group whose samples and trace all agree is uniform: zero
  expect(grpoAdvantages({ rewards: [1, 1, 1, 1], groupSize: 4, statsFrom: [true, true, true, false] }).advantages).toEqual([0, 0, 0, 0]);
  expect(() => grpoAdvantages({ rewards, groupSize: 4, statsFrom: [true] })).toThrow('1 statsFrom flags for 4 rewards');
});

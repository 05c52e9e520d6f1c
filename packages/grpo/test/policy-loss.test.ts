/**
 * The policy loss against a float64 host transcription of its formula (values and metrics), and its
 * gradient with respect to the log-probs against central finite differences of the graph itself.
 */
import * as L from '@lathe/onnx';
import { LOSS_AGGREGATIONS, lossNormaliser, policyLoss, type KlEstimator, type PolicyLossConfig } from '@lathe/grpo';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';

const B = 4;
const T = 6;
// response positions per row: [start, end)
const spans: [number, number][] = [
  [0, 6],
  [2, 5],
  [5, 6],
  [1, 5],
];
const lengths = spans.map(([a, b]) => b - a);
const maskRows = spans.map(([a, b]) => Array.from({ length: T }, (_, t) => (t >= a && t < b ? 1 : 0)));

interface Inputs {
  logp: number[][];
  old: number[][];
  adv: number[][];
  ref: number[][];
  ent: number[][];
}

const KINKS = [Math.log(0.8), Math.log(1.28), Math.log(3)];
const farFromKinks = (x: number) => KINKS.every((k) => Math.abs(x - k) > 0.02);

/** Random inputs whose token and sequence log-ratios stay away from the clip boundaries (the loss's kinks). */
function makeInputs(seed: number): Inputs {
  const r = rng(seed);
  const u = (lo: number, hi: number) => lo + (hi - lo) * r();
  for (;;) {
    const inp: Inputs = { logp: [], old: [], adv: [], ref: [], ent: [] };
    for (let b = 0; b < B; b++) {
      const m = maskRows[b];
      // padding positions hold garbage the mask must hide
      inp.logp.push(m.map((x) => (x ? u(-3, -0.1) : -30)));
      inp.old.push(inp.logp[b].map((lp, t) => (m[t] ? lp - u(-0.6, 1.6) : 0)));
      inp.adv.push(m.map((x) => (x ? u(-2, 2) : 7)));
      inp.ref.push(inp.logp[b].map((lp, t) => (m[t] ? lp + u(-0.5, 0.5) : 5)));
      inp.ent.push(m.map((x) => (x ? u(0, 3) : 100)));
    }
    // one token with A < 0 and r = e^1.4 > 3, where the dual clip binds
    inp.adv[0][0] = -1.2;
    inp.old[0][0] = inp.logp[0][0] - 1.4;
    const tokenOk = inp.logp.every((row, b) => row.every((lp, t) => !maskRows[b][t] || farFromKinks(lp - inp.old[b][t])));
    const seqOk = inp.logp.every((row, b) => farFromKinks(row.reduce((a, lp, t) => a + maskRows[b][t] * (lp - inp.old[b][t]), 0) / lengths[b]));
    if (tokenOk && seqOk) return inp;
  }
}

function kl(logp: number, ref: number, est: KlEstimator): number {
  const x = logp - ref;
  return est === 'k1' ? x : est === 'k2' ? (x * x) / 2 : Math.exp(-x) - 1 + x;
}

/** The loss written out on the host in float64 (independent of the DSL code). */
function hostLoss(inp: Inputs, cfg: Required<Omit<PolicyLossConfig, 'dualClip' | 'lossScaleFactor' | 'offPolicy' | 'rolloutIsThreshold'>> & { dualClip?: number }, normaliser: number) {
  let sum = 0;
  let pgSum = 0;
  let clipped = 0;
  let clippedLow = 0;
  let approxKl = 0;
  let refKl = 0;
  let entropy = 0;
  for (let b = 0; b < B; b++) {
    const m = maskRows[b];
    const n = lengths[b];
    let seqLogRatio = 0;
    for (let t = 0; t < T; t++) if (m[t]) seqLogRatio += (inp.logp[b][t] - inp.old[b][t]) / n;
    const w = cfg.aggregation === 'seq-mean-token-mean' ? 1 / n : 1;
    for (let t = 0; t < T; t++) {
      if (!m[t]) continue;
      const tokenLogRatio = inp.logp[b][t] - inp.old[b][t];
      const r = Math.exp(cfg.ratio === 'sequence' ? seqLogRatio : tokenLogRatio);
      const A = inp.adv[b][t];
      const rc = Math.min(Math.max(r, 1 - cfg.clipLow), 1 + cfg.clipHigh);
      let pg = cfg.policyTerm === 'cispo' ? -rc * A * inp.logp[b][t] : cfg.policyTerm === 'reinforce' ? -A * inp.logp[b][t] : -Math.min(r * A, rc * A);
      if (cfg.dualClip !== undefined && A < 0) pg = Math.min(pg, -cfg.dualClip * A);
      const k = kl(inp.logp[b][t], inp.ref[b][t], cfg.klEstimator);
      sum += w * (pg + cfg.klCoef * k - cfg.entropyCoef * inp.ent[b][t]);
      pgSum += w * pg;
      const low = cfg.policyTerm === 'reinforce' ? false : (cfg.policyTerm === 'cispo' || A < 0) && r < 1 - cfg.clipLow;
      const high = cfg.policyTerm === 'reinforce' ? false : (cfg.policyTerm === 'cispo' || A > 0) && r > 1 + cfg.clipHigh;
      clipped += low || high ? 1 : 0;
      clippedLow += low ? 1 : 0;
      const rt = Math.exp(tokenLogRatio);
      approxKl += rt - 1 - tokenLogRatio;
      refKl += k;
      entropy += inp.ent[b][t];
    }
  }
  return { loss: sum / normaliser, pg_loss: pgSum / normaliser, clipped_tokens: clipped, clipped_low_tokens: clippedLow, approx_kl_sum: approxKl, ref_kl_sum: refKl, entropy_sum: entropy, tokens: lengths.reduce((a, c) => a + c, 0) };
}

const f64 = (rows: number[][]): HostTensor => ({ data: Float64Array.from(rows.flat()), dims: [rows.length, rows[0].length] });

async function lossGraph(cfg: PolicyLossConfig) {
  const g = new L.Graph('policy_loss');
  const t = (name: string) => g.input(name, 'float64', ['B', 'T']);
  const logp = t('logp');
  const entropy = t('entropy');
  const out = policyLoss(
    { logp, oldLogp: t('old'), advantages: t('adv'), refLogp: t('ref'), entropy, mask: g.input('mask', 'int64', ['B', 'T']), normaliser: g.input('normaliser', 'float64', []) },
    cfg,
  );
  g.output(out.loss, 'loss');
  for (const [k, v] of Object.entries(out.metrics)) if (v) g.output(v, k);
  const [dLogp, dEntropy] = L.grad(out.loss, [logp, entropy]);
  g.output(dLogp, 'd_logp');
  g.output(dEntropy, 'd_entropy');
  const run = await compile(g);
  return async (inp: Inputs, normaliser: number) =>
    run({
      logp: f64(inp.logp),
      old: f64(inp.old),
      adv: f64(inp.adv),
      ref: f64(inp.ref),
      entropy: f64(inp.ent),
      mask: { data: BigInt64Array.from(maskRows.flat().map(BigInt)), dims: [B, T] },
      normaliser: { data: Float64Array.from([normaliser]), dims: [] },
    });
}

const full = (cfg: PolicyLossConfig) => ({ policyTerm: 'ppo' as const, clipLow: 0.2, clipHigh: 0.2, ratio: 'token' as const, aggregation: 'token-mean' as const, klCoef: 0, klEstimator: 'k3' as const, entropyCoef: 0, ...cfg });

const configs: PolicyLossConfig[] = [
  {},
  ...LOSS_AGGREGATIONS.flatMap((aggregation) =>
    (['token', 'sequence'] as const).map((ratio): PolicyLossConfig => ({ aggregation, ratio, clipLow: 0.2, clipHigh: 0.28, dualClip: 3, klCoef: 0.1, entropyCoef: 0.01 })),
  ),
  { klCoef: 0.3, klEstimator: 'k1' },
  { klCoef: 0.3, klEstimator: 'k2', aggregation: 'seq-mean-token-sum' },
];

describe.each(configs.map((c, i) => [i, JSON.stringify(c), c] as const))('config %i %s', (i, _name, cfg) => {
  const inp = makeInputs(100 + i);
  const c = full(cfg);
  const normaliser = lossNormaliser(c.aggregation, lengths, { maxLength: 7 });

  test('loss and metrics match the float64 host formula', async () => {
    const run = await lossGraph(cfg);
    const out = await run(inp, normaliser);
    const ref = hostLoss(inp, c, normaliser);
    for (const [k, v] of Object.entries(ref)) expect([k, Number(out[k].data[0])]).toEqual([k, expect.closeTo(v, 10)]);
    expect(ref.clipped_tokens).toBeGreaterThan(0); // the inputs exercise clipping…
    if (c.dualClip !== undefined && c.ratio === 'token') {
      // …and the dual clip (A < 0 with r > c)
      const dual = inp.adv.flatMap((row, b) => row.filter((A, t) => maskRows[b][t] && A < 0 && Math.exp(inp.logp[b][t] - inp.old[b][t]) > c.dualClip!));
      expect(dual.length).toBeGreaterThan(0);
    }
  });

  test('d loss / d logp matches central differences; padding gets none', async () => {
    const run = await lossGraph(cfg);
    const out = await run(inp, normaliser);
    const grad = out.d_logp.data as Float64Array;
    const h = 1e-6;
    for (let b = 0; b < B; b++) {
      for (let t = 0; t < T; t++) {
        const at = (d: number) => {
          const logp = inp.logp.map((row) => row.slice());
          logp[b][t] += d;
          return run({ ...inp, logp }, normaliser);
        };
        const fd = (Number((await at(h)).loss.data[0]) - Number((await at(-h)).loss.data[0])) / (2 * h);
        if (!maskRows[b][t]) expect(grad[b * T + t]).toBe(0);
        expect(grad[b * T + t]).toBeCloseTo(fd, 7);
      }
    }
    // the entropy bonus: d loss / d H = −entropyCoef · (per-sequence weight) / normaliser on response tokens
    const dH = out.d_entropy.data as Float64Array;
    for (let b = 0; b < B; b++) {
      const w = c.aggregation === 'seq-mean-token-mean' ? 1 / lengths[b] : 1;
      for (let t = 0; t < T; t++) expect(dH[b * T + t]).toBeCloseTo(maskRows[b][t] ? (-c.entropyCoef * w) / normaliser : 0, 12);
    }
  });
});

describe.each([
  ['cispo', { policyTerm: 'cispo', clipLow: 0.2, clipHigh: 0.28, klCoef: 0.1, entropyCoef: 0.01 }],
  ['reinforce', { policyTerm: 'reinforce', aggregation: 'seq-mean-token-mean', klCoef: 0.1, klEstimator: 'k1' }],
] as const)('policy term %s', (name, cfg: PolicyLossConfig) => {
  const inp = makeInputs(name === 'cispo' ? 200 : 201);
  const c = full(cfg);
  const normaliser = lossNormaliser(c.aggregation, lengths);

  test('loss and metrics match the float64 host formula', async () => {
    const out = await (await lossGraph(cfg))(inp, normaliser);
    const ref = hostLoss(inp, c, normaliser);
    for (const [k, v] of Object.entries(ref)) expect([k, Number(out[k].data[0])]).toEqual([k, expect.closeTo(v, 10)]);
    if (name === 'cispo') expect(ref.clipped_tokens).toBeGreaterThan(0);
  });

  test('d loss / d logp: the (clipped, constant) weight times −A, plus the KL term, over the normaliser', async () => {
    const out = await (await lossGraph(cfg))(inp, normaliser);
    const grad = out.d_logp.data as Float64Array;
    for (let b = 0; b < B; b++) {
      const w = c.aggregation === 'seq-mean-token-mean' ? 1 / lengths[b] : 1;
      for (let t = 0; t < T; t++) {
        const x = inp.logp[b][t] - inp.ref[b][t];
        const dKl = c.klEstimator === 'k1' ? 1 : c.klEstimator === 'k2' ? x : 1 - Math.exp(-x);
        const r = Math.exp(inp.logp[b][t] - inp.old[b][t]);
        const weight = name === 'cispo' ? Math.min(Math.max(r, 1 - c.clipLow), 1 + c.clipHigh) : 1;
        const expected = maskRows[b][t] ? (w * (-weight * inp.adv[b][t] + c.klCoef * dKl)) / normaliser : 0;
        expect(grad[b * T + t]).toBeCloseTo(expected, 12);
      }
    }
  });
});

test('normalisers of the aggregation modes', () => {
  const lens = [3, 0, 5, 2];
  expect(lossNormaliser('token-mean', lens)).toBe(10);
  expect(lossNormaliser('seq-mean-token-sum', lens)).toBe(3);
  expect(lossNormaliser('seq-mean-token-mean', lens)).toBe(3);
  expect(lossNormaliser('token-sum-norm', lens, { maxLength: 16 })).toBe(64);
  expect(() => lossNormaliser('token-sum-norm', lens)).toThrow(/needs maxLength/);
});

test('bad configurations name the option', () => {
  const g = new L.Graph();
  const x = g.input('x', 'float32', ['B', 'T']);
  const base = { logp: x, oldLogp: x, advantages: x, mask: x, normaliser: g.input('n', 'float32', []) };
  expect(() => policyLoss(base, { klCoef: 0.1 })).toThrow(/klCoef > 0 needs refLogp/);
  expect(() => policyLoss(base, { entropyCoef: 0.1 })).toThrow(/entropyCoef ≠ 0 needs the per-token entropy/);
  expect(() => policyLoss(base, { clipLow: 1.5 })).toThrow(/clipLow must be in \[0, 1\)/);
  expect(() => policyLoss(base, { dualClip: 0.5 })).toThrow(/dualClip must be > 1/);
  expect(() => policyLoss(base, { aggregation: 'mean' as never })).toThrow(/aggregation must be one of token-mean/);
  expect(() => policyLoss(base, { policyTerm: 'a2c' as never })).toThrow(/policyTerm must be one of ppo, cispo, reinforce/);
  expect(() => policyLoss(base, { policyTerm: 'cispo', ratio: 'sequence' })).toThrow(/policyTerm 'cispo' takes token ratios/);
  expect(() => policyLoss(base, { policyTerm: 'reinforce', dualClip: 3 })).toThrow(/dualClip applies to policyTerm 'ppo' only/);
});

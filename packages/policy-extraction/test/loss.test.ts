/**
 * The distillation loss against hand formulas: the per-position KL over candidates (reverse and
 * forward, finite and infinite τ, padded candidate slots, empty positions) equals the float64 host
 * KL of the renormalised distributions; its gradient with respect to the logits matches central
 * differences; and on a tiny random Qwen3 the whole loss equals the KL computed from the full
 * model's logits run alone.
 */
import * as L from '@lathe/onnx';
import { weightInputs } from '@lathe/models';
import { candidateKl, extractionLoss, klDivergence, targetLogprobs, validateTau, type CandidateKlOptions } from '@lathe/policy-extraction';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';
import { logitsRunner, tinyModel, tinyQwen3, weightFeeds } from '../../models/test/tiny';

const B = 2;
const T = 3;
const K = 4;
// candidates per position (the rest of the K slots are padding); one position has none
const counts = [
  [4, 2, 0],
  [1, 3, 4],
];

function data(seed: number) {
  const r = rng(seed);
  const logits: number[] = [];
  const ref: number[] = [];
  const q: number[] = [];
  const mask: number[] = [];
  for (let b = 0; b < B; b++)
    for (let t = 0; t < T; t++) {
      // reference log-probs of real candidates are sorted descending, as the labeller writes them
      const lp = Array.from({ length: K }, () => Math.log(0.05 + r())).sort((x, y) => y - x);
      for (let k = 0; k < K; k++) {
        const real = k < counts[b][t];
        logits.push(real ? 2 * r() - 1 : 50 * r());
        ref.push(real ? lp[k] : 7);
        q.push(real ? r() : 3);
        mask.push(real ? 1 : 0);
      }
    }
  return { logits, ref, q, mask };
}

const softmaxLog = (z: number[]) => {
  const m = Math.max(...z);
  const lse = m + Math.log(z.reduce((s, v) => s + Math.exp(v - m), 0));
  return z.map((v) => v - lse);
};

/** Host KL per position, float64. */
function hostKl(d: ReturnType<typeof data>, logits: number[], opts: CandidateKlOptions): number[] {
  const out: number[] = [];
  for (let p = 0; p < B * T; p++) {
    const n = d.mask.slice(p * K, p * K + K).reduce((a, c) => a + c, 0);
    if (n === 0) {
      out.push(0);
      continue;
    }
    const theta = softmaxLog(logits.slice(p * K, p * K + n));
    const star = targetLogprobs(d.ref.slice(p * K, p * K + n), d.q.slice(p * K, p * K + n), opts.tau);
    out.push(opts.direction === 'forward' ? klDivergence(star, theta) : klDivergence(theta, star));
  }
  return out;
}

async function klGraph(opts: CandidateKlOptions) {
  const g = new L.Graph('candidate_kl');
  const logits = g.input('logits', 'float64', [B, T, K]);
  const kl = candidateKl(logits, g.input('ref', 'float64', [B, T, K]), g.input('q', 'float64', [B, T, K]), g.input('mask', 'int64', [B, T, K]), opts);
  const weight = g.input('weight', 'float64', [B, T]);
  const total = L.reduceSum(L.mul(kl, weight));
  g.output(kl, 'kl');
  g.output(total, 'total');
  g.output(L.grad(total, [logits])[0], 'd_logits');
  const run = await compile(g);
  return (d: ReturnType<typeof data>, logits: number[], weight: number[]) => {
    const f = (xs: number[]): HostTensor => ({ data: Float64Array.from(xs), dims: [B, T, K] });
    return run({ logits: f(logits), ref: f(d.ref), q: f(d.q), mask: { data: BigInt64Array.from(d.mask.map(BigInt)), dims: [B, T, K] }, weight: { data: Float64Array.from(weight), dims: [B, T] } });
  };
}

const cases: { name: string; opts: CandidateKlOptions }[] = [
  { name: 'reverse KL, τ 0.5', opts: { tau: 0.5 } },
  { name: 'reverse KL, τ 0.05 (π* nearly the best candidate)', opts: { tau: 0.05, direction: 'reverse' } },
  { name: 'forward KL, τ 1', opts: { tau: 1, direction: 'forward' } },
  { name: 'reverse KL, τ = ∞ (π* = π_ref over the candidates)', opts: { tau: Infinity } },
];

describe.each(cases)('$name', ({ opts }) => {
  const d = data(11);
  const weight = Array.from({ length: B * T }, (_, i) => 0.3 + 0.2 * i);

  test('per-position KL equals the host KL of the renormalised distributions', async () => {
    const out = await (await klGraph(opts))(d, d.logits, weight);
    const want = hostKl(d, d.logits, opts);
    Array.from(out.kl.data as Float64Array).forEach((v, i) => expect([i, v]).toEqual([i, expect.closeTo(want[i], 10)]));
    expect(want[2]).toBe(0); // the empty position
    expect(Math.min(...want.filter((_, i) => i !== 2))).toBeGreaterThanOrEqual(0);
  });

  test('d loss / d logits: central differences; padded slots get no gradient', async () => {
    const run = await klGraph(opts);
    const grad = Array.from((await run(d, d.logits, weight)).d_logits.data as Float64Array);
    const h = 1e-6;
    for (let i = 0; i < d.logits.length; i++) {
      const plus = d.logits.slice();
      const minus = d.logits.slice();
      plus[i] += h;
      minus[i] -= h;
      const total = (x: number[]) => hostKl(d, x, opts).reduce((s, v, p) => s + v * weight[p], 0);
      const numeric = (total(plus) - total(minus)) / (2 * h);
      expect([i, grad[i]]).toEqual([i, expect.closeTo(numeric, 6)]);
      if (!d.mask[i]) expect(grad[i]).toBe(0);
    }
  });
});

test('τ ≤ 0 and NaN are refused, naming the temperature', () => {
  for (const tau of [0, -1, NaN]) expect(() => validateTau(tau, '--tau')).toThrow(/--tau must be > 0/);
  expect(() => extractionLoss(tinyModel(tinyQwen3, 1).config, { tau: 0 })).toThrow(/tau must be > 0/);
});

// a tiny Qwen3 and a batch of two rows (the second right-padded), candidates at the positions that predict the output
const tiny = tinyModel(tinyQwen3, 5);
const seqs = [
  [3, 9, 14, 20, 7],
  [5, 11, 30],
];
const W = 5;
const KK = 3;
const cand = seqs.map((s) => s.map((_, t) => (t >= 1 && t < s.length - 1 ? [s[t + 1], (s[t + 1] + 7) % 64, (s[t + 1] + 19) % 64].slice(0, 1 + (t % 3)) : [])));
const refLp = cand.map((row) => row.map((cs) => cs.map((_, k) => Math.log(0.6 / (k + 1)))));
const rq = rng(2);
const qs = cand.map((row) => row.map((cs) => cs.map(() => rq())));
const positions = cand.flat().filter((c) => c.length > 0).length;
const flat3 = (f: (b: number, t: number, k: number) => number) => Array.from({ length: 2 * W * KK }, (_, i) => f(Math.floor(i / (W * KK)), Math.floor(i / KK) % W, i % KK));
const has = (b: number, t: number, k: number) => t < seqs[b].length && k < cand[b][t].length;
const i64 = (xs: number[], dims: number[]): HostTensor => ({ data: BigInt64Array.from(xs.map(BigInt)), dims });
const f32 = (xs: number[], dims: number[]): HostTensor => ({ data: Float32Array.from(xs), dims });
const batch: Record<string, HostTensor> = {
  input_ids: i64(seqs.flatMap((s) => [...s, ...Array(W - s.length).fill(0)]), [2, W]),
  attention_mask: i64(seqs.flatMap((s) => [...s.map(() => 1), ...Array(W - s.length).fill(0)]), [2, W]),
  candidate_ids: i64(flat3((b, t, k) => (has(b, t, k) ? cand[b][t][k] : 0)), [2, W, KK]),
  candidate_mask: i64(flat3((b, t, k) => (has(b, t, k) ? 1 : 0)), [2, W, KK]),
  candidate_ref_logprobs: f32(flat3((b, t, k) => (has(b, t, k) ? refLp[b][t][k] : 0)), [2, W, KK]),
  candidate_q_values: f32(flat3((b, t, k) => (has(b, t, k) ? qs[b][t][k] : 0)), [2, W, KK]),
  loss_tokens: f32([positions], []),
};

/** The loss graph on the tiny model in `dtype`, with the gradients of `wrt` when given. */
async function tinyLoss(opts: Parameters<typeof extractionLoss>[1], dtype: 'float32' | 'float64', wrt: string[] = []) {
  const g = new L.Graph('extraction_loss');
  const { inputs } = weightInputs(g, tiny.config, dtype, dtype);
  const { loss, metrics } = extractionLoss(tiny.config, { ...opts, compute: dtype })(g, inputs);
  g.output(loss, 'loss');
  for (const [k, v] of Object.entries(metrics ?? {})) g.output(v, k);
  L.grad(loss, wrt.map((n) => inputs.get(n)!)).forEach((d, i) => g.output(d, `d/${wrt[i]}`));
  const run = await compile(g);
  return (weights: Record<string, HostTensor>) => run({ ...weights, ...batch });
}

test('on a tiny Qwen3 the loss is the KL, plus λ·(−log π_θ(C)), from the model run alone, summed over positions with candidates / loss_tokens', async () => {
  const opts: CandidateKlOptions = { tau: 0.3, direction: 'reverse' };
  const logitsRun = await logitsRunner(tiny.dir, tiny.config, 'padding');
  let kl = 0;
  let massNll = 0;
  for (const [b, s] of seqs.entries()) {
    const logits = (await logitsRun({ input_ids: [s], attention_mask: [s.map(() => 1)] })).data as Float32Array;
    cand[b].forEach((cs, t) => {
      if (!cs.length) return;
      const row = Array.from(logits.slice(t * 64, (t + 1) * 64));
      const theta = softmaxLog(cs.map((id) => row[id]));
      kl += klDivergence(theta, targetLogprobs(refLp[b][t], qs[b][t], opts.tau));
      const full = softmaxLog(row);
      massNll -= Math.log(cs.reduce((a, id) => a + Math.exp(full[id]), 0));
    });
  }
  const feeds = weightFeeds(tiny.dir, tiny.config, 'float32');
  const plain = await (await tinyLoss(opts, 'float32'))(feeds);
  expect((plain.kl_sum.data as Float32Array)[0]).toBeCloseTo(kl, 4);
  expect((plain.positions.data as Float32Array)[0]).toBe(positions);
  expect((plain.loss.data as Float32Array)[0]).toBeCloseTo(kl / positions, 4);
  const withMass = await (await tinyLoss({ ...opts, candidateMass: 0.7, chunk: 16 }, 'float32'))(feeds);
  expect(massNll).toBeGreaterThan(0.1); // the tiny model puts real mass off the candidates
  expect((withMass.mass_nll_sum.data as Float32Array)[0]).toBeCloseTo(massNll, 4);
  expect((withMass.loss.data as Float32Array)[0]).toBeCloseTo((kl + 0.7 * massNll) / positions, 4);
});

test.each([
  ['reverse KL with the candidate-mass term', { tau: 0.3, candidateMass: 0.7, chunk: 16 }],
  ['forward KL', { tau: 0.5, direction: 'forward' as const }],
])('%s: d loss / d weights of the whole model (float64) against central differences', async (_name, opts) => {
  const wrt = ['model.norm.weight', 'model.layers.1.mlp.down_proj.weight', 'model.embed_tokens.weight'];
  const run = await tinyLoss(opts, 'float64', wrt);
  const feeds = weightFeeds(tiny.dir, tiny.config, 'float64');
  const out = await run(feeds);
  const pick = rng(9);
  const h = 1e-5;
  let checked = 0;
  for (const name of wrt) {
    const base = feeds[name].data as Float64Array;
    // the embedding rows of candidate ids (the head is tied) and a few random entries elsewhere
    const entries = name === 'model.embed_tokens.weight' ? [14 * 32 + 3, 21 * 32 + 7, 20 * 32 + 1] : Array.from({ length: 3 }, () => Math.floor(pick() * base.length));
    for (const e of entries) {
      const at = (delta: number) => {
        const data = Float64Array.from(base);
        data[e] += delta;
        return run({ ...feeds, [name]: { data, dims: feeds[name].dims } }).then((r) => (r.loss.data as Float64Array)[0]);
      };
      const numeric = ((await at(h)) - (await at(-h))) / (2 * h);
      const analytic = (out[`d/${name}`].data as Float64Array)[e];
      expect([name, e, analytic]).toEqual([name, e, expect.closeTo(numeric, 7)]);
      checked++;
    }
  }
  expect(checked).toBe(9);
});

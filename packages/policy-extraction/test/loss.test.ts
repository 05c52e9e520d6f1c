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

test('on a tiny Qwen3 the loss is the KL from the model run alone, summed over positions with candidates / loss_tokens', async () => {
  const { dir, config } = tinyModel(tinyQwen3, 5);
  const g = new L.Graph('extraction_loss');
  const { inputs } = weightInputs(g, config, 'float32', 'float32');
  const opts: CandidateKlOptions = { tau: 0.3, direction: 'reverse' };
  const { loss, metrics } = extractionLoss(config, opts)(g, inputs);
  g.output(loss, 'loss');
  for (const [k, v] of Object.entries(metrics ?? {})) g.output(v, k);
  const run = await compile(g);
  // two rows (the second right-padded); candidates at the positions that predict the output
  const seqs = [
    [3, 9, 14, 20, 7],
    [5, 11, 30],
  ];
  const W = 5;
  const r = rng(2);
  const cand = seqs.map((s) => s.map((_, t) => (t >= 1 && t < s.length - 1 ? [s[t + 1], (s[t + 1] + 7) % 64, (s[t + 1] + 19) % 64].slice(0, 1 + (t % 3)) : [])));
  const refLp = cand.map((row) => row.map((cs) => cs.map((_, k) => Math.log(0.6 / (k + 1)))));
  const qs = cand.map((row) => row.map((cs) => cs.map(() => r())));
  const KK = 3;
  const flat3 = (f: (b: number, t: number, k: number) => number) => Array.from({ length: 2 * W * KK }, (_, i) => f(Math.floor(i / (W * KK)), Math.floor(i / KK) % W, i % KK));
  const has = (b: number, t: number, k: number) => t < seqs[b].length && k < cand[b][t].length;
  const i64 = (xs: number[], dims: number[]): HostTensor => ({ data: BigInt64Array.from(xs.map(BigInt)), dims });
  const f32 = (xs: number[], dims: number[]): HostTensor => ({ data: Float32Array.from(xs), dims });
  const positions = cand.flat().filter((c) => c.length > 0).length;
  const out = await run({
    ...weightFeeds(dir, config, 'float32'),
    input_ids: i64(seqs.flatMap((s) => [...s, ...Array(W - s.length).fill(0)]), [2, W]),
    attention_mask: i64(seqs.flatMap((s) => [...s.map(() => 1), ...Array(W - s.length).fill(0)]), [2, W]),
    candidate_ids: i64(flat3((b, t, k) => (has(b, t, k) ? cand[b][t][k] : 0)), [2, W, KK]),
    candidate_mask: i64(flat3((b, t, k) => (has(b, t, k) ? 1 : 0)), [2, W, KK]),
    candidate_ref_logprobs: f32(flat3((b, t, k) => (has(b, t, k) ? refLp[b][t][k] : 0)), [2, W, KK]),
    candidate_q_values: f32(flat3((b, t, k) => (has(b, t, k) ? qs[b][t][k] : 0)), [2, W, KK]),
    loss_tokens: f32([positions], []),
  });
  const logitsRun = await logitsRunner(dir, config, 'padding');
  let want = 0;
  for (const [b, s] of seqs.entries()) {
    const logits = (await logitsRun({ input_ids: [s], attention_mask: [s.map(() => 1)] })).data as Float32Array;
    cand[b].forEach((cs, t) => {
      if (!cs.length) return;
      const theta = softmaxLog(cs.map((id) => logits[t * 64 + id]));
      want += klDivergence(theta, targetLogprobs(refLp[b][t], qs[b][t], opts.tau));
    });
  }
  expect((out.kl_sum.data as Float32Array)[0]).toBeCloseTo(want, 4);
  expect((out.positions.data as Float32Array)[0]).toBe(positions);
  expect((out.loss.data as Float32Array)[0]).toBeCloseTo(want / positions, 4);
});

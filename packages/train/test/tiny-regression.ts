/**
 * The small regression problem the trainer tests train: y = tanh(x W1) W2 + b, loss = Σ (y − t)² /
 * n_total (normalised by the whole optimizer batch, so accumulation is exact), with seeded weights
 * and batches.
 */
import * as L from '@lathe/onnx';
import type { HostTensor } from '@lathe/runtime';
import type { LossBuilder, TrainableParam } from '@lathe/train';

export const params: TrainableParam[] = [
  { name: 'w1', shape: [6, 8], decay: true },
  { name: 'w2', shape: [8, 3], decay: true },
  { name: 'b', shape: [3], decay: false },
];

export const loss: LossBuilder = (g, p) => {
  const x = g.input('x', 'float32', ['B', 6]);
  const t = g.input('t', 'float32', ['B', 3]);
  const n = g.input('n_total', 'float32', []);
  const y = L.add(L.matmul(L.matmul(x, p.get('w1')!).tanh(), p.get('w2')!), p.get('b')!);
  const err = L.sub(y, t);
  return { loss: L.div(L.mul(err, err).sum(), n), metrics: { abs_err: L.div(err.abs().sum(), n) } };
};

/** `n` values in [−1, 1) from `seed` (a linear congruential generator). */
export function rand(n: number, seed: number): Float32Array {
  let s = seed >>> 0;
  return Float32Array.from({ length: n }, () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32) * 2 - 1);
}

/** Seeded starting weights, by parameter name. */
export const init = () => new Map(params.map((p, i) => [p.name, rand(p.shape.reduce((a, b) => a * b, 1), 10 + i)]));

/** `rows` seeded rows, normalised by an optimizer batch of `total` rows. */
export const batchOf = (rows: number, seed: number, total: number): Record<string, HostTensor> => ({
  x: { data: rand(rows * 6, seed), dims: [rows, 6] },
  t: { data: rand(rows * 3, seed + 1), dims: [rows, 3] },
  n_total: { data: Float32Array.from([total]), dims: [] },
});

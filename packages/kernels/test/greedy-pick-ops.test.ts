/**
 * The graph side of Lathe's greedy-pick kernels on the CPU (the op's host compute, float32): the host
 * rule on known answers (ties, −∞, NaN, +∞); the op in a graph against the composed greedy path
 * (`firstArgMax` and a LogSoftmax gather, as `sampleNext` builds it at temperature 0) on random logits
 * with injected ties, in one session; refusals. The kernels themselves are tested in
 * greedy-pick-emulated.test.ts (CPU emulation); the engine's wiring in greedy-pick-engine.test.ts.
 */
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { firstArgMax } from '@lathe/rollout';
import { greedyPickOps, greedyPickReference } from '@lathe/kernels';

test('the host rule: the first maximum wins, −∞ weighs 0, NaN is never picked but poisons the log-prob', () => {
  const rows = [
    [1, 3, 3, 0], // tie: index 1, −log(2 + e⁻² + e⁻³)
    [-Infinity, 2, -Infinity, 2], // −∞ entries: index 1, −log 2
    [-Infinity, -Infinity, -Infinity, -Infinity], // nothing above −∞: 0, NaN
    [NaN, 1, 5, 5], // NaN: index 2, NaN
    [0, Infinity, 1, Infinity], // +∞: its first place, NaN
    [7, 7, 7, 7], // all equal: 0, −log 4
  ];
  const r = greedyPickReference(rows.flat(), rows.length, 4);
  expect(Array.from(r.tokens, Number)).toEqual([1, 1, 0, 2, 1, 0]);
  const want = [-Math.log(2 + Math.exp(-2) + Math.exp(-3)), -Math.log(2), NaN, NaN, NaN, -Math.log(4)];
  want.forEach((w, i) => (Number.isNaN(w) ? expect(r.logprobs[i]).toBeNaN() : expect(r.logprobs[i]).toBeCloseTo(w, 6)));
});

test('the op equals the composed greedy path (firstArgMax, LogSoftmax gather) on random logits with ties', () => {
  const R = 6;
  const V = 640; // five 128-wide chunks, as firstArgMax splits Qwen's vocabulary
  let seed = 3;
  const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31) * 8 - 4;
  const logits = Float32Array.from({ length: R * V }, rand);
  // ties: the max at several places in one chunk, in different chunks, at both ends; an all-equal row
  const tied: [number, number[]][] = [
    [0, [5, 6, 600]],
    [1, [639, 130, 255]],
    [2, [0, 639]],
    [3, [127, 128]],
  ];
  for (const [r, at] of tied) for (const j of at) logits[r * V + j] = 9;
  logits.fill(0.25, 5 * V, 6 * V);

  const ops = greedyPickOps('cpu');
  const g = new L.Graph('greedy_pick_vs_composed');
  const x = g.input('logits', 'float32', [R, V]);
  const fused = ops.apply(x);
  g.output(fused.tokens, 'kernel/tokens');
  g.output(fused.logprobs, 'kernel/logprobs');
  const tokens = firstArgMax(x); // [R, 1]
  g.output(L.squeeze(tokens, [1]), 'composed/tokens');
  g.output(L.squeeze(L.gatherElements(L.logSoftmax(x, 1), tokens, 1), [1]), 'composed/logprobs');
  expect(g.nodes.filter((n) => n.op.name === 'GreedyPick_float32')).toHaveLength(1);
  expect([fused.tokens.dtype, fused.logprobs.dtype, fused.tokens.shape, fused.logprobs.shape]).toEqual(['int64', 'float32', [R], [R]]);

  const session = Device.cpu().compile(g, { customOpDomains: [ops.domain.handle] });
  const bind = session.binding();
  bind.input('logits', { data: logits, dims: [R, V] });
  for (const p of ['kernel', 'composed']) for (const o of ['tokens', 'logprobs']) bind.output(`${p}/${o}`, 'host');
  bind.runSync();
  ops.check();
  const got = Array.from(bind.fetch('kernel/tokens').data as BigInt64Array, Number);
  expect(got).toEqual(Array.from(bind.fetch('composed/tokens').data as BigInt64Array, Number));
  expect(got.slice(0, 4)).toEqual([5, 130, 0, 127]);
  expect(got[5]).toBe(0);
  const a = bind.fetch('kernel/logprobs').data as Float32Array;
  const b = bind.fetch('composed/logprobs').data as Float32Array;
  a.forEach((v, i) => expect(Math.abs(v - b[i])).toBeLessThan(1e-5));
  expect(a[5]).toBeCloseTo(-Math.log(V), 5);
  bind.dispose();
  session.dispose();
  ops.dispose();
});

test('greedyPickOps refuses dtypes it has no kernel for, logits that are not [rows, vocab], and CUDA without kernels', () => {
  const ops = greedyPickOps('cpu');
  const g = new L.Graph('greedy_pick_refusals');
  expect(() => ops.apply(g.input('a', 'bfloat16', [2, 8]))).toThrow(/no kernel for dtype bfloat16/);
  expect(() => ops.apply(g.input('b', 'float32', [2, 1, 8]))).toThrow(/must be \[rows, vocab\]/);
  expect(() => greedyPickOps('cuda')).toThrow(/CUDA needs the compiled GreedyPickKernels/);
  ops.dispose();
});

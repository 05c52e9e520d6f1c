/**
 * SkipSimplifiedLayerNormalization (residual add + RMSNorm in one kernel) against Add and
 * SimplifiedLayerNormalization on ONNX Runtime's CPU kernel, its ONNX form, and its refusals.
 */
import * as L from '@lathe/onnx';
import { compile, rng } from '../../../tools/testing/ort-cpu';

test('equals Add + SimplifiedLayerNormalization, and its sum output equals the Add (float32, [B, S, D] and [rows, D])', async () => {
  for (const shape of [[2, 3, 16], [5, 16]]) {
    const g = new L.Graph('skip-norm');
    const x = g.input('x', 'float32', shape);
    const skip = g.input('skip', 'float32', shape);
    const gamma = g.input('gamma', 'float32', [16]);
    const fused = L.skipSimplifiedLayerNorm(x, skip, gamma, 1e-6);
    const sum = L.add(x, skip);
    g.output(fused.output, 'fused');
    g.output(fused.sum, 'fused_sum');
    g.output(L.simplifiedLayerNorm(sum, gamma, 1e-6), 'composed');
    g.output(sum, 'composed_sum');
    const run = await compile(g);
    const r = rng(shape.length);
    const n = shape.reduce((a, b) => a * b, 1);
    const data = (k: number) => Float32Array.from({ length: k }, () => 4 * r() - 2);
    const [xs, ss, gs] = [data(n), data(n), data(16)];
    const out = await run({ x: { data: xs, dims: shape }, skip: { data: ss, dims: shape }, gamma: { data: gs, dims: [16] } });
    // ORT may fuse the composed pair itself, so a float64 reference checks the kernel too
    const fusedOut = out.fused.data as Float32Array;
    for (let row = 0; row < n / 16; row++) {
      const s = Array.from({ length: 16 }, (_, j) => xs[row * 16 + j] + ss[row * 16 + j]);
      const r = 1 / Math.sqrt(s.reduce((a, v) => a + v * v, 0) / 16 + 1e-6);
      s.forEach((v, j) => expect(Math.abs(fusedOut[row * 16 + j] - v * r * gs[j])).toBeLessThan(1e-5));
    }
    for (const [a, b] of [['fused', 'composed'], ['fused_sum', 'composed_sum']]) {
      expect(out[a].dims).toEqual(shape);
      const diff = Math.max(...Array.from(out[a].data as Float32Array, (v, i) => Math.abs(v - (out[b].data as Float32Array)[i])));
      expect(diff).toBeLessThan(1e-5);
    }
  }
});

test('one com.microsoft node: inputs x, skip, gamma; outputs 1 and 2 fill the training-only slots; epsilon', () => {
  const g = new L.Graph();
  const x = g.input('x', 'bfloat16', ['B', 1, 16]);
  const r = L.skipSimplifiedLayerNorm(x, g.input('skip', 'bfloat16', ['B', 1, 16]), g.input('gamma', 'bfloat16', [16]), 1e-5);
  g.output(r.output, 'y');
  g.output(r.sum, 's');
  expect([r.output.dtype, r.sum.dtype, r.sum.shape]).toEqual(['bfloat16', 'bfloat16', ['B', 1, 16]]);
  const node = L.toModelProto(g).graph.node.find((n) => n.opType === 'SkipSimplifiedLayerNormalization')!;
  expect([node.domain, node.input, node.output.length, node.output[0], node.output[3]]).toEqual(['com.microsoft', ['x', 'skip', 'gamma'], 4, 'y', 's']);
  expect((node.attribute ?? []).find((a) => a.name === 'epsilon')?.f).toBeCloseTo(1e-5, 10);
});

test('refuses mixed dtypes and mismatched shapes; autodiff refuses a path through it', () => {
  const g = new L.Graph();
  const x = g.input('x', 'float32', [2, 3, 8]);
  const w = g.input('w', 'float32', [8]);
  expect(() => L.skipSimplifiedLayerNorm(x, g.input('bf', 'bfloat16', [2, 3, 8]), w, 1e-6)).toThrow(/skip and gamma must be float32/);
  expect(() => L.skipSimplifiedLayerNorm(x, g.input('short', 'float32', [2, 2, 8]), w, 1e-6)).toThrow(/skip must have the input's shape/);
  expect(() => L.skipSimplifiedLayerNorm(x, x, g.input('w4', 'float32', [4]), 1e-6)).toThrow(/gamma must be \[8\]/);
  const loss = L.reduceSum(L.skipSimplifiedLayerNorm(x, x, w, 1e-6).output, [0, 1, 2], false);
  expect(() => L.grad(loss, [x])).toThrow(/SkipSimplifiedLayerNormalization .* has no gradient rule/);
});

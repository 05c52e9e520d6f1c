/**
 * The backward pass through frozen quantized weights (what LoRA over a quantized base needs):
 * for y = x · dequant(W)ᵀ and loss = Σ y ⊙ c, dloss/dx = c · dequant(W), through the weights
 * dequantized from standard ops; checked against the product computed here, and by finite
 * differences of the kernels' forward. NF4's other backward, MatMulBnb4 with transB = 0, is CUDA
 * only (ONNX Runtime's CPU kernel multiplies by Wᵀ whatever transB says): here its graph is checked.
 */
import * as L from '@lathe/onnx';
import { declareQuantizedLinear, dequantize, kernelLayout, quantizedMatmul, quantizeInt4, quantizeInt8, quantizeNf4, type QuantizedMatrix } from '@lathe/quantization';
import { compile } from '../../../tools/testing/ort-cpu';
import { gaussian } from './data';

const [M, N, K] = [3, 24, 128];

describe.each([
  ['nf4 (MatMulBnb4)', (w: Float32Array) => quantizeNf4(w, N, K, { doubleQuant: true })],
  ['int4 (MatMulNBits, dequantized)', (w: Float32Array) => quantizeInt4(w, N, K, { blockSize: 32, zeroPoints: true })],
  ['int8 (MatMulNBits, dequantized)', (w: Float32Array) => quantizeInt8(w, N, K)],
] as [string, (w: Float32Array) => QuantizedMatrix][])('%s', (_name, quantize) => {
  test('dloss/dx = c · dequant(W), and matches finite differences of the kernel forward', async () => {
    const m = quantize(gaussian(N * K, 31));
    const g = new L.Graph('grad');
    const x = g.input('x', 'float32', [M, K]);
    const c = g.input('c', 'float32', [M, N]);
    const y = quantizedMatmul(x, declareQuantizedLinear(g, 'w', kernelLayout(m), { inline: true }), 'kernel');
    const loss = L.reduceSum(L.mul(y, c), [0, 1]);
    const [dx] = L.grad(loss, [x]);
    g.output(loss, 'loss');
    g.output(dx, 'dx');
    const run = await compile(g);
    const xv = gaussian(M * K, 32, 1);
    const cv = gaussian(M * N, 33, 1);
    const out = await run({ x: { data: xv, dims: [M, K] }, c: { data: cv, dims: [M, N] } });
    const w = dequantize(m);
    const got = out.dx.data as Float32Array;
    for (let i = 0; i < M; i++) {
      for (let k = 0; k < K; k++) {
        let s = 0;
        for (let n = 0; n < N; n++) s += cv[i * N + n] * w[n * K + k];
        expect(got[i * K + k]).toBeCloseTo(s, 5);
      }
    }
    // Finite differences of the forward (float32): two coordinates.
    for (const [i, k] of [
      [0, 5],
      [2, 77],
    ]) {
      const h = 1e-2;
      const bump = (d: number) => {
        const xs = Float32Array.from(xv);
        xs[i * K + k] += d;
        return run({ x: { data: xs, dims: [M, K] }, c: { data: cv, dims: [M, N] } }).then((o) => (o.loss.data as Float32Array)[0]);
      };
      const fd = ((await bump(h)) - (await bump(-h))) / (2 * h);
      expect(fd).toBeCloseTo(got[i * K + k], 2);
    }
  });
});

test("NF4 backward 'kernel': the gradient is one MatMulBnb4 node with transB = 0 reading the same codes", () => {
  const m = quantizeNf4(gaussian(N * K, 31), N, K);
  const g = new L.Graph('grad');
  const x = g.input('x', 'float32', [M, K]);
  const t = declareQuantizedLinear(g, 'w', kernelLayout(m), { inline: true });
  const [dx] = L.grad(L.reduceSum(quantizedMatmul(x, t, 'kernel', 'kernel'), [0, 1]), [x]);
  g.output(dx, 'dx');
  const nodes = g.nodes.filter((n) => n.op.name === 'MatMulBnb4');
  expect(nodes.map((n) => (n.attrs as { transB: number }).transB).sort()).toEqual([0, 1]);
  const back = nodes.find((n) => (n.attrs as { transB: number }).transB === 0)!;
  expect(back.inputs[1]).toBe(t.b);
  expect(back.outputs[0].shape).toEqual([M, K]);
  expect(L.toModelBytes(g).byteLength).toBeGreaterThan(0);
});

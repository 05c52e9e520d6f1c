/**
 * The layouts against ONNX Runtime's own kernels on the CPU: MatMulNBits (4 and 8 bits) and
 * MatMulBnb4 (NF4) given x = I return exactly the package's dequantized Wᵀ (each output is one
 * product plus zeros), the standard-op dequantize fallback returns the same bits, and on random
 * x the quantized matmul equals x · dequant(W)ᵀ up to float32 summation order.
 */
import * as L from '@lathe/onnx';
import { declareQuantizedLinear, dequantize, kernelLayout, quantizedMatmul, quantizeInt4, quantizeInt8, quantizeNf4, type QuantizedMatrix } from '@lathe/quantization';
import { compile } from '../../../tools/testing/ort-cpu';
import { gaussian, heavyTailed } from './data';

async function run(m: QuantizedMatrix, x: Float32Array, M: number): Promise<{ kernel: Float32Array; fallback: Float32Array }> {
  const g = new L.Graph('q');
  const a = g.input('x', 'float32', [M, m.cols]);
  const t = declareQuantizedLinear(g, 'w', kernelLayout(m), { inline: true });
  g.output(quantizedMatmul(a, t, 'kernel'), 'kernel');
  g.output(quantizedMatmul(a, t, 'dequantize'), 'fallback');
  const out = await (await compile(g))({ x: { data: x, dims: [M, m.cols] } });
  return { kernel: out.kernel.data as Float32Array, fallback: out.fallback.data as Float32Array };
}

function identity(K: number): Float32Array {
  const x = new Float32Array(K * K);
  for (let i = 0; i < K; i++) x[i * K + i] = 1;
  return x;
}

function transpose(w: Float32Array, N: number, K: number): Float32Array {
  const t = new Float32Array(N * K);
  for (let n = 0; n < N; n++) for (let k = 0; k < K; k++) t[k * N + n] = w[n * K + k];
  return t;
}

const cases: [string, (w: Float32Array, N: number, K: number) => QuantizedMatrix][] = [
  ['int8', (w, N, K) => quantizeInt8(w, N, K)],
  ['int4 block 32', (w, N, K) => quantizeInt4(w, N, K, { blockSize: 32 })],
  ['int4 block 64 + zero points', (w, N, K) => quantizeInt4(w, N, K, { blockSize: 64, zeroPoints: true })],
  ['int4 block 128', (w, N, K) => quantizeInt4(w, N, K, { blockSize: 128 })],
  ['nf4', (w, N, K) => quantizeNf4(w, N, K)],
  ['nf4 + double quant', (w, N, K) => quantizeNf4(w, N, K, { doubleQuant: true })],
];

describe.each(cases)('%s', (_name, quantize) => {
  test.each([
    [24, 256],
    [10, 96], // K pads the 64/128 blocks
  ])('[%i, %i]: kernel(I) and the fallback are the dequantized Wᵀ bit for bit', async (N, K) => {
    const m = quantize(heavyTailed(N * K, 5), N, K);
    const out = await run(m, identity(K), K);
    const want = transpose(dequantize(m), N, K);
    const bits = (a: Float32Array) => Array.from(a, (v) => (v === 0 ? 0 : v)); // +0 and −0 are one value
    expect(bits(out.kernel)).toEqual(bits(want));
    expect(bits(out.fallback)).toEqual(bits(want));
  });

  test('quantized matmul = x · dequant(W)ᵀ on random x', async () => {
    const [M, N, K] = [5, 32, 256];
    const m = quantize(gaussian(N * K, 6), N, K);
    const x = gaussian(M * K, 7, 1);
    const out = await run(m, x, M);
    const w = dequantize(m);
    let worst = 0;
    let scale = 0;
    for (let i = 0; i < M; i++) {
      for (let n = 0; n < N; n++) {
        let s = 0;
        for (let k = 0; k < K; k++) s += x[i * K + k] * w[n * K + k];
        worst = Math.max(worst, Math.abs(out.kernel[i * N + n] - s), Math.abs(out.fallback[i * N + n] - s));
        scale = Math.max(scale, Math.abs(s));
      }
    }
    expect(scale).toBeGreaterThan(0.05);
    expect(worst).toBeLessThan(1e-5 * scale);
  });
});

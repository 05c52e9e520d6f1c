/**
 * Lathe's W4A16 kernel (`w4a16Ops` of @lathe/kernels) behind `quantizedWeights: 'kernel'`: its
 * arithmetic (the kernels' host reference, which the CPU emulation of the CUDA source is tested
 * against) equals this package's INT4 quantizer and dequantizer with a float64 product; the
 * generation graphs route decode steps' INT4 projections through the op and keep MatMulNBits
 * elsewhere; and a KV-cache generator over the op (its CPU path) generates what bound MatMulNBits does.
 */
import * as L from '@lathe/onnx';
import { CausalLM, type DecoderConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { KvCacheGenerator, type Completion } from '@lathe/rollout';
import { w4a16Ops, w4a16Reference } from '@lathe/kernels';
import { dequantize, kernelLayout, QuantizedModel, quantizeInt4, type NBitsKernel, type NBitsLayout, type QuantizedWeightsAs } from '@lathe/quantization';
import { gaussian, heavyTailed, tinyQwen3 } from './data';

test.each([
  ['block 32, symmetric', 32, false],
  ['block 64, zero points', 64, true],
  ['block 128, zero points, K padded (200 → 256)', 128, true],
])('the kernel arithmetic is the INT4 dequantizer’s product: %s', (_name, blockSize, zeroPoints) => {
  const [M, N, K] = [3, 24, blockSize === 128 ? 200 : 192];
  const w = heavyTailed(N * K, 11 + blockSize);
  const x = gaussian(M * K, 3, 1);
  const q = quantizeInt4(w, N, K, { blockSize, zeroPoints });
  const l = kernelLayout(q) as NBitsLayout;
  const got = w4a16Reference({ M, N, K, kBlocks: l.bShape[1], blockSize, dtype: 'float32' }, { a: x, b: l.b, scales: l.scales, zeroPoints: l.zeroPoints });
  const wd = dequantize(q);
  let scale = 0;
  let err = 0;
  for (let m = 0; m < M; m++) {
    for (let n = 0; n < N; n++) {
      let acc = 0;
      for (let k = 0; k < K; k++) acc += x[m * K + k] * wd[n * K + k];
      scale = Math.max(scale, Math.abs(acc));
      err = Math.max(err, Math.abs(got[m * N + n] - acc));
    }
  }
  expect(scale).toBeGreaterThan(0.05);
  // both dequantize to float32: the same weights, summed in float64 alike
  expect(err).toBeLessThanOrEqual(1e-9 * scale);
});

const original = CausalLM.random(tinyQwen3, { seed: 5, std: 0.08 });
const config: DecoderConfig = original.config;
const weights = original.float32Weights();

/** A kernel that counts the projections sent through it. */
function counting(inner: NBitsKernel): NBitsKernel & { calls: number } {
  const k = { calls: 0, session: inner.session, unsupported: inner.unsupported, matmul: (...a: Parameters<NBitsKernel['matmul']>) => (k.calls++, inner.matmul(...a)) };
  return k;
}

test('graphWeights routes INT4 projections with known rows ≤ kernelMaxRows through the kernel, the rest through MatMulNBits', () => {
  const int4 = QuantizedModel.quantize(config, weights, { format: 'int4', blockSize: 32 });
  const int8 = QuantizedModel.quantize(config, weights, { format: 'int8' });
  const ops = w4a16Ops('cpu');
  const opOf = (model: QuantizedModel, shape: (number | string)[], maxRows?: number) => {
    const g = new L.Graph('route');
    const w = model.graphWeights(g, { dtype: 'float32', quantizedWeights: 'kernel', kernel: ops, kernelMaxRows: maxRows }).weights;
    const y = w.matmul!('model.layers.0.self_attn.q_proj.weight', g.input('x', 'float32', shape))!;
    return g.nodes.find((n) => n.outputs.includes(y))!.op.name;
  };
  expect(opOf(int4, [4, 1, 64])).toBe('W4A16MatMul_float32'); // a decode step of 4 rows
  expect(opOf(int4, ['B', 'P', 64])).toBe('MatMulNBits'); // prefill: rows unknown until run time
  expect(opOf(int4, [4, 1, 64], 2)).toBe('MatMulNBits');
  expect(opOf(int8, [4, 1, 64])).toBe('MatMulNBits'); // 8 bits: not the kernel's
  expect(() => int4.graphWeights(new L.Graph('none'), { dtype: 'float32', quantizedWeights: 'kernel' })).toThrow(/needs the kernel/);
  expect(() => int4.generationPlan('cpu', 'float32', { quantizedWeights: 'kernel' })).toThrow(/needs the kernel/);
  expect(() => int4.generationPlan('cpu', 'float32', { quantizedWeights: 'kernel', kernel: ops, fusedGemm: true })).toThrow(/needs quantizedWeights 'initializers'/);
  // 2 layers × 7 projections take it; int8 none
  expect(int4.generationPlan('cpu', 'float32', { quantizedWeights: 'kernel', kernel: ops })).toEqual({ quantizedWeights: 'kernel', fusedGemm: false, fusedLayers: 0, kernelLayers: 14 });
  expect(int8.generationPlan('cpu', 'float32', { quantizedWeights: 'kernel', kernel: ops }).kernelLayers).toBe(0);
  ops.dispose();
});

const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32]];

async function generate(q: QuantizedModel, as: QuantizedWeightsAs, kernel?: NBitsKernel): Promise<Completion[]> {
  const device = Device.cpu();
  const plan = q.generation(device, 'float32', { quantizedWeights: as, kernel });
  const gen = KvCacheGenerator.create(device, config, plan.tensors, { temperature: 1, rows: 4, maxLength: 24, graphWeights: plan.graphWeights, session: plan.session });
  try {
    return await gen.generate(prompts, { maxNewTokens: 12, seed: 7 });
  } finally {
    gen.dispose();
    for (const t of plan.tensors.values()) t.dispose();
  }
}

test.each([
  ['int4 block 64', false],
  ['int4 block 32 with zero points, and the LM head through the kernel', true],
])('a KV-cache generator over the kernel op generates what bound MatMulNBits does (CPU): %s', async (_name, zp) => {
  const scheme = { format: 'int4' as const, blockSize: zp ? 32 : 64, zeroPoints: zp };
  const q = QuantizedModel.quantize(config, weights, { ...scheme, lmHead: zp ? scheme : undefined });
  const ops = w4a16Ops('cpu');
  const kernel = counting(ops);
  try {
    const bound = await generate(q, 'inputs');
    const viaKernel = await generate(q, 'kernel', kernel);
    // the decode graph's 14 projections (and the head, when quantized); prefill keeps MatMulNBits
    expect(kernel.calls).toBe(14 + (zp ? 1 : 0));
    ops.check();
    expect(viaKernel.map((c) => c.tokens)).toEqual(bound.map((c) => c.tokens));
    expect(viaKernel.flatMap((c) => c.tokens).length).toBe(3 * 12);
    viaKernel.forEach((c, k) => c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - bound[k].rawLogprobs[t])).toBeLessThan(1e-4)));
  } finally {
    ops.dispose();
  }
});

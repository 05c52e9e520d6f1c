/**
 * Lathe's W4A16 kernel (`w4a16Ops` of @lathe/kernels) behind `quantizedWeights: 'kernel'`: its
 * arithmetic (the kernels' host reference, which the CPU emulation of the CUDA source is tested
 * against) equals this package's INT4 quantizer and dequantizer with a float64 product; the
 * generation graphs route decode steps' INT4 projections through the op (q/k/v and gate/up as one
 * node each, over their weights concatenated) and keep MatMulNBits elsewhere; and a KV-cache
 * generator over the op (its CPU path) generates what bound MatMulNBits does.
 */
import * as L from '@lathe/onnx';
import { CausalLM, type DecoderConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { KvCacheGenerator, type Completion } from '@lathe/rollout';
import { w4a16Ops, w4a16Reference } from '@lathe/kernels';
import { concatNBits, dequantize, kernelLayout, QuantizedModel, quantizeInt4, type NBitsKernel, type NBitsLayout, type QuantizedWeightsAs } from '@lathe/quantization';
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
  const k = {
    calls: 0,
    session: inner.session,
    unsupported: inner.unsupported,
    matmul: (...a: Parameters<NBitsKernel['matmul']>) => (k.calls++, inner.matmul(...a)),
    matmulSplit: (...a: Parameters<NBitsKernel['matmulSplit']>) => (k.calls++, inner.matmulSplit(...a)),
  };
  return k;
}

test('graphWeights routes INT4 projections with known rows ≤ kernelMaxRows through the kernel, the rest through MatMulNBits', () => {
  const int4 = QuantizedModel.quantize(config, weights, { format: 'int4', blockSize: 32 });
  const int8 = QuantizedModel.quantize(config, weights, { format: 'int8' });
  const ops = w4a16Ops('cpu');
  const route = (model: QuantizedModel, shape: (number | string)[], maxRows?: number) => {
    const g = new L.Graph('route');
    const w = model.graphWeights(g, { dtype: 'float32', quantizedWeights: 'kernel', kernel: ops, kernelMaxRows: maxRows }).weights;
    const x = g.input('x', 'float32', shape);
    const nodeOf = (name: string, input = x) => {
      const y = w.matmul!(`model.layers.0.${name}`, input)!;
      const node = g.nodes.find((n) => n.outputs.includes(y))!;
      return { node, op: node.op.name, output: node.outputs.indexOf(y), shape: y.shape };
    };
    return { nodeOf, g, x };
  };
  // a decode step of 4 rows: q/k/v one node of three outputs (N 64 + 32 + 32), gate/up one of two; o and down alone
  const step = route(int4, [4, 1, 64]);
  const [q, k, v] = ['self_attn.q_proj.weight', 'self_attn.k_proj.weight', 'self_attn.v_proj.weight'].map((n) => step.nodeOf(n));
  expect([q.op, k.node === q.node, v.node === q.node, q.output, k.output, v.output]).toEqual(['W4A16MatMul_float32_w64_32_32', true, true, 0, 1, 2]);
  expect([q.shape, k.shape, v.shape]).toEqual([[4, 1, 64], [4, 1, 32], [4, 1, 32]]);
  const [gate, up] = ['mlp.gate_proj.weight', 'mlp.up_proj.weight'].map((n) => step.nodeOf(n));
  expect([gate.op, up.node === gate.node, up.output]).toEqual(['W4A16MatMul_float32_w96_96', true, 1]);
  expect(step.nodeOf('self_attn.o_proj.weight').op).toBe('W4A16MatMul_float32');
  expect(step.nodeOf('mlp.down_proj.weight', step.g.input('h', 'float32', [4, 1, 96])).op).toBe('W4A16MatMul_float32');
  // another input: a new node (the outputs are reused only for the input they came from)
  expect(step.nodeOf('self_attn.k_proj.weight', step.g.input('x2', 'float32', [4, 1, 64])).node).not.toBe(q.node);
  // prefill (rows unknown until run time), more rows than kernelMaxRows: MatMulNBits over the fused weights, sliced
  for (const r of [route(int4, ['B', 'P', 64]), route(int4, [4, 1, 64], 2)]) {
    const kq = r.nodeOf('self_attn.k_proj.weight');
    expect(kq.op).toBe('Slice');
    expect(r.g.nodes.find((n) => n.outputs.includes(kq.node.inputs[0]!))!.op.name).toBe('MatMulNBits');
  }
  expect(route(int8, [4, 1, 64]).nodeOf('self_attn.q_proj.weight').op).toBe('MatMulNBits'); // 8 bits: not the kernel's
  expect(() => int4.graphWeights(new L.Graph('none'), { dtype: 'float32', quantizedWeights: 'kernel' })).toThrow(/needs the kernel/);
  expect(() => int4.generationPlan('cpu', 'float32', { quantizedWeights: 'kernel' })).toThrow(/needs the kernel/);
  expect(() => int4.generationPlan('cpu', 'float32', { quantizedWeights: 'kernel', kernel: ops, fusedGemm: true })).toThrow(/needs quantizedWeights 'initializers'/);
  // 2 layers × 7 projections take it; int8 none
  expect(int4.generationPlan('cpu', 'float32', { quantizedWeights: 'kernel', kernel: ops })).toEqual({ quantizedWeights: 'kernel', fusedGemm: false, fusedLayers: 0, kernelLayers: 14 });
  expect(int8.generationPlan('cpu', 'float32', { quantizedWeights: 'kernel', kernel: ops }).kernelLayers).toBe(0);
  ops.dispose();
});

test("deviceTensors for 'kernel' holds q/k/v and gate/up concatenated along N: the same bytes under the fused names", () => {
  const q = QuantizedModel.quantize(config, weights, { format: 'int4', blockSize: 32, zeroPoints: true });
  const device = Device.cpu();
  const plain = q.deviceTensors(device, 'float32');
  const fused = q.deviceTensors(device, 'float32', '', { quantizedWeights: 'kernel' });
  try {
    const bytes = (m: Map<string, { byteLength: number }>) => [...m.values()].reduce((n, t) => n + t.byteLength, 0);
    expect(bytes(fused)).toBe(bytes(plain));
    expect(fused.has('model.layers.1.self_attn.qkv_proj.weight.q')).toBe(true);
    expect(fused.has('model.layers.1.mlp.gate_up_proj.weight.zero_points')).toBe(true);
    expect(fused.has('model.layers.1.self_attn.k_proj.weight.q')).toBe(false);
    expect(fused.has('model.layers.1.self_attn.o_proj.weight.scales')).toBe(true);
    expect(fused.get('model.layers.0.self_attn.qkv_proj.weight.scales')!.dims).toEqual([64 + 32 + 32, 2]);
  } finally {
    for (const t of [...plain.values(), ...fused.values()]) t.dispose();
  }
  // rows stack: the concatenated layout's product is the members' products side by side
  const [a, b] = [quantizeInt4(gaussian(8 * 64, 1), 8, 64, { blockSize: 32, zeroPoints: true }), quantizeInt4(gaussian(4 * 64, 2), 4, 64, { blockSize: 32, zeroPoints: true })].map((m) => kernelLayout(m) as NBitsLayout);
  const cat = concatNBits([a, b]);
  const x = gaussian(64, 3, 1);
  const shape = (N: number) => ({ M: 1, N, K: 64, kBlocks: 2, blockSize: 32, dtype: 'float32' as const });
  const both = w4a16Reference(shape(12), { a: x, b: cat.b, scales: cat.scales, zeroPoints: cat.zeroPoints });
  const parts = [...w4a16Reference(shape(8), { a: x, b: a.b, scales: a.scales, zeroPoints: a.zeroPoints }), ...w4a16Reference(shape(4), { a: x, b: b.b, scales: b.scales, zeroPoints: b.zeroPoints })];
  expect(Array.from(both)).toEqual(parts);
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
    // the decode graph's 4 nodes a layer (q/k/v, o, gate/up, down) and the head, when quantized; prefill keeps MatMulNBits
    expect(kernel.calls).toBe(2 * 4 + (zp ? 1 : 0));
    ops.check();
    expect(viaKernel.map((c) => c.tokens)).toEqual(bound.map((c) => c.tokens));
    expect(viaKernel.flatMap((c) => c.tokens).length).toBe(3 * 12);
    viaKernel.forEach((c, k) => c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - bound[k].rawLogprobs[t])).toBeLessThan(1e-4)));
  } finally {
    ops.dispose();
  }
});

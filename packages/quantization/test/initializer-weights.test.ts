/**
 * Quantized weights held as graph initializers (what ONNX Runtime prepacks, and its fused
 * weight-only GEMM needs) generate what bound inputs generate: the KV-cache generator over a tiny
 * Qwen3 on the CPU, INT4 (with a padded layer), INT4 with zero points, INT8 and NF4, greedy and
 * seeded sampling. Plus the graph's shape of it (scales stored in the activations' dtype, no Cast
 * in front of the kernel), the fused path's eligibility rule, and generation's defaults per device.
 */
import * as L from '@lathe/onnx';
import { CausalLM, decoder, lmLogits, paddedCausalMask, positionsFromPadding, type DecoderConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { KvCacheGenerator, type Completion } from '@lathe/rollout';
import { FPA_INTB_GEMM_CONFIG, fusedGemmIneligibility, kernelTensorNames, QuantizedModel, type QuantScheme, type QuantizedWeightsAs } from '@lathe/quantization';
import { tinyQwen3 } from './data';

const hf = tinyQwen3;
const original = CausalLM.random(hf, { seed: 5, std: 0.08 });
const config: DecoderConfig = original.config;
const weights = original.float32Weights();
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32]];

/** Completions of `prompts` by a KV-cache generator over `q` with its kernel tensors read as `as`. */
async function generate(q: QuantizedModel, as: QuantizedWeightsAs, temperature: number): Promise<Completion[]> {
  const device = Device.cpu();
  const plan = q.generation(device, 'float32', { quantizedWeights: as });
  const gen = KvCacheGenerator.create(device, config, plan.tensors, { temperature, rows: 4, maxLength: 24, graphWeights: plan.graphWeights, session: plan.session });
  try {
    return await gen.generate(prompts, { maxNewTokens: 12, seed: 7 });
  } finally {
    gen.dispose();
    for (const t of plan.tensors.values()) t.dispose();
  }
}

const schemes: [string, QuantScheme][] = [
  ['int4', { format: 'int4', blockSize: 64 }],
  ['int4 with zero points', { format: 'int4', blockSize: 32, zeroPoints: true }],
  ['int8', { format: 'int8' }],
  ['nf4', { format: 'nf4' }],
];

describe.each(schemes)('%s: initializers generate what bound inputs generate', (_name, scheme) => {
  const q = QuantizedModel.quantize(config, weights, { ...scheme, lmHead: scheme.format === 'nf4' ? undefined : scheme });
  test.each([
    ['greedy', 0],
    ['seeded sampling', 1],
  ])('%s', async (_kind, temperature) => {
    const bound = await generate(q, 'inputs', temperature);
    const embedded = await generate(q, 'initializers', temperature);
    expect(embedded.map((c) => c.tokens)).toEqual(bound.map((c) => c.tokens));
    expect(embedded.flatMap((c) => c.tokens).length).toBe(3 * 12);
    // ORT's CPU kernel runs a prepacked (MLAS) path for initializers: the same products, summed in another order.
    embedded.forEach((c, k) => c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - bound[k].rawLogprobs[t])).toBeLessThan(1e-4)));
  });
});

test('initializers: the kernel tensors hold the bytes, scales in the activations dtype with no Cast before the kernel; dense parameters stay inputs', () => {
  const q = QuantizedModel.quantize(config, weights, { format: 'int4', blockSize: 64, zeroPoints: true });
  const g = new L.Graph('initializers');
  const w = q.graphWeights(g, { dtype: 'bfloat16', quantizedWeights: 'initializers' }).weights;
  const ids = g.input('input_ids', 'int64', [1, 3]);
  const mask = g.input('attention_mask', 'int64', [1, 3]);
  const h = decoder(config, w, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) }).hidden;
  g.output(lmLogits(config, w, h), 'logits');
  const name = 'model.layers.0.self_attn.q_proj.weight';
  const n = kernelTensorNames(name);
  const init = (x: string) => g.initializers.get(x);
  expect(init(n.b)?.tensor.dtype).toBe('uint8');
  expect(init(n.b)?.tensor.shape).toEqual([64, 1, 32]); // [N, K / 64 blocks, 64 · 4 bits / 8]
  expect(init(n.scales)?.tensor.dtype).toBe('bfloat16');
  expect(init(n.zeroPoints)?.tensor.dtype).toBe('uint8');
  const scaleBytes = init(n.scales)!.data;
  expect(scaleBytes.kind === 'inline' && scaleBytes.bytes.byteLength).toBe(64 * 1 * 2);
  const inputNames = g.inputs.map((t) => t.name);
  expect(inputNames).toContain('model.embed_tokens.weight');
  expect(inputNames).toContain('model.layers.0.input_layernorm.weight');
  expect(inputNames.some((x) => x.endsWith('.q') || x.endsWith('.scales'))).toBe(false);
  // every MatMulNBits reads its B, scales and zero points straight from initializers
  const kernels = g.nodes.filter((x) => x.op.name === 'MatMulNBits');
  expect(kernels.length).toBe(14);
  for (const k of kernels) for (const t of k.inputs.slice(1)) expect(t && g.initializers.has(t.name)).toBe(true);
  // in the ONNX model: constant initializers (what ORT prepacks), not graph inputs a caller could override
  const proto = L.toModelProto(g).graph!;
  expect(proto.initializer!.map((t) => t.name)).toEqual(expect.arrayContaining([n.b, n.scales, n.zeroPoints]));
  expect(proto.input!.map((t) => t.name)).not.toContain(n.b);
  expect(proto.initializer!.find((t) => t.name === n.scales)!.dataType).toBe(16); // TensorProto BFLOAT16
});

test('deviceTensors with initializers uploads only the dense parameters', () => {
  const q = QuantizedModel.quantize(config, weights, { format: 'int8' });
  const device = Device.cpu();
  const all = q.deviceTensors(device, 'float32');
  const dense = q.deviceTensors(device, 'float32', '', { quantizedWeights: 'initializers' });
  expect([...dense.keys()].sort()).toEqual([...q.dense.keys()].sort());
  expect(all.size).toBe(q.dense.size + 2 * q.layers.size); // codes + scales per INT8 layer
  for (const t of [...all.values(), ...dense.values()]) t.dispose();
});

test("the fused path's eligibility (ORT's CheckFpAIntBEligibility): 16-bit activations, 4/8 bits, block 32/64/128, N and K aligned", () => {
  const a = { N: 1024, K: 3072, bits: 4, blockSize: 64 };
  expect(fusedGemmIneligibility(a, 'bfloat16')).toBeUndefined();
  expect(fusedGemmIneligibility(a, 'float16')).toBeUndefined();
  expect(fusedGemmIneligibility(a, 'float32')).toMatch(/float32/);
  expect(fusedGemmIneligibility({ ...a, N: 96 }, 'bfloat16')).toMatch(/N = 96 is not a multiple of 64/);
  expect(fusedGemmIneligibility({ ...a, N: 96, bits: 8 }, 'bfloat16')).toBeUndefined(); // 8 bits: N a multiple of 32
  expect(fusedGemmIneligibility({ ...a, K: 96 }, 'bfloat16')).toMatch(/K = 96 is not a multiple of the block size 64/);
  expect(fusedGemmIneligibility({ ...a, blockSize: 16 }, 'bfloat16')).toMatch(/block size 16/);
  expect(fusedGemmIneligibility({ ...a, bits: 2 }, 'bfloat16')).toMatch(/2 bits/);
});

test("generation's defaults: initializers and the fused GEMM on CUDA for INT4/INT8 in 16 bits; bound inputs elsewhere", () => {
  const int4 = QuantizedModel.quantize(config, weights, { format: 'int4', blockSize: 32 });
  const nf4 = QuantizedModel.quantize(config, weights, { format: 'nf4' });
  // tiny Qwen3: q_proj N = 64, k/v N = 32, o 64, gate/up 96, down 64 → q, o, down (N % 64 = 0) per layer
  // bound inputs by default (the fused GEMM measured slower); asked for, initializers with the fused GEMM on
  expect(int4.generationPlan('cuda', 'bfloat16')).toEqual({ quantizedWeights: 'inputs', fusedGemm: false, fusedLayers: 0 });
  expect(int4.generationPlan('cuda', 'bfloat16', { quantizedWeights: 'initializers' })).toEqual({ quantizedWeights: 'initializers', fusedGemm: true, fusedLayers: 6 });
  expect(int4.generationPlan('cuda', 'float32')).toEqual({ quantizedWeights: 'inputs', fusedGemm: false, fusedLayers: 0 });
  expect(int4.generationPlan('cpu', 'bfloat16')).toEqual({ quantizedWeights: 'inputs', fusedGemm: false, fusedLayers: 0 });
  expect(int4.generationPlan('cuda', 'bfloat16', { mode: 'dequantize' })).toEqual({ quantizedWeights: 'inputs', fusedGemm: false, fusedLayers: 0 });
  expect(int4.generationPlan('cuda', 'bfloat16', { quantizedWeights: 'initializers', fusedGemm: false })).toEqual({ quantizedWeights: 'initializers', fusedGemm: false, fusedLayers: 0 });
  expect(nf4.generationPlan('cuda', 'bfloat16')).toEqual({ quantizedWeights: 'inputs', fusedGemm: false, fusedLayers: 0 });
  expect(() => int4.generationPlan('cuda', 'bfloat16', { quantizedWeights: 'inputs', fusedGemm: true })).toThrow(/needs quantizedWeights 'initializers'/);
  const device = Device.cpu();
  const plan = int4.generation(device, 'float32', { quantizedWeights: 'initializers', fusedGemm: true });
  expect(plan.session.config).toEqual({ [FPA_INTB_GEMM_CONFIG]: '1' });
  // older ORT releases read only the environment variable: set for the sessions' creation unless the user set it
  expect(plan.session.env).toEqual(process.env.ORT_FPA_INTB_GEMM === undefined ? { ORT_FPA_INTB_GEMM: '1' } : undefined);
  for (const t of plan.tensors.values()) t.dispose();
});

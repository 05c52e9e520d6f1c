/**
 * The KV engine's `residualDtype: 'compute'`: the residual stream in the compute dtype, as transformers
 * keeps it in bf16. In bfloat16 a middle layer of the decode step has no Cast and the graphs read no
 * float32 norm copies (CUDA-only dtype: the graphs are built, not run, as the CUDA engines build
 * them); in float32 the graphs and the generated tokens and log-probs are today's exactly.
 */
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { addKvDecodeStep, addKvPrefill, float32Norms, KvCacheGenerator, type Completion, type KvDecodeAttention, type KvGraphOptions } from '@lathe/rollout';
import { CausalLM, weightInputs, type HfConfig, type ResidualDtype } from '@lathe/models';
import { tinyModel, tinyQwen3 } from './helpers';

// GroupQueryAttention's rotary needs head_dim ≥ 16.
const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16, num_hidden_layers: 3 };
const { dir, config } = tinyModel(wideQwen3, 7);
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1]];

type Add = typeof addKvDecodeStep;
function graph(add: Add, dtype: L.DType, residualDtype: ResidualDtype, extra: Partial<KvGraphOptions> = {}): L.Graph {
  const g = new L.Graph();
  add(g, config, weightInputs(g, config, dtype, dtype).weights, dtype, { temperature: 0 }, { K: 2, rows: 4, residualDtype, ...extra });
  return g;
}
const ops = (g: L.Graph, scope = '') => L.toModelProto(g).graph.node.filter((n) => (n.name ?? '').startsWith(scope)).map((n) => n.opType);

/** A decode-attention kernel's graph signature without the kernel (graph building only). */
function stubAttention(cache: KvDecodeAttention['cache']): KvDecodeAttention {
  return {
    cache,
    cacheDtype: (dtype) => (cache === 'float8e4m3' ? 'uint8' : dtype),
    qkNormEpsilon: config.rmsNormEps,
    domain: { handle: 0n },
    attend: (x) => ({ output: x.query, presentKey: x.cacheKey, presentValue: x.cacheValue, presentKeyScale: x.keyScale, presentValueScale: x.valueScale }),
    quantize: (x) => ({ data: L.cast(x, 'uint8'), scale: L.cast(x, 'float32') }),
    check: () => {},
  };
}

// decode-check's gqa+bf16res and kernel+fp8+bf16res engines: bfloat16, Q/K norm in the kernel
const cudaEngines: [string, Partial<KvGraphOptions>][] = [
  ['GroupQueryAttention', { qkNormInKernel: true }],
  ['decode kernel, e4m3 cache', { qkNormInKernel: true, decodeAttention: stubAttention('float8e4m3') }],
];

test.each(cudaEngines)('bfloat16 decode step (%s): a middle layer has no Cast, four fewer than with a float32 stream', (_engine, extra) => {
  const f32 = graph(addKvDecodeStep, 'bfloat16', 'float32', extra);
  const res = graph(addKvDecodeStep, 'bfloat16', 'compute', extra);
  const casts = (g: L.Graph, scope = '') => ops(g, scope).filter((o) => o === 'Cast').length;
  // bf16 → f32 of the attention and MLP outputs, f32 → bf16 of the two normed inputs
  expect(casts(f32, 'layer1/')).toBe(4);
  expect(casts(res, 'layer1/')).toBe(0);
  expect(ops(f32, 'layer1/').length - ops(res, 'layer1/').length).toBe(4);
  // the whole step: layer 0 three (no add before its input norm), the embeddings' cast up, and the
  // final norm's two (the last MLP output up, its output down before the LM head)
  expect(casts(f32) - casts(res)).toBe(4 * config.numLayers + 2);
  expect(ops(res).filter((o) => o === 'SkipSimplifiedLayerNormalization')).toHaveLength(2 * config.numLayers);
  expect(L.hostTableNodes(res).map((n) => n.name)).toEqual([]);
  // every fused norm reads its bfloat16 weight: no float32 copies as inputs
  expect(res.inputs.filter((t) => t.name.startsWith('float32.'))).toEqual([]);
  expect(res.nodes.filter((n) => n.op.name === 'SkipSimplifiedLayerNormalization').every((n) => n.inputs.every((t) => t?.dtype === 'bfloat16'))).toBe(true);
});

test('bfloat16 prefill: no float32 norm copies written, and the engine allocates none', () => {
  expect(graph(addKvPrefill, 'bfloat16', 'compute').outputs.filter((t) => t.name.startsWith('float32.'))).toEqual([]);
  expect(graph(addKvPrefill, 'bfloat16', 'float32').outputs.filter((t) => t.name.startsWith('float32.'))).toHaveLength(2 * config.numLayers);
  // the predicate the engine's buffers and both graphs share
  expect(float32Norms('bfloat16', true, 'compute')).toBe(false);
  expect(float32Norms('float16', undefined, 'compute')).toBe(false);
  expect(float32Norms('bfloat16', true, 'float32')).toBe(true);
  expect(float32Norms('bfloat16', true)).toBe(true);
});

test.each([
  ['decode step', addKvDecodeStep],
  ['prefill', addKvPrefill],
] as const)('float32 %s: the same graph with either residual dtype', (_graph, add) => {
  expect(L.toModelProto(graph(add, 'float32', 'compute'))).toEqual(L.toModelProto(graph(add, 'float32', 'float32')));
});

test('float32 engines: the same tokens and log-probs with either residual dtype (CPU, greedy), no norm copies held', async () => {
  const device = Device.cpu();
  const model = CausalLM.fromPretrainedSync(dir, { device });
  const run = async (residualDtype: ResidualDtype): Promise<Completion[]> => {
    const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 16, residualDtype });
    try {
      expect((kv as unknown as { buffers: { norms: Map<string, unknown> } }).buffers.norms.size).toBe(0);
      return await kv.generate(prompts, { maxNewTokens: 8 });
    } finally {
      kv.dispose();
    }
  };
  try {
    const today = await run('float32');
    const compute = await run('compute');
    expect(compute.map((c) => c.tokens)).toEqual(today.map((c) => c.tokens));
    expect(compute.map((c) => c.rawLogprobs)).toEqual(today.map((c) => c.rawLogprobs));
    expect(compute.flatMap((c) => c.tokens)).toHaveLength(prompts.length * 8);
  } finally {
    model.dispose();
  }
});

/**
 * The KV engine's concatProjections: q/k/v and gate/up as one MatMul each over weights a pack run
 * concatenates once per generate call. Three MatMul nodes a layer fewer in both graphs; on CPU in
 * float32 the same greedy tokens and log-probs as the engine without it (Qwen3, and Qwen2 with its
 * q/k/v biases concatenated too); a weight update between calls reaches the next call; the decode
 * step as the CUDA engines build it has no node that CUDA-graph replay would refuse. Not covered
 * here: CUDA-graph replay over the packed buffers and bfloat16 (CPU has neither; decode-check's
 * gqa+concat and kernel+fp8+concat engines run them on the device).
 */
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { addKvDecodeStep, addKvPack, addKvPrefill, concatGroups, concatName, concatTensors, KvCacheGenerator, replaySafeSplit, type Completion, type KvDecodeAttention, type KvGraphOptions } from '@lathe/rollout';
import { CausalLM, weightInputs, type HfConfig } from '@lathe/models';
import { tinyModel, tinyQwen3 } from './helpers';

// GroupQueryAttention's rotary needs head_dim ≥ 16.
const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16, num_hidden_layers: 3 };
const wideQwen2: HfConfig = { ...wideQwen3, architectures: ['Qwen2ForCausalLM'], tie_word_embeddings: false };
const qwen3 = tinyModel(wideQwen3, 7);
const qwen2 = tinyModel(wideQwen2, 8);
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1]];

type Add = typeof addKvDecodeStep;
function graph(add: Add, config: typeof qwen3.config, concatProjections: boolean, extra: Partial<KvGraphOptions> = {}, dtype: L.DType = 'float32'): L.Graph {
  const g = new L.Graph();
  add(g, config, weightInputs(g, config, dtype, dtype).weights, dtype, { temperature: 0 }, { K: 2, rows: 4, concatProjections, ...extra });
  return g;
}
const ops = (g: L.Graph, scope = '') => L.toModelProto(g).graph.node.filter((n) => (n.name ?? '').startsWith(scope)).map((n) => n.opType);
const count = (g: L.Graph, op: string) => ops(g).filter((o) => o === op).length;

test.each([
  ['qwen3', 'decode step', qwen3, addKvDecodeStep],
  ['qwen3', 'prefill', qwen3, addKvPrefill],
  ['qwen2', 'decode step', qwen2, addKvDecodeStep],
  ['qwen2', 'prefill', qwen2, addKvPrefill],
] as const)('%s %s: 3 MatMuls a layer fewer, one Split per group that is not taken packed (and the query’s Concat), the concatenated tensors as inputs', (_model, _graph, { config }, add) => {
  const plain = graph(add, config, false);
  const cat = graph(add, config, true);
  expect(count(plain, 'MatMul') - count(cat, 'MatMul')).toBe(3 * config.numLayers);
  // Qwen3 (its Q/K norm outside the kernel here): q/k/v split into four equal KV·headDim parts (H = 2·KV),
  // the query's two joined again; Qwen2 (no Q/K norm): GroupQueryAttention takes q/k/v packed, no Split
  const qkvSplits = config.qkNorm ? 1 : 0;
  expect(count(cat, 'Split') - count(plain, 'Split')).toBe((1 + qkvSplits) * config.numLayers);
  expect(count(cat, 'Concat') - count(plain, 'Concat')).toBe(qkvSplits * config.numLayers);
  expect(count(cat, 'Slice')).toBe(count(plain, 'Slice'));
  // a middle layer: q/k/v/o and gate/up/down were seven MatMuls, now four
  expect(ops(plain, 'layer1/').filter((o) => o === 'MatMul')).toHaveLength(7);
  expect(ops(cat, 'layer1/').filter((o) => o === 'MatMul')).toHaveLength(4);
  // Qwen2's three q/k/v bias Adds become one over the concatenated bias
  const biasAdds = config.attentionBias ? 2 * config.numLayers : 0;
  expect(count(plain, 'Add') - count(cat, 'Add')).toBe(biasAdds);
  expect(cat.inputs.filter((t) => t.name.startsWith('concat.')).map((t) => [t.name, t.shape])).toEqual(concatTensors(config).map((t) => [t.name, t.shape]));
  // no transpose of a concatenated weight (stored as the MatMul reads it): the five members' are gone
  expect(count(plain, 'Transpose') - count(cat, 'Transpose')).toBe(5 * config.numLayers);
});

/** A stand-in for @lathe/kernels' decode attention (graph building only): presents are the cache inputs, the output the query. */
function stubAttention(cache: KvDecodeAttention['cache'], qkNormEpsilon: number): KvDecodeAttention {
  return {
    cache,
    cacheDtype: (dtype) => (cache === 'float8e4m3' ? 'uint8' : dtype),
    qkNormEpsilon,
    domain: { handle: 0n },
    attend: (x) => ({ output: x.query, presentKey: x.cacheKey, presentValue: x.cacheValue, presentKeyScale: x.keyScale, presentValueScale: x.valueScale }),
    quantize: (x) => ({ data: L.cast(x, 'uint8'), scale: L.cast(x, 'float32') }),
    check: () => {},
  };
}

test.each([
  ['qwen3', qwen3],
  ['qwen2', qwen2],
] as const)('%s: the concatenated decode step, as the CUDA engines build it, has no node CUDA-graph replay refuses (hostTableNodes)', (_model, { config }) => {
  // the gqa+concat and kernel+fp8+concat engines of decode-check: bfloat16, Q/K norm in the kernel
  const cuda: [string, Partial<KvGraphOptions>][] = [
    ['GroupQueryAttention', { qkNormInKernel: true }],
    ['decode kernel, native cache', { qkNormInKernel: true, decodeAttention: stubAttention('native', config.rmsNormEps) }],
    ['decode kernel, e4m3 cache', { qkNormInKernel: true, decodeAttention: stubAttention('float8e4m3', config.rmsNormEps) }],
  ];
  for (const [, extra] of cuda) {
    const step = graph(addKvDecodeStep, config, true, extra, 'bfloat16');
    expect(L.hostTableNodes(step).map((n) => n.name)).toEqual([]);
    expect(step.nodes.filter((n) => n.op.name === 'MatMul').length).toBe(graph(addKvDecodeStep, config, false, extra, 'bfloat16').nodes.filter((n) => n.op.name === 'MatMul').length - 3 * config.numLayers);
  }
});

test.each([
  ['equal widths: one Split', [8, 8, 8], { Split: 1, Concat: 0, Slice: 0 }],
  ['multiples of a unit (q/k/v, H = 4·KV): one Split into units, one Concat', [32, 8, 8], { Split: 1, Concat: 1, Slice: 0 }],
  ['more than 32 units: one Slice each', [33, 2], { Split: 0, Concat: 0, Slice: 2 }],
  ['one width: the tensor itself', [12], { Split: 0, Concat: 0, Slice: 0 }],
] as const)('replaySafeSplit, %s; the parts are the columns, and no node copies host tables', async (_case, widths, nodes) => {
  const g = new L.Graph();
  const N = widths.reduce((a, b) => a + b, 0);
  const x = g.input('x', 'float32', [2, 3, N]);
  replaySafeSplit(x, [...widths]).forEach((t, i) => g.output(t, `part${i}`));
  expect(L.hostTableNodes(g)).toEqual([]);
  for (const [op, n] of Object.entries(nodes)) expect(g.nodes.filter((m) => m.op.name === op)).toHaveLength(n);
  const data = Float32Array.from({ length: 6 * N }, (_, i) => i);
  const session = Device.cpu().compile(g);
  try {
    const out = await session.run({ x: { data, dims: [2, 3, N] } });
    let at = 0;
    widths.forEach((w, i) => {
      const want = Array.from({ length: 6 }, (_, r) => Array.from(data.slice(r * N + at, r * N + at + w))).flat();
      expect(out[`part${i}`].dims).toEqual([2, 3, w]);
      expect(Array.from(out[`part${i}`].data as Float32Array)).toEqual(want);
      at += w;
    });
  } finally {
    session.dispose();
  }
});

test('the pack graph: each group concatenated along N and transposed to [hidden, ΣN], biases where the model has them', () => {
  for (const { config } of [qwen3, qwen2]) {
    const g = new L.Graph();
    addKvPack(g, config, weightInputs(g, config, 'float32', 'float32').weights);
    expect(g.outputs.map((t) => [t.name, t.shape])).toEqual(concatTensors(config).map((t) => [t.name, t.shape]));
    const groups = concatGroups(config);
    expect(groups).toHaveLength(2 * config.numLayers);
    expect(g.outputs.some((t) => t.name === concatName(groups[0], 'bias'))).toBe(config.attentionBias);
  }
});

test('weights that compute their own projections (a quantized model) are refused, named', () => {
  const { config } = qwen3;
  const g = new L.Graph();
  const w = weightInputs(g, config, 'float32', 'float32').weights;
  w.matmul = () => undefined;
  expect(() => addKvPack(g, config, w)).toThrow(/concatProjections: the weights compute their own projections/);
});

async function generate(model: CausalLM, concatProjections: boolean, between?: (kv: KvCacheGenerator) => void): Promise<Completion[][]> {
  const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 16, concatProjections });
  try {
    const first = await kv.generate(prompts, { maxNewTokens: 8 });
    if (!between) return [first];
    between(kv);
    return [first, await kv.generate(prompts, { maxNewTokens: 8 })];
  } finally {
    kv.dispose();
  }
}

function expectSame(a: Completion[], b: Completion[]): void {
  expect(a.map((c) => c.tokens)).toEqual(b.map((c) => c.tokens));
  expect(a.flatMap((c) => c.tokens)).toHaveLength(prompts.length * 8);
  a.forEach((c, k) => c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - b[k].rawLogprobs[t])).toBeLessThan(1e-5)));
}

test.each([
  ['Qwen3', qwen3],
  ['Qwen2 (q/k/v biases)', qwen2],
] as const)('greedy, %s: the concatenated engine generates the plain one’s tokens, log-probs within 1e-5 (CPU, float32)', async (_name, { dir }) => {
  const model = CausalLM.fromPretrainedSync(dir, { device: Device.cpu() });
  try {
    const [plain] = await generate(model, false);
    const [cat] = await generate(model, true);
    expectSame(cat, plain);
  } finally {
    model.dispose();
  }
});

test('a weight update between two generate calls reaches the second call', async () => {
  const device = Device.cpu();
  const model = CausalLM.fromPretrainedSync(qwen3.dir, { device });
  const other = CausalLM.fromPretrainedSync(tinyModel(wideQwen3, 9).dir, { device });
  try {
    const [before, after] = await generate(model, true, (kv) => kv.loadWeights(other.weights));
    const [fresh] = await generate(other, false);
    expectSame(after, fresh);
    expect(after.map((c) => c.tokens)).not.toEqual(before.map((c) => c.tokens));
  } finally {
    other.dispose();
    model.dispose();
  }
});

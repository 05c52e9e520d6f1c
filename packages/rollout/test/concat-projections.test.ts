/**
 * The KV engine's concatProjections: q/k/v and gate/up as one MatMul each over weights a pack run
 * concatenates once per generate call. Three MatMul nodes a layer fewer in both graphs; on CPU in
 * float32 the same greedy tokens and log-probs as the engine without it (Qwen3, and Qwen2 with its
 * q/k/v biases concatenated too); a weight update between calls reaches the next call. Not covered
 * here: CUDA-graph replay over the packed buffers and bfloat16 (CPU has neither; decode-check's
 * gqa+concat and kernel+fp8+concat engines run them on the device).
 */
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { addKvDecodeStep, addKvPack, addKvPrefill, concatGroups, concatName, concatTensors, KvCacheGenerator, type Completion } from '@lathe/rollout';
import { CausalLM, weightInputs, type HfConfig } from '@lathe/models';
import { tinyModel, tinyQwen3 } from './helpers';

// GroupQueryAttention's rotary needs head_dim ≥ 16.
const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16, num_hidden_layers: 3 };
const wideQwen2: HfConfig = { ...wideQwen3, architectures: ['Qwen2ForCausalLM'], tie_word_embeddings: false };
const qwen3 = tinyModel(wideQwen3, 7);
const qwen2 = tinyModel(wideQwen2, 8);
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1]];

type Add = typeof addKvDecodeStep;
function graph(add: Add, config: typeof qwen3.config, concatProjections: boolean): L.Graph {
  const g = new L.Graph();
  add(g, config, weightInputs(g, config, 'float32', 'float32').weights, 'float32', { temperature: 0 }, { K: 2, rows: 4, concatProjections });
  return g;
}
const ops = (g: L.Graph, scope = '') => L.toModelProto(g).graph.node.filter((n) => (n.name ?? '').startsWith(scope)).map((n) => n.opType);
const count = (g: L.Graph, op: string) => ops(g).filter((o) => o === op).length;

test.each([
  ['qwen3', 'decode step', qwen3, addKvDecodeStep],
  ['qwen3', 'prefill', qwen3, addKvPrefill],
  ['qwen2', 'decode step', qwen2, addKvDecodeStep],
  ['qwen2', 'prefill', qwen2, addKvPrefill],
] as const)('%s %s: 3 MatMuls a layer fewer, one Split per group, the concatenated tensors as inputs', (_model, _graph, { config }, add) => {
  const plain = graph(add, config, false);
  const cat = graph(add, config, true);
  expect(count(plain, 'MatMul') - count(cat, 'MatMul')).toBe(3 * config.numLayers);
  expect(count(cat, 'Split') - count(plain, 'Split')).toBe(2 * config.numLayers);
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

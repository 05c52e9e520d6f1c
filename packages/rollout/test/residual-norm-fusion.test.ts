/**
 * The KV engine's residual adds fused into the next RMSNorm (SkipSimplifiedLayerNormalization):
 * two nodes fewer a layer in the decode step and the prefill, in float32 and in bfloat16 (where the
 * prefill writes float32 copies of the norms' weights for the steps), and on CPU in float32 the same
 * greedy tokens and log-probs as the unfused graphs.
 */
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { addKvDecodeStep, addKvPrefill, float32NormName, KvCacheGenerator, residualNormWeights, type Completion } from '@lathe/rollout';
import { CausalLM, weightInputs, type HfConfig } from '@lathe/models';
import { tinyModel, tinyQwen3 } from './helpers';

// GroupQueryAttention's rotary needs head_dim ≥ 16.
const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16, num_hidden_layers: 3 };
const { dir, config } = tinyModel(wideQwen3, 7);
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1]];

type Add = typeof addKvDecodeStep;
function graph(add: Add, dtype: 'float32' | 'bfloat16', fuseResidualNorm: boolean): L.Graph {
  const g = new L.Graph();
  add(g, config, weightInputs(g, config, dtype, dtype).weights, dtype, { temperature: 0 }, { K: 2, rows: 4, fuseResidualNorm });
  return g;
}
const ops = (g: L.Graph, scope = '') => L.toModelProto(g).graph.node.filter((n) => (n.name ?? '').startsWith(scope)).map((n) => n.opType);

test.each([
  ['float32', 'decode step', addKvDecodeStep],
  ['bfloat16', 'decode step', addKvDecodeStep],
  ['float32', 'prefill', addKvPrefill],
  ['bfloat16', 'prefill', addKvPrefill],
] as const)('%s %s: two nodes fewer a layer, no residual Add left', (dtype, _graph, add) => {
  const plain = graph(add, dtype, false);
  const fused = graph(add, dtype, true);
  // a bfloat16 prefill casts the 2 · layers norm weights to float32 for itself and the steps
  const casts = dtype === 'bfloat16' && add === addKvPrefill ? 2 * config.numLayers : 0;
  expect(ops(plain).length - ops(fused).length).toBe(2 * config.numLayers - casts);
  // a middle layer: its two Adds gone, each norm after an add one node
  expect(ops(plain, 'layer1/').length - ops(fused, 'layer1/').length).toBe(2);
  expect(ops(fused, 'layer1/').filter((o) => o === 'Add')).toEqual([]);
  expect(ops(fused).filter((o) => o === 'SkipSimplifiedLayerNormalization')).toHaveLength(2 * config.numLayers);
  // only layer 0's input norm (no add before it) and the Q/K norms stay plain
  expect(ops(fused).filter((o) => o === 'SimplifiedLayerNormalization')).toHaveLength(1 + 2 * config.numLayers);
});

test('bfloat16: the prefill writes the float32 norm weights, the decode step reads them as inputs', () => {
  const names = residualNormWeights(config).map(float32NormName);
  expect(names).toHaveLength(2 * config.numLayers);
  const prefill = graph(addKvPrefill, 'bfloat16', true);
  const step = graph(addKvDecodeStep, 'bfloat16', true);
  expect(prefill.outputs.filter((t) => t.name.startsWith('float32.')).map((t) => [t.name, t.dtype])).toEqual(names.map((n) => [n, 'float32']));
  expect(step.inputs.filter((t) => t.name.startsWith('float32.')).map((t) => [t.name, t.dtype, t.shape])).toEqual(names.map((n) => [n, 'float32', [config.hiddenSize]]));
  // float32 reads the weights themselves
  expect(graph(addKvDecodeStep, 'float32', true).inputs.filter((t) => t.name.startsWith('float32.'))).toEqual([]);
});

test('greedy: the fused engine generates the unfused one’s tokens, log-probs within 1e-4 (CPU, float32)', async () => {
  const device = Device.cpu();
  const model = CausalLM.fromPretrainedSync(dir, { device });
  const run = async (fuseResidualNorm: boolean): Promise<Completion[]> => {
    const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 16, fuseResidualNorm });
    try {
      return await kv.generate(prompts, { maxNewTokens: 8 });
    } finally {
      kv.dispose();
    }
  };
  try {
    const plain = await run(false);
    const fused = await run(true);
    expect(fused.map((c) => c.tokens)).toEqual(plain.map((c) => c.tokens));
    expect(fused.flatMap((c) => c.tokens)).toHaveLength(prompts.length * 8);
    fused.forEach((c, k) => c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - plain[k].rawLogprobs[t])).toBeLessThan(1e-4)));
  } finally {
    model.dispose();
  }
});

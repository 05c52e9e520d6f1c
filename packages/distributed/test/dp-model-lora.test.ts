/**
 * dp-check's model (tools/bench/distributed/dp-model.ts) with LoRA follows `loraBaseDtype`: with
 * bfloat16 compute an LM-head target (which LoRA merges as base + B·A in float32) is uploaded in
 * float32 and the rest of the base in bfloat16, the step declares each `base/<name>` so, and
 * `frozenBytes` counts what was uploaded — where it used to refuse such a target. With float32
 * compute the same model trains a step on the CPU.
 */
import { paramSpecs, parseConfig } from '@lathe/models';
import { Device, sizeOf, toBfloat16Bits } from '@lathe/runtime';
import { compileTrainStep, sftLoss, Trainer, type LoraConfig } from '@lathe/train';
import { dpModel, DP_SHAPES } from '../../../tools/bench/distributed/dp-model';

// dp-check's CPU shape with its own LM head, so that lm_head can be a target
const config = parseConfig({ ...DP_SHAPES.tiny, tie_word_embeddings: false }, 'tiny, untied');
const specs = paramSpecs(config);
const lora: LoraConfig = { rank: 2, alpha: 4, targets: 'q_proj|v_proj|lm_head' };
const HEAD = 'lm_head.weight';

test('bfloat16 compute with an lm_head target: the head float32, the rest bfloat16, declared so by the step, frozenBytes what was uploaded', () => {
  const device = Device.cpu();
  const model = dpModel(config, device, { compute: 'bfloat16', init: 'sampled', lora });
  const dtypeOf = (name: string) => (name === HEAD ? 'float32' : 'bfloat16');
  expect(model.adapters).toBe(2 * config.numLayers + 1);
  expect(new Map(Object.entries(model.frozen).map(([n, t]) => [n, t.dtype]))).toEqual(new Map(specs.map((s) => [`base/${s.name}`, dtypeOf(s.name)])));
  expect(model.frozenBytes).toBe(specs.reduce((n, s) => n + sizeOf(s.shape) * (dtypeOf(s.name) === 'float32' ? 4 : 2), 0));
  expect(model.frozenBytes).toBe(Object.values(model.frozen).reduce((n, t) => n + t.byteLength, 0));
  // the values a float32 model draws: the head as they are, the rest as their bfloat16 bits
  const float32 = dpModel(config, device, { compute: 'float32', init: 'sampled', lora });
  for (const name of [HEAD, 'model.layers.0.self_attn.q_proj.weight']) {
    const drawn = float32.frozen[`base/${name}`].download().data as Float32Array;
    expect(model.frozen[`base/${name}`].download().data).toEqual(name === HEAD ? drawn : toBfloat16Bits(drawn));
  }
  for (const t of Object.values(float32.frozen)) t.dispose();
  const step = compileTrainStep({ params: model.params, loss: sftLoss(config, { compute: 'bfloat16', weights: model.weights }), optimizer: { maxGradNorm: 1 } }).step;
  const declared = new Map(step.inputs.filter((i) => i.name.startsWith('base/')).map((i) => [i.name, i.dtype]));
  expect(declared).toEqual(new Map(Object.entries(model.frozen).map(([n, t]) => [n, t.dtype])));
  for (const t of Object.values(model.frozen)) t.dispose();
});

test('float32 compute with an lm_head target: every base tensor float32, and a train step runs over them', () => {
  const device = Device.cpu();
  const model = dpModel(config, device, { compute: 'float32', init: 'sampled', lora });
  expect(new Set(Object.values(model.frozen).map((t) => t.dtype))).toEqual(new Set(['float32']));
  expect(model.frozenBytes).toBe(4 * specs.reduce((n, s) => n + sizeOf(s.shape), 0));
  const trainer = Trainer.create({ params: model.params, loss: sftLoss(config, { weights: model.weights }), optimizer: { maxGradNorm: 1 } }, { params: model.init }, { device, frozen: model.frozen });
  const T = 6;
  const ids = BigInt64Array.from({ length: 2 * T }, (_, i) => BigInt((i * 37) % config.vocabSize));
  const ones = new BigInt64Array(2 * T).fill(1n);
  const batch = { input_ids: { data: ids, dims: [2, T] }, attention_mask: { data: ones, dims: [2, T] }, loss_mask: { data: ones, dims: [2, T] }, loss_tokens: { data: Float32Array.of(2 * T), dims: [] } };
  const result = trainer.trainStep([batch], 1e-2);
  expect(Number.isFinite(result.loss)).toBe(true);
  expect(result.gradNorm).toBeGreaterThan(0);
  trainer.dispose();
  for (const t of Object.values(model.frozen)) t.dispose();
});

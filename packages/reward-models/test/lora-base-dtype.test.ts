/**
 * `lathe rm train` / `lathe dpo` with LoRA bind the frozen base in `loraBaseDtype`: with bfloat16
 * compute the base `frozenOn` uploads is bfloat16 (half the bytes; a merged LM-head target of a
 * policy stays float32) and the train step declares each `base/<name>` input in the dtype uploaded;
 * with float32 compute it is the master weights as they were. The CPU provider runs no bfloat16
 * MatMul, so the bfloat16 step is checked as a graph; the float32 one trains in trainable.test.ts
 * and dpo.test.ts.
 */
import { CausalLM, paramSpecs, SCORE_WEIGHT, type DecoderConfig } from '@lathe/models';
import { Device, sizeOf, toBfloat16Bits } from '@lathe/runtime';
import { compileTrainStep, type LossBuilder } from '@lathe/train';
import { bradleyTerryLoss, dpoLoss, REWARD_LORA_TARGETS, RewardModel, trainedWeights, type TrainedWeights } from '@lathe/reward-models';
import { PAD, tinyLm, tinyQwen3 } from './tiny';

const rm = RewardModel.fromCausalLM(tinyLm(2, 1), { padTokenId: PAD, seed: 5, std: 0.3 });
// a policy with its own LM head, targeted: LoRA merges it (base + B·A) rather than adding a side branch
const policy = CausalLM.random({ ...tinyQwen3(1), tie_word_embeddings: false }, { seed: 3, std: 0.1 });

/** Each `base/<name>` the step reads: its declared dtype, and the dtype, bytes and values `frozenOn` uploads. */
function frozenBase(config: DecoderConfig, master: ReadonlyMap<string, Float32Array>, tw: TrainedWeights, loss: LossBuilder) {
  const graphs = compileTrainStep({ params: tw.params, loss, optimizer: { maxGradNorm: 1 } });
  const device = Device.cpu();
  const frozen = tw.frozenOn(device);
  const declared = (g: typeof graphs.step) => new Map(g.inputs.filter((i) => i.name.startsWith('base/')).map((i) => [i.name, i.dtype]));
  const uploaded = new Map(Object.entries(frozen).map(([n, t]) => [n, t.dtype]));
  const bytes = Object.values(frozen).reduce((n, t) => n + t.byteLength, 0);
  const values = new Map(Object.entries(frozen).map(([n, t]) => [n.slice(5), t.download().data]));
  for (const t of Object.values(frozen)) t.dispose();
  const specs = paramSpecs(config).filter((s) => s.name !== SCORE_WEIGHT);
  expect(specs.every((s) => master.has(s.name))).toBe(true);
  return { step: declared(graphs.step), accumulate: declared(graphs.accumulate), uploaded, bytes, values, specs };
}

test.each([
  ['a reward model (bradley-terry)', 'bfloat16'],
  ['a reward model (bradley-terry)', 'float32'],
  ['a policy with a targeted LM head (dpo)', 'bfloat16'],
  ['a policy with a targeted LM head (dpo)', 'float32'],
] as const)('%s, %s compute: the base uploaded in loraBaseDtype, declared so by the step', (what, compute) => {
  const isRm = what.startsWith('a reward');
  const model = isRm ? rm : policy;
  const master = model.float32Weights();
  const lora = { rank: 2, alpha: 4, targets: isRm ? REWARD_LORA_TARGETS : `${REWARD_LORA_TARGETS}|lm_head` };
  const tw = trainedWeights(model.config, master, { lora, compute });
  const loss = isRm ? bradleyTerryLoss(model.config, { compute, weights: tw.weights }) : dpoLoss(model.config, { compute, chunk: 8, weights: tw.weights });
  const f = frozenBase(model.config, master, tw, loss);
  const dtypeOf = (name: string) => (compute === 'float32' || name === 'lm_head.weight' ? 'float32' : compute);
  const expected = new Map(f.specs.map((s) => [`base/${s.name}`, dtypeOf(s.name)]));
  if (!isRm) expect(expected.get('base/lm_head.weight')).toBe('float32');
  expect(f.uploaded).toEqual(expected);
  expect(f.step).toEqual(expected);
  expect(f.accumulate).toEqual(expected);
  expect(f.bytes).toBe(f.specs.reduce((n, s) => n + sizeOf(s.shape) * (dtypeOf(s.name) === 'float32' ? 4 : 2), 0));
  for (const s of f.specs) expect(f.values.get(s.name)).toEqual(dtypeOf(s.name) === 'float32' ? master.get(s.name) : toBfloat16Bits(master.get(s.name)!));
});

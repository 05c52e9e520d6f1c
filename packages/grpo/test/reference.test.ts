/**
 * The frozen KL reference is stored once in the compute dtype (CPU): its buffers' dtype and bytes
 * follow the compute dtype in Lathe's device accounting, a bfloat16 copy holds exactly the
 * round-to-nearest-even values of the float32 weights with no float32 copy left behind, its scoring
 * graph reads it without a Cast, and with float32 compute the reference (and so the KL) is the
 * starting policy's, unchanged by training.
 */
import { paramSpecs } from '@lathe/models';
import { Device, sizeOf, toBfloat16Bits } from '@lathe/runtime';
import { castWeights } from '@lathe/train';
import { combineRewards, computeDtypeWeights, frozenReference, GrpoTrainer, klEstimate, responseValues, scoringGraph, type PolicyWeights, type RlPrompt } from '@lathe/grpo';
import { tinyModel } from './tiny-qwen3';

const model = tinyModel(24, { layers: 2, std: 0.5, seed: 5, headDim: 16 });
const specs = paramSpecs(model.config);
const elements = specs.reduce((n, s) => n + sizeOf(s.shape), 0);

test.each([
  ['bfloat16', 2],
  ['float32', 4],
] as const)('a %s reference takes %d bytes per weight in the device accounting, and holds the weights in that dtype', (compute, bytesPer) => {
  const device = Device.cpu();
  const before = device.memory();
  const ref = frozenReference(device, model.lm, compute);
  const after = device.memory();
  // what stays allocated is the reference alone: the float32 uploads it was computed from are freed
  expect(after.bytes - before.bytes).toBe(elements * bytesPer);
  expect(after.tensors - before.tensors).toBe(specs.length);
  for (const s of specs) {
    const t = ref.weights.get(s.name)!;
    expect([s.name, t.dtype, t.byteLength]).toEqual([s.name, compute, sizeOf(s.shape) * bytesPer]);
    const expected = compute === 'bfloat16' ? toBfloat16Bits(model.weights.get(s.name)!) : model.weights.get(s.name)!;
    expect(t.download().data).toEqual(expected);
  }
  ref.dispose();
  expect(device.memory().bytes).toBe(before.bytes);
});

test('materialised from weights already on the device, a bfloat16 reference allocates nothing float32', () => {
  const device = Device.cpu();
  const onDevice = specs.map((s) => [s.name, device.upload({ data: model.weights.get(s.name)!, dims: s.shape })] as const);
  const allocations = (['upload', 'empty', 'zeros', 'full'] as const).map((fn) => jest.spyOn(device, fn));
  const before = device.memory();
  const ref = frozenReference(device, model.lm, 'bfloat16', { onDevice });
  const after = device.memory();
  const [uploads, ...others] = allocations.map((spy) => spy.mock.calls);
  allocations.forEach((spy) => spy.mockRestore());
  expect(after.bytes - before.bytes).toBe(elements * 2);
  // no float32 upload, and every buffer allocated is one of the bfloat16 copy's
  expect(uploads).toHaveLength(0);
  expect(new Set(others.flat().map((args) => args[0]))).toEqual(new Set(['bfloat16']));
  for (const s of specs) expect(ref.weights.get(s.name)!.download().data).toEqual(toBfloat16Bits(model.weights.get(s.name)!));
  ref.dispose();
  onDevice.forEach(([, t]) => t.dispose());
});

test('a float32 reference of weights already on the device is a device-to-device copy: no upload', () => {
  const device = Device.cpu();
  const onDevice = specs.map((s) => [s.name, device.upload({ data: model.weights.get(s.name)!, dims: s.shape })] as const);
  const uploads = jest.spyOn(device, 'upload');
  const ref = frozenReference(device, model.lm, 'float32', { onDevice });
  expect(uploads.mock.calls).toHaveLength(0);
  uploads.mockRestore();
  // a copy, not the same buffers: changing the source leaves the reference as it was
  onDevice[0][1].upload(new Float32Array(onDevice[0][1].size));
  for (const s of specs) expect(ref.weights.get(s.name)!.download().data).toEqual(model.weights.get(s.name)!);
  ref.dispose();
  onDevice.forEach(([, t]) => t.dispose());
});

test('the reference scorer reads bfloat16 weights as they are: no float32 weight input, no Cast of a weight', () => {
  const weightNames = new Set(specs.map((s) => s.name));
  const castsOfWeights = (pw: PolicyWeights) => {
    const g = scoringGraph(model.config, pw, { temperature: 1, compute: 'bfloat16' });
    const inputs = g.inputs.filter((t) => weightNames.has(t.name));
    const casts = g.nodes.filter((n) => n.op.name === 'Cast' && n.inputs.some((t) => t && weightNames.has(t.name)));
    return { dtypes: new Set(inputs.map((t) => t.dtype)), count: inputs.length, casts: casts.length };
  };
  expect(castsOfWeights(computeDtypeWeights(model.config, 'bfloat16'))).toEqual({ dtypes: new Set(['bfloat16']), count: specs.length, casts: 0 });
  // control: float32 weights (a LoRA base, or the reference as it was) are cast inside every scoring run
  const float32: PolicyWeights = { trainable: specs.map((s) => ({ name: s.name, shape: s.shape, decay: false })), weights: (_g, t) => castWeights(t, 'bfloat16') };
  expect(castsOfWeights(float32)).toEqual({ dtypes: new Set(['float32']), count: specs.length, casts: specs.length });
});

interface Meta {
  answer: number;
}

test('float32: the reference is the starting policy, unchanged by training, and kl_ref is the KL to it', async () => {
  const rewards = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'r', fn: (_p, c, m) => (c.split(' ')[0] === String(m.answer) ? 1 : 0) }], { fallback: 0 });
  const t = GrpoTrainer.create<Meta>({
    model: model.lm,
    tokenizer: { decode: (ids) => ids.join(' '), padId: 0 },
    stopIds: [3],
    rewards,
    groupSize: 4,
    maxNewTokens: 4,
    sampling: { temperature: 0.9 },
    kl: { coef: 0.05 },
    minibatches: 2,
  });
  const prompts = (step: number): RlPrompt<Meta>[] => [[5], [9, 1, 4], [13, 6]].map((ids, i) => ({ ids, text: String(i), meta: { answer: 7 + i }, key: step * 3 + i }));
  const refWeights = t.referenceWeights!;
  expect([...refWeights.values()].every((w) => w.dtype === 'float32')).toBe(true);
  expect([...refWeights.values()].reduce((n, w) => n + w.byteLength, 0)).toBe(elements * 4);

  const batch = await t.sample(prompts(0));
  const start = await t.referenceLogprobs(batch);
  // before any update the reference and the policy are the same weights through the same graph
  expect(responseValues(batch, start!)).toEqual(responseValues(batch, (await t.rescore(batch)).logp));
  for (let s = 0; s < 3; s++) await t.step(prompts(s), 0.05);
  expect(responseValues(batch, (await t.referenceLogprobs(batch))!)).toEqual(responseValues(batch, start!));

  // kl_ref of the next step = k3 between the (re-scored) policy and the reference, on its own samples
  const next = await t.sample(prompts(3));
  const old = responseValues(next, (await t.rescore(next)).logp).flat();
  const ref = responseValues(next, (await t.referenceLogprobs(next))!).flat();
  const expected = old.reduce((a, lp, i) => a + klEstimate(lp, ref[i], 'k3'), 0) / old.length;
  const { metrics } = await t.step(prompts(3), 0.05);
  expect(expected).toBeGreaterThan(1e-3);
  expect(metrics.kl_ref).toBeCloseTo(expected, 10);
  t.dispose();
});

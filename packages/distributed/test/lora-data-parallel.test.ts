/**
 * LoRA under data parallelism on the CPU over the in-process group (what dp-check --lora runs on
 * the GPUs): the base is a frozen input bound once on every rank, the adapters are the only
 * trained parameters, so only their gradients are all-reduced (or, with ZeRO-1, reduce-scattered)
 * and only they carry AdamW moments. Two ranks take one process's steps on the whole batch.
 */
import { paramSpecs } from '@lathe/models';
import { initLora, loraAdapters, loraWeights, sftLoss, Trainer, type LoraConfig, type TrainerOptions, type TrainStepResult, type TrainStepSpec } from '@lathe/train';
import { gradientAllReduce, LocalGroup, type HostCollectives } from '@lathe/distributed';
import { rankBatches, relClose, sftRows, STEPS_TOL, tinySftSpec } from './tiny-sft';

const { config, weights } = tinySftSpec({ seed: 11 });
const lora: LoraConfig = { rank: 4, alpha: 8, targets: 'q_proj|k_proj|v_proj|o_proj' };
const adapters = loraAdapters(config, lora);
const specs = paramSpecs(config);
const spec: TrainStepSpec = {
  params: adapters.flatMap((a) => [a.a, a.b]),
  loss: sftLoss(config, {
    weights: (g, trainable) => {
      const base = new Map(specs.map((s) => [s.name, g.input(`base/${s.name}`, 'float32', s.shape)]));
      return loraWeights((name) => base.get(name)!, trainable, adapters, lora, 'float32');
    },
  }),
  optimizer: { weightDecay: 0.1, maxGradNorm: 1 },
};
const frozen = Object.fromEntries(specs.map((s) => [`base/${s.name}`, { data: weights.get(s.name)!, dims: s.shape }]));
const adapterElements = spec.params.reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0);

const STEPS = 4;
const BATCH = 8;
// a large rate, so the adapters move far beyond the tolerance in 4 steps
const lr = (step: number) => 0.05 / (1 + step);
const batchFor = (step: number, rank: number, world: number, micro = 1) => rankBatches(sftRows(500 + step, BATCH), rank, world, micro);

interface Run {
  results: TrainStepResult[][];
  finals: Map<string, Float32Array>[];
  momentBytes: number[];
}

/** `world` ranks of the in-process group (1: one process, no reduction) from the same adapters and base, with `reduce`'s options a rank. */
async function run(world: number, micro: number, reduce: (c: HostCollectives) => TrainerOptions): Promise<Run> {
  const group = LocalGroup.create(world);
  const trainers = group.map((c) => Trainer.create(spec, { params: initLora(adapters, 0) }, { microBatches: micro, frozen, ...(world > 1 ? reduce(c) : {}) }));
  const results: TrainStepResult[][] = group.map(() => []);
  for (let step = 0; step < STEPS; step++) {
    const out = await Promise.all(trainers.map((t, r) => t.trainStepAsync(batchFor(step, r, world, micro), lr(step))));
    out.forEach((o, r) => results[r].push(o));
  }
  const finals = await Promise.all(trainers.map(async (t) => (await t.snapshotAsync()).params));
  const momentBytes = trainers.map((t) => t.momentBytes);
  for (const t of trainers) t.dispose();
  return { results, finals, momentBytes };
}

const single = run(1, 1, () => ({}));

function expectSameSteps(dp: Run, ref: Run): void {
  const one = ref.results[0];
  // the adapters moved: B starts at zero, so any difference from the start is training
  const moved = Math.max(...[...ref.finals[0]].filter(([n]) => n.includes('lora_B')).map(([, v]) => Math.max(...v.map(Math.abs))));
  expect(moved).toBeGreaterThan(1e-3);
  dp.results.forEach((res, r) => {
    res.forEach((x, step) => {
      relClose(x.loss, one[step].loss);
      relClose(x.gradNorm, one[step].gradNorm);
      expect(x.loss).toBe(dp.results[0][step].loss);
    });
    for (const [name, v] of ref.finals[0]) {
      const mine = dp.finals[r].get(name)!;
      for (let i = 0; i < v.length; i++) expect(Math.abs(mine[i] - v[i])).toBeLessThanOrEqual(STEPS_TOL);
    }
  });
}

test('LoRA on 2 ranks (adapter gradients all-reduced) takes one process’s steps within 1e-5, with micro-batches too; the trained state is the adapters alone', async () => {
  const ref = await single;
  // both buffer sets' moments of the adapters, nothing for the base
  expect(ref.momentBytes[0]).toBe(2 * 2 * 4 * adapterElements);
  expect([...ref.finals[0].keys()].sort()).toEqual(spec.params.map((p) => p.name).sort());
  for (const micro of [1, 2]) expectSameSteps(await run(2, micro, (c) => ({ onGradients: gradientAllReduce(c) })), ref);
});

test('LoRA with ZeRO-1 on 2 ranks takes one process’s steps within 1e-5 and keeps half the adapters’ moments a rank', async () => {
  const ref = await single;
  const dp = await run(2, 1, (c) => ({ zero: c }));
  expectSameSteps(dp, ref);
  for (const bytes of dp.momentBytes) {
    expect(bytes).toBeGreaterThanOrEqual(ref.momentBytes[0] / 2);
    // each tensor's shard padded by at most one element a moment and a buffer set
    expect(bytes).toBeLessThanOrEqual(ref.momentBytes[0] / 2 + 2 * 2 * 4 * spec.params.length);
  }
});

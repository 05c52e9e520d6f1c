/**
 * Data-parallel training on the CPU over the in-process group: N ranks, each with its share of the
 * global batch and its gradients all-reduced through Trainer's onGradients hook, take the same
 * steps as one process on the whole batch (the SFT loss of a tiny decoder, normalised by the
 * global batch's loss-token count), to float32 rounding.
 */
import { Trainer, type TrainStepResult } from '@lathe/train';
import { buckets, checkDataParallelBatch, checkSameConfig, gatherRows, gradientAllReduce, LocalGroup, shardOf, type Collectives } from '@lathe/distributed';
import { rankBatches, relClose, stepLr as lr, stepRows as rows, STEPS_TOL, tinySftSpec } from './tiny-sft';

const { weights, spec } = tinySftSpec({ seed: 3 });

const STEPS = 4;
const BATCH = 8;

function singleProcess(): { results: TrainStepResult[]; final: Map<string, Float32Array> } {
  const trainer = Trainer.create(spec, { params: weights });
  const results: TrainStepResult[] = [];
  for (let step = 0; step < STEPS; step++) results.push(trainer.trainStep(rankBatches(rows(step, BATCH), 0, 1, 1), lr(step)));
  const final = trainer.downloadParams();
  trainer.dispose();
  return { results, final };
}

async function dataParallel(world: number, micro: number, bucketBytes?: number): Promise<{ results: TrainStepResult[][]; finals: Map<string, Float32Array>[] }> {
  const group = LocalGroup.create(world);
  const trainers = group.map((c) => Trainer.create(spec, { params: weights }, { microBatches: micro, onGradients: gradientAllReduce(c, { bucketBytes }) }));
  const results: TrainStepResult[][] = group.map(() => []);
  for (let step = 0; step < STEPS; step++) {
    const global = rows(step, BATCH);
    const out = await Promise.all(trainers.map((t, r) => t.trainStepAsync(rankBatches(global, r, world, micro), lr(step))));
    out.forEach((o, r) => results[r].push(o));
  }
  const finals = trainers.map((t) => t.downloadParams());
  for (const t of trainers) t.dispose();
  return { results, finals };
}

const reference = singleProcess();

test.each([
  [2, 1, undefined],
  [4, 1, undefined],
  [2, 2, 2048], // micro-batches on each rank; small buckets (several all-reduces per step)
])('%i ranks × %i micro-batches (buckets of %s bytes) take the steps of one process on the whole batch (loss, grad norm and metrics within 1e-6, weights within the rounding of the sums order)', async (world, micro, bucketBytes) => {
  const { results, finals } = await dataParallel(world, micro, bucketBytes);
  for (let r = 0; r < world; r++) {
    results[r].forEach((res, step) => {
      const ref = reference.results[step];
      relClose(res.loss, ref.loss);
      relClose(res.gradNorm, ref.gradNorm);
      relClose(res.metrics.token_nll_sum, ref.metrics.token_nll_sum);
      // every rank reports the same (all-reduced) values
      expect(res.loss).toBe(results[0][step].loss);
    });
    // weights absolutely (as trainer.test's accumulation check): AdamW divides each element's step by
    // its own gradient's RMS, so an element whose gradient is near zero turns rounding into a relative wobble
    let worst = 0;
    for (const [name, v] of reference.final) {
      const mine = finals[r].get(name)!;
      for (let i = 0; i < v.length; i++) worst = Math.max(worst, Math.abs(mine[i] - v[i]));
    }
    expect(worst).toBeLessThanOrEqual(STEPS_TOL);
  }
  // the trajectory moved: the check is not of untouched weights
  expect(reference.results[STEPS - 1].loss).toBeLessThan(reference.results[0].loss);
});

test('a trainer with a gradient hook refuses the synchronous step, and the fixed-buffer path', () => {
  const hook = async () => undefined;
  const t = Trainer.create(spec, { params: weights }, { onGradients: hook });
  expect(() => t.trainStep(rankBatches(rows(0, 2), 0, 1, 1), 0.01)).toThrow(/onGradients hook.*trainStepAsync/);
  t.dispose();
  expect(() => Trainer.create(spec, { params: weights }, { onGradients: hook, staticInputs: true })).toThrow(/no place for onGradients/);
});

test('a global batch that does not split over the ranks is an error naming the flag and the world size', () => {
  expect(() => checkDataParallelBatch(6, 1, 4)).toThrow('--batch_size 6 is not divisible by the world size 4 (WORLD_SIZE, lathe launch --gpus)');
  expect(() => checkDataParallelBatch(8, 3, 2)).toThrow('--batch_size 8 over 2 ranks is 4 rows per rank, not divisible by --micro_batches 3');
  expect(() => checkDataParallelBatch(64, 2, 4, { batch: '--num_prompts', micro: '--micro_batches' })).not.toThrow();
  expect(shardOf([0, 1, 2, 3, 4, 5], 1, 3)).toEqual([2, 3]);
  expect(() => shardOf([1, 2, 3], 0, 2, '--prompts_per_step')).toThrow(/--prompts_per_step 3 is not divisible by the world size 2/);
});

test('buckets keep order, stay under the cap, and give an oversized tensor a bucket of its own', () => {
  const t = (n: number) => ({ byteLength: n, n });
  expect(buckets([t(4), t(4), t(4), t(20), t(4)], 10).map((b) => b.map((x) => x.n))).toEqual([[4, 4], [4], [20], [4]]);
});

test('ranks started with different configs are stopped at start with the differing keys named', async () => {
  const group = LocalGroup.create(3);
  const cfgs = [{ lr: 1e-4, steps: 10, run_dir: 'a' }, { lr: 1e-4, steps: 10, run_dir: 'b' }, { lr: 2e-4, steps: 10, run_dir: 'a' }];
  const out = await Promise.allSettled(group.map((c, r) => checkSameConfig(c, cfgs[r])));
  for (const o of out) expect(o.status === 'rejected' && String(o.reason)).toMatch(/rank 1 differs from rank 0 in run_dir \("b" vs "a"\); rank 2 differs from rank 0 in lr \(0.0002 vs 0.0001\)/);
  const ok = await Promise.allSettled(LocalGroup.create(2).map((c, r) => checkSameConfig(c, cfgs[r], ['run_dir'])));
  expect(ok.map((o) => o.status)).toEqual(['fulfilled', 'fulfilled']);
});

/** GRPO's group-normalised advantage, (r − mean) / (std + ε) within each group of G, written out for the check. */
function groupAdvantages(rewards: Float64Array, G: number): number[] {
  const out: number[] = [];
  for (let g = 0; g < rewards.length; g += G) {
    const grp = Array.from(rewards.slice(g, g + G));
    const mean = grp.reduce((a, b) => a + b, 0) / G;
    const std = Math.sqrt(grp.reduce((a, b) => a + (b - mean) ** 2, 0) / (G - 1));
    out.push(...grp.map((r) => (r - mean) / (std + 1e-4)));
  }
  return out;
}

/** A batch-normalised advantage (REINFORCE++ style): (r − batch mean) / batch std — needs every rank's rewards. */
function batchAdvantages(rewards: Float64Array): number[] {
  const n = rewards.length;
  const mean = rewards.reduce((a, b) => a + b, 0) / n;
  const std = Math.sqrt(rewards.reduce((a, b) => a + (b - mean) ** 2, 0) / n);
  return Array.from(rewards, (r) => (r - mean) / std);
}

test('RL: with whole groups per rank and the rewards gathered, every rank\'s advantages are its slice of the one-process result', async () => {
  const G = 4;
  const prompts = 6;
  const rewards = Float64Array.from({ length: prompts * G }, (_, i) => ((i * 7919) % 13) / 13);
  const one = { group: groupAdvantages(rewards, G), batch: batchAdvantages(rewards) };
  for (const world of [2, 3]) {
    const group: Collectives[] = LocalGroup.create(world);
    const got = await Promise.all(
      group.map(async (c) => {
        const mine = shardOf(Array.from({ length: prompts }, (_, p) => p), c.rank, world, '--prompts_per_step');
        const local = rewards.slice(mine[0] * G, (mine.at(-1)! + 1) * G);
        const { all, offset } = await gatherRows(c, local);
        return { group: groupAdvantages(local, G), batch: batchAdvantages(all).slice(offset, offset + local.length), offset };
      }),
    );
    expect(got.flatMap((g) => g.group)).toEqual(one.group);
    expect(got.flatMap((g) => g.batch)).toEqual(one.batch);
  }
});

/**
 * Data-parallel GRPO on the CPU over the in-process group: N ranks, each sampling and scoring its
 * share of the step's prompts (whole groups), take the steps of one process on all of them — the
 * same samples, advantages, losses and updated weights. Samples match because each completion's
 * noise is drawn from its prompt's key (key·G + j), whichever rank samples it; advantages match
 * because the estimator runs on every rank's rows gathered (REINFORCE++ whitens over the whole
 * batch, GRPO normalises within groups); updates match because the loss normaliser counts the
 * whole minibatch and the ranks' gradients are summed.
 */
import { gradientAllReduce, LocalGroup, shardOf } from '@lathe/distributed';
import { combineRewards, GrpoTrainer, type EstimatorName, type GrpoStepResult, type RlPrompt } from '../src';
import { tinyModel } from './tiny-qwen3';

interface Meta {
  answer: number;
}
const V = 12;
const ANSWERS = [5, 7, 3, 2];
/** Reward: the fraction of the completion's tokens equal to the answer (a graded reward, so groups rarely tie). */
const rewards = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'match', fn: (_p, c, m) => c.split(' ').filter((t) => t === String(m.answer)).length / 3 }], { fallback: 0 });
const tokenizer = { decode: (ids: readonly number[]) => ids.join(' '), padId: 0 };
const prompts = (step: number): RlPrompt<Meta>[] => ANSWERS.map((answer, p) => ({ ids: [p + 1, (p * 3) % V], text: String(p), meta: { answer }, key: step * ANSWERS.length + p, index: p }));
const model = tinyModel(V, { seed: 11, std: 0.3 });

const STEPS = 3;

async function run(world: number, estimator: EstimatorName, aggregation: 'token-mean' | 'seq-mean-token-mean'): Promise<{ results: GrpoStepResult[][]; weights: Map<string, Float32Array>[] }> {
  const group = LocalGroup.create(world);
  const trainers = group.map((c) =>
    GrpoTrainer.create<Meta>({
      model: model.lm,
      tokenizer,
      stopIds: [],
      rewards,
      groupSize: 4,
      maxNewTokens: 3,
      estimator,
      loss: { aggregation },
      epochs: 2,
      microBatches: 2,
      optimizer: { maxGradNorm: 1, weightDecay: 0.01 },
      seed: 3,
      ...(world > 1 ? { dataParallel: { rank: c.rank, worldSize: world, allGatherBytes: (b) => c.allGatherBytes(b), trainerOptions: { onGradients: gradientAllReduce(c) } } } : {}),
    }),
  );
  const results: GrpoStepResult[][] = trainers.map(() => []);
  for (let step = 0; step < STEPS; step++) {
    const out = await Promise.all(trainers.map((t, r) => t.step(shardOf(prompts(step), r, world, 'prompts'), 0.05)));
    out.forEach((o, r) => results[r].push(o));
  }
  const weights = trainers.map((t) => t.trainer.downloadParams());
  for (const t of trainers) t.dispose();
  return { results, weights };
}

function maxDiff(a: Map<string, Float32Array>, b: Map<string, Float32Array>): number {
  let w = 0;
  for (const [k, v] of b) {
    const x = a.get(k)!;
    for (let i = 0; i < v.length; i++) w = Math.max(w, Math.abs(x[i] - v[i]));
  }
  return w;
}

test.each([
  ['grpo', 'seq-mean-token-mean', 2],
  ['reinforce_pp', 'token-mean', 2],
  ['grpo', 'token-mean', 4],
] as const)('%s (%s) on %i ranks: the samples, advantages and updated weights of one process on all the prompts', async (estimator, aggregation, world) => {
  const one = await run(1, estimator, aggregation);
  const many = await run(world, estimator, aggregation);
  for (let step = 0; step < STEPS; step++) {
    const ref = one.results[0][step].rollouts;
    const got = many.results.flatMap((r) => r[step].rollouts);
    // the same completions, in rank order, with the same rewards and advantages
    expect(got.map((r) => r.completion)).toEqual(ref.map((r) => r.completion));
    expect(got.map((r) => r.reward)).toEqual(ref.map((r) => r.reward));
    got.forEach((r, i) => expect(Math.abs(r.advantage - ref[i].advantage)).toBeLessThanOrEqual(1e-6));
  }
  // the advantages are not trivial (groups differ), and the weights moved far beyond the tolerance
  expect(one.results[0].flatMap((s) => s.rollouts).some((r) => Math.abs(r.advantage) > 0.1)).toBe(true);
  expect(maxDiff(one.weights[0], model.weights)).toBeGreaterThan(1e-2);
  // the loss (summed over the ranks by the gradient hook) of every step
  many.results.forEach((r) => r.forEach((s, step) => expect(Math.abs(s.metrics.loss - one.results[0][step].metrics.loss)).toBeLessThanOrEqual(1e-6 * Math.max(1, Math.abs(one.results[0][step].metrics.loss)))));
  // 6 AdamW steps on gradients summed in another grouping (each rank's micro-batches, then the
  // ranks): float32 rounding, which AdamW's per-element step magnifies where a gradient is near 0
  // (measured 1.1e-6 and 2.1e-6)
  for (const w of many.weights) expect(maxDiff(w, one.weights[0])).toBeLessThanOrEqual(5e-6);
}, 120_000);

test('data parallelism refuses what would let the ranks diverge, by name', () => {
  const [c0, c1] = LocalGroup.create(2);
  const dp = { rank: 0, worldSize: 2, allGatherBytes: (b: Uint8Array) => c0.allGatherBytes(b), trainerOptions: { onGradients: gradientAllReduce(c0) } };
  const base = { model: model.lm, tokenizer, stopIds: [], rewards, groupSize: 4, maxNewTokens: 3, dataParallel: dp };
  expect(() => GrpoTrainer.create<Meta>({ ...base, dynamicSampling: { maxRounds: 2 } })).toThrow(/dynamicSampling with data parallelism/);
  expect(() => GrpoTrainer.create<Meta>({ ...base, kl: { coef: 0.1, mode: 'reward', target: 0.05 } })).toThrow(/kl.target .* with data parallelism/);
  expect(() => GrpoTrainer.create<Meta>({ ...base, dataParallel: { ...dp, trainerOptions: { zero: c1 } } })).toThrow(/ZeRO-1 with the RL loop/);
});

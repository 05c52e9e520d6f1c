/**
 * `releaseGenerationMemory` on a tiny random Qwen3 of head_dim 16 (CPU, float32, the KV-cache
 * engine): after every generation phase the KV engines (caches, sessions) and the compute-dtype
 * weight copy are freed — a step leaves no tensor bytes behind beyond the train step's first-use
 * scalars — while the default keeps at least the caches and the copy; and the rebuilt engines give the same samples,
 * metrics and weights as kept ones, ReMax's greedy baseline and evaluation's greedy runs included.
 */
import { paramSpecs } from '@lathe/models';
import { Device, sizeOf } from '@lathe/runtime';
import { combineRewards, GrpoTrainer, type GrpoTrainerOptions, type RlPrompt } from '@lathe/grpo';
import { tinyModel } from './tiny-qwen3';

type Meta = Record<string, never>;
const rewards = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'fives', fn: (_p, c) => c.split(' ').filter((t) => t === '5').length }], { fallback: 0 });
const promptIds = [[5], [9, 1, 4], [13, 6], [20, 21, 22, 23]];
const prompts = (step: number): RlPrompt<Meta>[] => promptIds.map((ids, i) => ({ ids, text: String(i), meta: {}, key: step * 10 + i, index: i }));
const G = 4;
const NEW = 6;
const model = tinyModel(24, { headDim: 16, std: 0.5, seed: 9 });

function make(over: Partial<GrpoTrainerOptions<Meta>>): GrpoTrainer<Meta> {
  return GrpoTrainer.create<Meta>({
    model: model.lm,
    tokenizer: { decode: (ids) => ids.join(' '), padId: 0 },
    stopIds: [3],
    rewards,
    groupSize: G,
    maxNewTokens: NEW,
    sampling: { temperature: 0.8 },
    kl: { coef: 0.05 },
    minibatches: 3,
    seed: 11,
    ...over,
  });
}

/** Lathe-counted bytes on the CPU device that `fn` leaves allocated. */
async function bytesLeftBy(fn: () => Promise<unknown>): Promise<number> {
  const before = Device.cpu().memory().bytes;
  await fn();
  return Device.cpu().memory().bytes - before;
}

test.each([['grpo'], ['remax']] as const)('%s: released generation memory is rebuilt to the same samples, metrics and weights; kept memory stays', async (estimator) => {
  const [released, kept] = [true, false].map((releaseGenerationMemory) => make({ estimator, releaseGenerationMemory }));
  expect(released.generationEngine).toBe('kv-cache');
  const c = model.config;
  // the sampler's caches (2 per layer + the prefill's tail) for 4 prompts × G rows and the
  // (power-of-64, capped) cache length, and the float32 weight copy they read
  const cacheLength = Math.min(c.maxPositionEmbeddings, Math.ceil((4 + NEW) / 64) * 64);
  const caches = (2 * c.numLayers + 1) * promptIds.length * G * c.numKvHeads * cacheLength * c.headDim * 4;
  const weights = paramSpecs(c).reduce((n, s) => n + sizeOf(s.shape), 0) * 4;
  for (let s = 0; s < 3; s++) {
    let a!: Awaited<ReturnType<GrpoTrainer<Meta>['step']>>;
    let b!: typeof a;
    const releasedBytes = await bytesLeftBy(async () => (a = await released.step(prompts(s), 0.05)));
    const keptBytes = await bytesLeftBy(async () => (b = await kept.step(prompts(s), 0.05)));
    if (s === 0) {
      // the first step also leaves the train step's own small buffers, in both trainers
      expect(releasedBytes).toBeLessThan(1024);
      expect(keptBytes - releasedBytes).toBeGreaterThanOrEqual(caches + weights);
    } else expect([releasedBytes, keptBytes]).toEqual([0, 0]); // kept: built once, then reused
    expect(a.rollouts.map((r) => r.tokens)).toEqual(b.rollouts.map((r) => r.tokens));
    for (const k of ['loss', 'kl_ref', 'logp_parity', 'reward_mean', 'advantage_abs_mean'] as const) expect([k, a.metrics[k]]).toEqual([k, b.metrics[k]]);
  }
  // evaluation's greedy generation is a phase of its own
  let greedy!: Awaited<ReturnType<GrpoTrainer<Meta>['generateGreedy']>>;
  expect(await bytesLeftBy(async () => (greedy = await released.generateGreedy(prompts(0))))).toBe(0);
  expect(greedy).toEqual(await kept.generateGreedy(prompts(0)));
  const [sa, sb] = [released.snapshot(), kept.snapshot()];
  for (const [name, v] of sa.values) expect([name, v]).toEqual([name, sb.values.get(name)]);
  released.dispose();
  kept.dispose();
});

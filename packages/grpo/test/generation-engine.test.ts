/**
 * GrpoTrainer's two rollout generators on a tiny random Qwen3 of head_dim 16 (CPU, float32): the
 * KV-cache engine (`KvCacheGenerator`: prefill + bound decode steps over GroupQueryAttention) and the
 * in-graph generation loop sample the same tokens from the same seed, and the steps built on them
 * give the same metrics and the same weights — through updates (generation must read the buffers
 * the last update wrote) and a larger batch (the KV engine is rebuilt with more rows). Also: which
 * engine the default picks, and the error of an explicit 'kv-cache' where it cannot run. With LoRA, the
 * KV engine's materialised weights (base + scale·B·A) give the same rollouts as the graph engine's.
 */
import * as L from '@lathe/onnx';
import { paramSpecs } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { castWeights } from '@lathe/train';
import type { GenerationEngine } from '@lathe/rollout';
import { combineRewards, ComputeWeights, GrpoTrainer, KvGenerationRunner, type GrpoStepMetrics, type GrpoTrainerOptions, type RlPrompt } from '@lathe/grpo';
import { tinyModel } from './tiny-qwen3';

type Meta = Record<string, never>;
const V = 24;
/** Rewards that differ within groups: how many 5s a completion holds, minus its length. */
const rewards = combineRewards<Meta & { completionTokens: number; stopped: boolean }>(
  [
    { name: 'fives', fn: (_p, c) => c.split(' ').filter((t) => t === '5').length },
    { name: 'short', fn: (_p, _c, m) => -m.completionTokens / 6, weight: 0.5 },
  ],
  { fallback: 0 },
);
const tokenizer = { decode: (ids: readonly number[]) => ids.join(' '), padId: 0 };
const promptIds = [[5], [9, 1, 4], [13, 6], [20, 21, 22, 23]];
const prompts = (step: number, n: number): RlPrompt<Meta>[] => promptIds.slice(0, n).map((ids, i) => ({ ids, text: String(i), meta: {}, key: step * 10 + i, index: i }));

function make(model: ReturnType<typeof tinyModel>, over: Partial<GrpoTrainerOptions<Meta>> = {}): GrpoTrainer<Meta> {
  return GrpoTrainer.create<Meta>({
    model: model.lm,
    tokenizer,
    stopIds: [3],
    rewards,
    groupSize: 4,
    maxNewTokens: 6,
    sampling: { temperature: 0.8 },
    kl: { coef: 0.05 },
    minibatches: 3, // an odd number of updates per step: the trainer's current buffers alternate between steps
    seed: 11,
    ...over,
  });
}

/** Timings differ between engines; every other metric must agree. */
const TIMINGS = new Set(['generation_ms', 'scoring_ms', 'rewards_ms', 'training_ms', 'host_ms', 'step_ms']);

function expectSameMetrics(a: GrpoStepMetrics, b: GrpoStepMetrics): void {
  expect(Object.keys(a).sort()).toEqual(Object.keys(b).sort());
  for (const [k, v] of Object.entries(a) as [string, number][]) {
    if (TIMINGS.has(k)) continue;
    const w = (b as unknown as Record<string, number>)[k];
    if (Number.isNaN(v)) expect([k, w]).toEqual([k, NaN]);
    else expect([k, Math.abs(v - w) <= 1e-4 * Math.max(1, Math.abs(v))]).toEqual([k, true]);
  }
}

test("'kv-cache' and 'graph' rollouts: the same tokens, metrics and updates from the same seed", async () => {
  const model = tinyModel(V, { headDim: 16, std: 0.5, seed: 9 });
  const [kv, graph] = (['kv-cache', 'graph'] as const).map((generationEngine) => make(model, { generationEngine }));
  expect([kv.generationEngine, graph.generationEngine]).toEqual(['kv-cache', 'graph']);
  // 3 prompts, then 4 (the KV engine is rebuilt with more rows), then 4 again (the same engine,
  // rebound to the buffers the last update wrote)
  for (const [step, n] of [[0, 3], [1, 4], [2, 4]]) {
    const a = await kv.step(prompts(step, n), 0.05);
    const b = await graph.step(prompts(step, n), 0.05);
    expect(a.rollouts.map((r) => [r.tokens, r.stopped])).toEqual(b.rollouts.map((r) => [r.tokens, r.stopped]));
    expect(a.rollouts.some((r) => r.stopped) && a.rollouts.some((r) => !r.stopped)).toBe(true);
    expect(a.metrics.reward_std).toBeGreaterThan(0);
    expectSameMetrics(a.metrics, b.metrics);
    expect(a.metrics.logp_parity).toBeCloseTo(1, 4);
  }
  const [sa, sb] = [kv.snapshot(), graph.snapshot()];
  let worst = 0;
  for (const [name, v] of sa.values) v.forEach((x, i) => (worst = Math.max(worst, Math.abs(x - sb.values.get(name)![i]))));
  expect(worst).toBeLessThan(1e-5);
  // the greedy runner uses the chosen engine too
  const ps = prompts(3, 4);
  const [ga, gb] = [await kv.generateGreedy(ps), await graph.generateGreedy(ps)];
  expect(ga.map(({ tokens, text, stopped }) => ({ tokens, text, stopped }))).toEqual(gb.map(({ tokens, text, stopped }) => ({ tokens, text, stopped })));
  // the log-probs come from two different graphs: equal up to float32 rounding, whose size the CPU's kernels
  // (ONNX Runtime's AVX2 or AVX-512 code) set; a wrong position or mask moves them by far more
  ga.forEach((c, i) => c.logprobs!.forEach((x, t) => expect(Math.abs(x - gb[i].logprobs![t])).toBeLessThan(1e-4)));
  kv.dispose();
  graph.dispose();
});

test("LoRA: the KV engine's weights (base + scale·B·A, materialised once per weight version) give the graph engine's rollouts", async () => {
  const model = tinyModel(V, { headDim: 16, std: 0.5, seed: 5 });
  const lora = { rank: 2, alpha: 4, targets: 'q_proj|v_proj|gate_proj' };
  const [kv, graph] = (['kv-cache', 'graph'] as const).map((generationEngine) => make(model, { generationEngine, lora }));
  // step 0 samples from the base (B = 0); steps 1 and 2 from base + the updated adapters
  for (const step of [0, 1, 2]) {
    const a = await kv.step(prompts(step, 4), 0.2);
    const b = await graph.step(prompts(step, 4), 0.2);
    expect(a.rollouts.map((r) => r.tokens)).toEqual(b.rollouts.map((r) => r.tokens));
    expectSameMetrics(a.metrics, b.metrics);
  }
  kv.dispose();
  graph.dispose();
});

test("the default engine, and an explicit 'kv-cache' where GroupQueryAttention cannot run (the choice itself: rollout's engine-choice test)", () => {
  const narrow = tinyModel(8); // head_dim 8
  expect(() => make(narrow, { generationEngine: 'kv-cache' })).toThrow("generationEngine 'kv-cache' cannot run this model: head_dim 8 is not a multiple of 16 (GroupQueryAttention's rotary needs one); use 'graph'");
  expect(() => make(narrow, { generationEngine: 'fast' as GenerationEngine })).toThrow(/generationEngine must be 'auto', 'kv-cache' or 'graph', got 'fast'/);
  const byDefault = make(narrow);
  expect(byDefault.generationEngine).toBe('graph');
  byDefault.dispose();
  const wide = make(tinyModel(8, { headDim: 16 }));
  expect(wide.generationEngine).toBe('kv-cache');
  wide.dispose();
});

test('an out-of-memory past what splitting a run fixes rebuilds the KV engine with half the prompts per run; the samples are unchanged', async () => {
  const model = tinyModel(V, { headDim: 16, std: 0.5, seed: 9 });
  const device = Device.cpu();
  const tensorsBefore = device.memory().tensors;
  const trainable = paramSpecs(model.config).map((s) => ({ name: s.name, shape: s.shape, decay: false }));
  const pw = { trainable, weights: (_g: L.Graph, t: Map<string, L.Tensor>) => castWeights(t, 'float32') };
  const bound = trainable.map((p) => [p.name, device.upload({ data: model.weights.get(p.name)!, dims: p.shape })] as const);
  const ids = promptIds.map((p) => [...p]);
  const call = { maxNewTokens: 5, stopIds: [3], seed: 7, keys: [0, 1, 2, 3], weightsVersion: 0 };
  const computeWeights: ComputeWeights[] = [];
  const runner = (beforeRun?: (phase: 'prefill' | 'decode', prompts: number, rows: number) => void) => {
    const weights = new ComputeWeights(device, model.config, pw, 'float32');
    computeWeights.push(weights);
    return KvGenerationRunner.create(device, model.config, { groupSize: 4, sampling: { temperature: 0.8 }, padId: 0, weights, beforeRun });
  };
  const plain = runner();
  const expected = await plain.generate([bound], ids, call);
  // Decode steps over more than 4 rows (one prompt's group) "run out of memory".
  const decodeRows: number[] = [];
  const tight = runner((phase, _p, rows) => {
    if (phase !== 'decode') return;
    decodeRows.push(rows);
    if (rows > 4) throw new Error('Failed to allocate memory for requested buffer (simulated)');
  });
  expect((await tight.generate([bound], ids, call)).map((c) => c.tokens)).toEqual(expected.map((c) => c.tokens));
  expect(tight.shrinks).toBe(2); // 16 → 8 → 4 rows
  expect(new Set(decodeRows)).toEqual(new Set([16, 8, 4]));
  // one group's rows still failing: the error propagates, as does any other error
  const never = runner((phase) => { if (phase === 'decode') throw new Error('CUDA_ERROR_OUT_OF_MEMORY (simulated)'); });
  await expect(never.generate([bound], ids, call)).rejects.toThrow(/OUT_OF_MEMORY/);
  const other = runner(() => { throw new Error('not memory'); });
  await expect(other.generate([bound], ids, call)).rejects.toThrow('not memory');
  for (const r of [plain, tight, never, other]) r.dispose();
  for (const w of computeWeights) w.dispose();
  for (const [, t] of bound) t.dispose();
  expect(device.memory().tensors).toBe(tensorsBefore); // the failed runs freed what they built
});

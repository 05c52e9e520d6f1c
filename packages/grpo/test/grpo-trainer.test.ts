/**
 * GrpoTrainer end to end on tiny random Qwen3s (CPU): generation and training log-probs agree
 * (generation vs re-scoring, and the update each gives), generation reads the updated weights
 * with no copy, the frozen reference, LoRA, reward failures, dynamic sampling, and learning with
 * every built-in estimator; flash attention against composed; step metrics against values computed
 * outside the trainer.
 */
import * as L from '@lathe/onnx';
import { decoder, lmLogits, paddedCausalMask, paramSpecs, positionsFromPadding, weightInputs } from '@lathe/models';
import { compile } from '../../../tools/testing/ort-cpu';
import { addGeneration } from '@lathe/rollout';
import { Device } from '@lathe/runtime';
import { castWeights } from '@lathe/train';
import { classmateScorer, combineRewards, ESTIMATOR_NAMES, GrpoTrainer, type EstimatorName, type GrpoTrainerOptions, type RewardFailure, type RlPrompt } from '@lathe/grpo';
import { tinyModel } from './tiny-qwen3';

interface Meta {
  answer: number;
}
type Opts = GrpoTrainerOptions<Meta>;

/** One-token task: prompt token p must be answered by ANSWERS[p] (chance 1/8). */
const ANSWERS = [5, 7, 3, 2];
const V = 8;
const exact = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'correct', fn: (_p, c, m) => (c === String(m.answer) ? 1 : 0) }], { fallback: 0 });
const tokenizer = { decode: (ids: readonly number[]) => ids.join(' '), padId: 0 };
const prompts = (step: number): RlPrompt<Meta>[] => ANSWERS.map((answer, p) => ({ ids: [p], text: String(p), meta: { answer }, key: step * ANSWERS.length + p, index: p }));

function make(overrides: Partial<Opts> = {}, model = tinyModel(V)): GrpoTrainer<Meta> {
  return GrpoTrainer.create<Meta>({
    model: model.lm,
    tokenizer,
    stopIds: [],
    rewards: exact,
    groupSize: 8,
    maxNewTokens: 1,
    loss: { aggregation: 'seq-mean-token-mean', clipHigh: 0.28 },
    minibatches: 2,
    ...overrides,
  });
}

/** Runs steps until the last 3 batches all score ≥ 0.9 (or `max` steps); returns each step's mean reward. */
async function train(t: GrpoTrainer<Meta>, lr: number, max = 60): Promise<number[]> {
  const mean: number[] = [];
  for (let s = 0; s < max; s++) {
    const { metrics } = await t.step(prompts(s), lr);
    mean.push(metrics.reward_mean);
    expect(metrics.logp_parity).toBeCloseTo(1, 4);
    if (mean.length >= 3 && mean.slice(-3).every((m) => m >= 0.9)) break;
  }
  return mean;
}

const maxAbsDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);

test('generation log-probs equal the training policy’s re-scoring (prompts of different lengths in right-padded rows, groups, temperature, stop ids, 2 layers)', async () => {
  const model = tinyModel(24, { layers: 2, std: 0.5, seed: 9 });
  const t = make({ groupSize: 4, maxNewTokens: 6, stopIds: [3], sampling: { temperature: 0.7 } }, model);
  const ps: RlPrompt<Meta>[] = [[5], [9, 1, 4], [13, 6], [20, 21, 22, 23]].map((ids, i) => ({ ids, text: '', meta: { answer: 0 }, key: i }));
  const batch = await t.sample(ps);
  expect(batch.rows).toBe(16);
  expect(batch.lengths.some((n) => n < 6)).toBe(true); // some rows stopped early
  // every row is its prompt then its completion from column 0, padding only after: rows of many lengths
  const rowLengths = batch.promptLengths.map((p, r) => p + batch.lengths[r]);
  expect(new Set(rowLengths).size).toBeGreaterThan(2);
  for (let r = 0; r < batch.rows; r++) {
    const mask = Array.from(batch.attentionMask.subarray(r * batch.width, (r + 1) * batch.width), Number);
    expect(mask).toEqual(mask.map((_m, c) => (c < rowLengths[r] ? 1 : 0)));
    expect(Array.from(batch.inputIds.subarray(r * batch.width, r * batch.width + batch.promptLengths[r]), Number)).toEqual(ps[Math.floor(r / 4)].ids);
  }
  const { parity } = await t.rescore(batch);
  console.log(`parity over ${batch.lengths.reduce((a, b) => a + b)} tokens: mean exp|Δ| = ${parity.mean}, max |Δ| = ${parity.maxAbs.toExponential(2)}`);
  expect(parity.mean).toBeGreaterThanOrEqual(1);
  expect(parity.mean).toBeLessThan(1 + 1e-5);
  expect(parity.maxAbs).toBeLessThan(1e-4);
  t.dispose();
});

test('a step on generation log-probs and a step on re-scored log-probs give the same update', async () => {
  const model = tinyModel(V);
  const [gen, rescore] = (['generation', 'rescore'] as const).map((oldLogprobs) => make({ oldLogprobs, epochs: 2, kl: { coef: 0.05 } }, model));
  for (let s = 0; s < 3; s++) {
    const a = await gen.step(prompts(s), 0.03);
    const b = await rescore.step(prompts(s), 0.03);
    expect(a.rollouts.map((r) => r.tokens)).toEqual(b.rollouts.map((r) => r.tokens));
    expect(a.metrics.loss).toBeCloseTo(b.metrics.loss, 5);
    expect(a.metrics.logp_parity).toBeCloseTo(1, 5);
    expect(b.metrics.logp_parity).toBeCloseTo(1, 5);
    expect(b.metrics.logp_max_abs_diff).toBeLessThan(1e-5);
  }
  const [sa, sb] = [gen.snapshot(), rescore.snapshot()];
  for (const [name, v] of sa.values) expect([name, maxAbsDiff(v, sb.values.get(name)!)]).toEqual([name, expect.any(Number)]);
  const worst = Math.max(...[...sa.values].map(([name, v]) => maxAbsDiff(v, sb.values.get(name)!)));
  expect(worst).toBeLessThan(1e-5);
  gen.dispose();
  rescore.dispose();
});

test('flash attention in scoring and training gives the composed attention’s steps (prompts and responses of different lengths, KL to the reference, entropy)', async () => {
  const model = tinyModel(24, { layers: 2, std: 0.5, seed: 9 });
  const ps = (s: number): RlPrompt<Meta>[] => [[5], [9, 1, 4], [13, 6]].map((ids, i) => ({ ids, text: '', meta: { answer: 0 }, key: s * 3 + i }));
  const firstToken = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'odd', fn: (_p, c) => Number(c.split(' ')[0]) % 2 }], { fallback: 0 });
  const common: Partial<Opts> = { groupSize: 4, maxNewTokens: 5, stopIds: [3], rewards: firstToken, kl: { coef: 0.05 }, loss: { aggregation: 'token-mean', entropyCoef: 0.01 } };
  const [composed, flash] = (['composed', 'flash'] as const).map((attention) => make({ ...common, attention }, model));
  for (let s = 0; s < 2; s++) {
    const a = await composed.step(ps(s), 0.03);
    const b = await flash.step(ps(s), 0.03);
    expect(b.rollouts.map((r) => r.tokens)).toEqual(a.rollouts.map((r) => r.tokens));
    expect(new Set(a.rollouts.map((r) => r.tokens.length)).size).toBeGreaterThan(1);
    // float32 rounding of two attention kernels: relative 1e-4
    for (const k of ['loss', 'kl_ref', 'entropy', 'grad_norm', 'logp_parity'] as const) expect([k, Math.abs(b.metrics[k] - a.metrics[k]) <= 1e-4 * Math.max(1, Math.abs(a.metrics[k]))]).toEqual([k, true]);
  }
  // Adam divides by √v: entries with near-zero gradients move by up to lr on rounding alone, so the
  // weights agree to 1e-4 (0.3 % of the 0.03 step), not to float32 epsilon.
  const [sa, sb] = [composed.snapshot(), flash.snapshot()];
  expect(Math.max(...[...sa.values].map(([name, v]) => maxAbsDiff(v, sb.values.get(name)!)))).toBeLessThan(1e-4);
  expect(() => make({ attention: 'fast' as never }, model)).toThrow(/attention must be 'auto', 'composed' or 'flash', got fast/);
  // 'auto' (the default) is composed attention on the CPU: the same step, bit for bit.
  const auto = make({ ...common }, model);
  const again = make({ ...common, attention: 'composed' }, model);
  const [x, y] = [await auto.step(ps(0), 0.03), await again.step(ps(0), 0.03)];
  const untimed = (m: object) => Object.entries(m).filter(([k]) => !k.endsWith('_ms') && k !== 'tokens_per_s');
  expect(untimed(x.metrics)).toEqual(untimed(y.metrics));
  for (const t of [composed, flash, auto, again]) t.dispose();
});

test('micro-batches change nothing: 4 micro-batches per minibatch give the update of 1 (responses of different lengths)', async () => {
  const model = tinyModel(V);
  const firstToken = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'first', fn: (_p, c, m) => (c.split(' ')[0] === String(m.answer) ? 1 : 0) }], { fallback: 0 });
  const common: Partial<Opts> = { rewards: firstToken, maxNewTokens: 3, stopIds: [1], loss: { aggregation: 'seq-mean-token-mean' }, kl: { coef: 0.05 }, epochs: 2 };
  const [one, four] = [1, 4].map((microBatches) => make({ ...common, microBatches }, model));
  for (let s = 0; s < 2; s++) {
    const a = await one.step(prompts(s), 0.03);
    const b = await four.step(prompts(s), 0.03);
    expect(new Set(a.rollouts.map((r) => r.tokens.length)).size).toBeGreaterThan(1);
    expect(b.metrics.loss).toBeCloseTo(a.metrics.loss, 5);
    expect(b.metrics.clip_fraction).toBeCloseTo(a.metrics.clip_fraction, 6);
  }
  const [sa, sb] = [one.snapshot(), four.snapshot()];
  expect(Math.max(...[...sa.values].map(([name, v]) => maxAbsDiff(v, sb.values.get(name)!)))).toBeLessThan(1e-5);
  one.dispose();
  four.dispose();
});

test('the next step generates from the weights the last update wrote (bound buffers, no copy)', async () => {
  const model = tinyModel(V);
  const t = make({}, model);
  await train(t, 0.03, 6);
  const snap = t.snapshot();
  expect(maxAbsDiff(snap.model.get('model.embed_tokens.weight')!, model.weights.get('model.embed_tokens.weight')!)).toBeGreaterThan(1e-3);
  // independent truth: a separately compiled greedy generation fed the snapshot's weights from the host
  const g = new L.Graph('check');
  const inputs = new Map(paramSpecs(model.config).map((s) => [s.name, g.input(s.name, 'float32', s.shape)] as const));
  addGeneration(g, model.config, castWeights(inputs, 'float32'), { temperature: 0 });
  const session = Device.cpu().compile(g);
  const b = session.binding();
  for (const s of paramSpecs(model.config)) b.input(s.name, { data: snap.model.get(s.name)!, dims: s.shape });
  const ps = prompts(0);
  b.input('input_ids', { data: BigInt64Array.from(ps.map((p) => BigInt(p.ids[0]))), dims: [ps.length, 1] })
    .input('attention_mask', { data: BigInt64Array.from(ps.map(() => 1n)), dims: [ps.length, 1] })
    .input('max_new_tokens', { data: BigInt64Array.from([3n]), dims: [] })
    .input('stop_ids', { data: BigInt64Array.from([-1n]), dims: [1] })
    .output('tokens', 'host');
  await b.run();
  const expected = Array.from(b.fetch('tokens').data as BigInt64Array, Number);
  b.dispose();
  session.dispose();
  // a trainer resumed from the snapshot (3 new tokens), and the trainer that took the steps (its
  // bound buffers are the updated ones): both generate what the independent session does
  const resumed = make({ maxNewTokens: 3, resume: { params: snap.values, m: snap.m, v: snap.v, optimizerStep: snap.optimizerStep, rlStep: snap.rlStep } }, model);
  expect((await resumed.generateGreedy(ps)).flatMap((c) => c.tokens)).toEqual(expected);
  expect((await t.generateGreedy(ps)).map((c) => c.tokens[0])).toEqual(expected.filter((_x, i) => i % 3 === 0));
  resumed.dispose();
  t.dispose();
});

test.each(ESTIMATOR_NAMES.map((n) => [n]))('%s through GrpoTrainer: reward rises from chance to ≥ 0.9', async (name) => {
  const t = make({
    estimator: name as EstimatorName,
    kl: name === 'reinforce_pp_baseline' ? { coef: 0.01, mode: 'reward' } : undefined,
    loss: { aggregation: name === 'dr_grpo' ? 'token-sum-norm' : 'token-mean', clipHigh: 0.28 },
    // PPO's estimator reads a value model (packages/grpo/test/ppo.test.ts tests it in depth)
    ...(name === 'gae' ? { valueModel: { lrScale: 3 } } : {}),
    // the separated estimator reads a classmate source (one-token completions have no CoT; λ 0 keeps the step's reward the base one)
    ...(name === 'grpo_main_classmate_separated' ? { rewards: classmateScorer(exact, { weight: 0, classmates: [{ name: 'echo', continueTexts: async (texts, k) => texts.map(() => new Array<string>(k).fill('')) }] }) } : {}),
  });
  // ReMax's greedy baseline gives no signal once a prompt's samples all equal its greedy answer, and PPO's whitened
  // token advantages collapse the policy onto a wrong answer at the larger step: a smaller step keeps exploring
  const mean = await train(t, name === 'remax' || name === 'gae' ? 0.01 : 0.03);
  console.log(`${name}: ${mean.length} steps, mean reward ${mean[0].toFixed(2)} → ${mean.at(-1)!.toFixed(2)}`);
  expect(mean[0]).toBeLessThan(0.4);
  expect(mean.slice(-3).every((m) => m >= 0.9)).toBe(true);
  t.dispose();
});

test.each([['cispo'], ['reinforce']] as const)('policy term %s through GrpoTrainer: reward rises from chance to ≥ 0.9', async (policyTerm) => {
  const t = make({ loss: { policyTerm, clipHigh: 0.28 } });
  const mean = await train(t, 0.03);
  console.log(`${policyTerm}: ${mean.length} steps, mean reward ${mean[0].toFixed(2)} → ${mean.at(-1)!.toFixed(2)}`);
  expect(mean[0]).toBeLessThan(0.4);
  expect(mean.slice(-3).every((m) => m >= 0.9)).toBe(true);
  t.dispose();
});

test('adaptive KL (reward mode): reward still rises; β grows while the KL is above target, by verl\'s rule; a resumed trainer continues from it', async () => {
  const t = make({ estimator: 'reinforce_pp_baseline', kl: { coef: 0.01, mode: 'reward', target: 1e-4, horizon: 256 } });
  const betas: number[] = [];
  const mean: number[] = [];
  for (let s = 0; s < 60 && !(mean.length >= 3 && mean.slice(-3).every((m) => m >= 0.9)); s++) {
    const { metrics } = await t.step(prompts(s), 0.03);
    betas.push(metrics.kl_coef);
    mean.push(metrics.reward_mean);
  }
  console.log(`adaptive KL: ${mean.length} steps, mean reward ${mean[0].toFixed(2)} → ${mean.at(-1)!.toFixed(2)}, β ${betas[0]} → ${betas.at(-1)!.toFixed(4)}`);
  expect(mean.slice(-3).every((m) => m >= 0.9)).toBe(true);
  expect(betas[0]).toBe(0.01);
  // the KL (k1) sits far above 1e-4 once the policy moves: each step multiplies β by 1 + 0.2 · samples / horizon
  const samples = 8 * ANSWERS.length;
  expect(betas.at(-1)! / betas.at(-2)!).toBeCloseTo(1 + (0.2 * samples) / 256, 10);
  const snap = t.snapshot();
  expect(snap.klCoef).toBeCloseTo(betas.at(-1)! * (1 + (0.2 * samples) / 256), 10);
  const resumed = make({ estimator: 'reinforce_pp_baseline', kl: { coef: 0.01, mode: 'reward', target: 1e-4, horizon: 256 }, resume: { params: snap.values, m: snap.m, v: snap.v, optimizerStep: snap.optimizerStep, rlStep: snap.rlStep, klCoef: snap.klCoef } });
  expect((await resumed.step(prompts(99), 0.03)).metrics.kl_coef).toBe(snap.klCoef);
  expect(() => make({ kl: { coef: 0.01, target: 0.1 } })).toThrow(/kl.target .* needs kl.mode 'reward'/);
  t.dispose();
  resumed.dispose();
});

test('KL to the frozen reference: 0 at the start, growing as the policy moves; the reference never changes', async () => {
  const t = make({ kl: { coef: 0.02 } });
  const kls: number[] = [];
  for (let s = 0; s < 8; s++) kls.push((await t.step(prompts(s), 0.03)).metrics.kl_ref);
  expect(kls[0]).toBeCloseTo(0, 6);
  expect(kls.at(-1)!).toBeGreaterThan(0.05);
  t.dispose();
});

test('LoRA: adapters start at the base (KL 0), learn, and the reference is the base itself', async () => {
  // LoRA cannot train the norms or the tied embedding: a larger init gives the logits room to separate
  const model = tinyModel(V, { std: 0.4 });
  const t = make({ lora: { rank: 4, alpha: 8, targets: 'q_proj|v_proj|up_proj|down_proj' }, kl: { coef: 0.001 } }, model);
  expect(t.trainable.every((p) => p.name.includes('lora_'))).toBe(true);
  const mean: number[] = [];
  let firstKl = NaN;
  for (let s = 0; s < 60 && !(mean.length >= 3 && mean.slice(-3).every((m) => m >= 0.9)); s++) {
    const { metrics } = await t.step(prompts(s), 0.03);
    if (s === 0) firstKl = metrics.kl_ref;
    expect(metrics.logp_parity).toBeCloseTo(1, 4);
    mean.push(metrics.reward_mean);
  }
  console.log(`LoRA: ${mean.length} steps, mean reward ${mean[0].toFixed(2)} → ${mean.at(-1)!.toFixed(2)}`);
  expect(firstKl).toBeCloseTo(0, 6);
  expect(mean.slice(-3).every((m) => m >= 0.9)).toBe(true);
  // the adapters merged into the base on the host give the model the sessions run
  const snap = t.snapshot();
  expect([...snap.values.keys()].every((k) => k.includes('lora_'))).toBe(true);
  expect(maxAbsDiff(snap.model.get('model.layers.0.mlp.down_proj.weight')!, model.weights.get('model.layers.0.mlp.down_proj.weight')!)).toBeGreaterThan(1e-3);
  expect(snap.model.get('model.embed_tokens.weight')).toEqual(model.weights.get('model.embed_tokens.weight'));
  t.dispose();
});

test('a reward function that throws or returns NaN: counted per source, reported with the prompt, replaced by the fallback', async () => {
  const failures: RewardFailure[] = [];
  const rewards = combineRewards<Meta & { completionTokens: number; stopped: boolean }>(
    [
      { name: 'correct', fn: (_p, c, m) => (c === String(m.answer) ? 1 : 0) },
      {
        name: 'flaky',
        weight: 0.5,
        fn: (p) => {
          if (p === '1') throw new Error('grader crashed');
          return p === '2' ? NaN : 1;
        },
      },
    ],
    { fallback: -1, onFailure: (f) => failures.push(f) },
  );
  const t = make({ rewards });
  const { metrics, rollouts } = await t.step(prompts(0), 0.01);
  expect(metrics['reward/flaky/failures']).toBe(16);
  expect(metrics['reward/correct/failures']).toBe(0);
  expect(metrics.reward_failures).toBe(16);
  expect(failures.filter((f) => f.kind === 'threw' && f.prompt === '1')).toHaveLength(8);
  expect(failures.filter((f) => f.kind === 'non-finite' && f.prompt === '2')).toHaveLength(8);
  expect(rollouts.filter((r) => r.promptText === '1').every((r) => r.bySource.flaky === -1)).toBe(true);
  expect(metrics['reward/flaky/mean']).toBeCloseTo((16 * 1 + 16 * -1) / 32, 6);
  t.dispose();
});

test('dynamic sampling drops groups with all-equal rewards and samples more prompts until the batch is full', async () => {
  // prompt 3's reward is always 1: its group is uniform and dropped
  const rewards = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'r', fn: (p, c, m) => (p === '3' ? 1 : c === String(m.answer) ? 1 : 0) }], { fallback: 0 });
  const t = make({ rewards, dynamicSampling: { maxRounds: 4 } });
  let asked = 0;
  const { metrics } = await t.step((round) => {
    asked++;
    return prompts(10 + round);
  }, 0.01);
  expect(metrics.dropped_groups).toBeGreaterThanOrEqual(1);
  expect(metrics.sampling_rounds).toBe(asked);
  expect(metrics.sampling_rounds).toBeGreaterThan(1);
  expect(metrics.prompts).toBe(4);
  expect(metrics.uniform_groups).toBe(0);
  t.dispose();
});

test('bad options are refused by name', () => {
  expect(() => make({ sampling: { temperature: 0 } })).toThrow(/sampling.temperature must be > 0/);
  expect(() => make({ oldLogprobs: 'generation', sampling: { topK: 3 } })).toThrow(/use 'rescore'/);
  expect(() => make({ minibatches: 0 })).toThrow(/minibatches must be a positive integer/);
});

test('the entropy metric: from re-scoring when the loss does not read it, equal to the train step’s own pass', async () => {
  const model = tinyModel(24, { layers: 2, std: 0.5, seed: 3 });
  const opts: Partial<Opts> = { groupSize: 4, maxNewTokens: 5, sampling: { temperature: 0.9 }, optimizer: { weightDecay: 0 } };
  // entropyCoef 0: the train step has no entropy pass; an entropy bonus puts it back in the step
  const scored = make(opts, model);
  const inStep = make({ ...opts, loss: { aggregation: 'seq-mean-token-mean', clipHigh: 0.28, entropyCoef: 1e-9 } }, model);
  expect(scored.trainer.batchGraph.outputs.map((o) => o.name)).not.toContain('entropy_sum');
  expect(inStep.trainer.batchGraph.outputs.map((o) => o.name)).toContain('entropy_sum');
  // learning rate 0: every update sees π_old, so the step's mean over updates is π_old's entropy
  const [a, b] = [await scored.step(prompts(0), 0), await inStep.step(prompts(0), 0)];
  expect(a.rollouts.map((r) => r.tokens)).toEqual(b.rollouts.map((r) => r.tokens));
  expect(a.metrics.entropy).toBeGreaterThan(0.5);
  expect(Math.abs(a.metrics.entropy - b.metrics.entropy)).toBeLessThan(1e-5);
  scored.dispose();
  inStep.dispose();
});

/** Groups (of the rollouts, in order) whose rewards are all equal: counted here, independently of the trainer. */
function uniformGroupsOf(rollouts: readonly { reward: number }[], G: number): number[] {
  const out: number[] = [];
  for (let k = 0; k * G < rollouts.length; k++) {
    const rs = rollouts.slice(k * G, (k + 1) * G).map((r) => r.reward);
    if (rs.every((r) => r === rs[0])) out.push(k);
  }
  return out;
}

test.each([['loss'], ['reward']] as const)('KL as a %s: a group whose outcome rewards are all equal gets zero advantage and is counted', async (mode) => {
  // prompt 3's reward is always 1: its group is uniform in outcome; the KL penalty (kl mode 'reward')
  // differs per completion once the policy has moved, which must not make the group look informative
  const rewards = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'r', fn: (p, c, m) => (p === '3' ? 1 : c === String(m.answer) ? 1 : 0) }], { fallback: 0 });
  const t = make({ rewards, kl: { coef: 0.5, mode } });
  for (let s = 0; s < 3; s++) {
    const { metrics, rollouts } = await t.step(prompts(s), 0.05);
    const uniform = uniformGroupsOf(rollouts, 8);
    expect(uniform).toContain(3);
    expect(metrics.uniform_groups).toBe(uniform.length);
    for (const k of uniform) expect(rollouts.slice(k * 8, (k + 1) * 8).map((r) => r.advantage)).toEqual(new Array(8).fill(0));
    expect(metrics.zero_advantage_fraction).toBeGreaterThanOrEqual(uniform.length / 4);
    // after the first update the policy has left the reference: the penalty is not 0 (the case the check is for)
    if (s > 0) expect(metrics.kl_ref).toBeGreaterThan(1e-4);
  }
  t.dispose();
});

test('ReMax: a greedy baseline whose reward throws or is NaN is counted and replaced by the fallback', async () => {
  type RMeta = Meta & { completionTokens: number; stopped: boolean };
  const correct = (c: string, m: RMeta) => (c === String(m.answer) ? 1 : 0);
  const failures: RewardFailure[] = [];
  // the same source, failing only when it scores the greedy completions (the batch of one per prompt)
  const greedyBatch = combineRewards<RMeta>(
    [
      {
        name: 'correct',
        fn: (p, c, m) => {
          if (p === '1') throw new Error('grader crashed');
          return p === '2' ? NaN : correct(c, m);
        },
      },
    ],
    { fallback: -1, onFailure: (f) => failures.push(f) },
  );
  const sampled = combineRewards<RMeta>([{ name: 'correct', fn: (_p, c, m) => correct(c, m) }], { fallback: -1 });
  const t = make({ estimator: 'remax', rewards: (samples) => (samples.length === ANSWERS.length ? greedyBatch(samples) : sampled(samples)) });
  // independent truth: the greedy completions of the weights the step samples from, graded here
  const greedy = (await t.generateGreedy(prompts(0))).map((c, p) => correct(c.text, { answer: ANSWERS[p], completionTokens: 1, stopped: false }));
  const { metrics, rollouts } = await t.step(prompts(0), 0.01);
  expect(failures.map((f) => [f.prompt, f.kind])).toEqual([
    ['1', 'threw'],
    ['2', 'non-finite'],
  ]);
  expect(metrics.reward_failures).toBe(2);
  expect(metrics['reward/correct/failures']).toBe(2);
  // A = r − r_greedy, with the fallback −1 as the failed prompts' baseline
  const baseline = [greedy[0], -1, -1, greedy[3]];
  expect(rollouts.map((r) => r.advantage)).toEqual(rollouts.map((r, i) => r.reward - baseline[Math.floor(i / 8)]));
  t.dispose();
});

test('dynamic sampling: a shortfall after the last round is reported as dynamic_sampling_shortfall', async () => {
  // prompts 2 and 3 always score 1 (uniform, dropped); prompts 0 and 1 score the sampled token id, which
  // differs within a group of 8 samples: each round yields exactly 2 informative groups of the 4 wanted
  const rewards = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'r', fn: (p, c) => (p === '2' || p === '3' ? 1 : Number(c)) }], { fallback: 0 });
  const run = async (maxRounds: number) => {
    const t = make({ rewards, dynamicSampling: { maxRounds } });
    const { metrics } = await t.step((round) => prompts(20 + round), 0.01);
    t.dispose();
    return metrics;
  };
  const short = await run(1);
  expect([short.sampling_rounds, short.dropped_groups, short.prompts, short.samples, short.dynamic_sampling_shortfall]).toEqual([1, 2, 2, 16, 2]);
  const full = await run(3); // the second round fills the batch
  expect([full.sampling_rounds, full.dropped_groups, full.prompts, full.dynamic_sampling_shortfall]).toEqual([2, 4, 4, 0]);
  // without dynamic sampling nothing is dropped and nothing is short
  const t = make({ rewards });
  const plain = await t.step(prompts(20), 0.01);
  expect([plain.metrics.prompts, plain.metrics.uniform_groups, plain.metrics.dynamic_sampling_shortfall]).toEqual([4, 2, 0]);
  t.dispose();
});

test('step metrics against values computed outside the trainer: entropy, response length, truncation', async () => {
  const model = tinyModel(24, { layers: 2, std: 0.5, seed: 5 });
  const tau = 0.8;
  const ps: RlPrompt<Meta>[] = [[5], [9, 1, 4], [13, 6]].map((ids, i) => ({ ids, text: '', meta: { answer: 0 }, key: i }));
  const t = make({ groupSize: 4, maxNewTokens: 4, stopIds: [3], sampling: { temperature: tau }, minibatches: 1 }, model);
  const { metrics, rollouts } = await t.step(ps, 0.01);
  t.dispose();
  // The policy's logits before the update, from a separate composed decoder graph over each row.
  const g = new L.Graph('logits');
  const { weights, inputs } = weightInputs(g, model.config, 'float32', 'float32');
  const ids = g.input('input_ids', 'int64', [1, 'T']);
  const mask = g.input('attention_mask', 'int64', [1, 'T']);
  const { hidden } = decoder(model.config, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  g.output(lmLogits(model.config, weights, hidden), 'logits');
  const run = await compile(g);
  const feeds = Object.fromEntries([...inputs.keys()].map((n) => [n, { data: model.weights.get(n)!, dims: paramSpecs(model.config).find((s) => s.name === n)!.shape }]));
  let entropySum = 0;
  let tokens = 0;
  for (const r of rollouts) {
    const prompt = ps[Math.floor(rollouts.indexOf(r) / 4)].ids;
    const row = [...prompt, ...r.tokens];
    const out = await run({ ...feeds, input_ids: { data: BigInt64Array.from(row.map(BigInt)), dims: [1, row.length] }, attention_mask: { data: BigInt64Array.from(row.map(() => 1n)), dims: [1, row.length] } });
    const l = out.logits.data as Float32Array;
    const V = 24;
    // positions prompt.length − 1 … row.length − 2 predict the response tokens
    for (let pos = prompt.length - 1; pos < row.length - 1; pos++) {
      const z = Array.from(l.subarray(pos * V, (pos + 1) * V), (x) => x / tau);
      const m = Math.max(...z);
      const logZ = m + Math.log(z.reduce((a, x) => a + Math.exp(x - m), 0));
      entropySum += -z.reduce((a, x) => a + Math.exp(x - logZ) * (x - logZ), 0);
      tokens++;
    }
  }
  expect(tokens).toBe(rollouts.reduce((n, r) => n + r.tokens.length, 0));
  expect(metrics.entropy).toBeCloseTo(entropySum / tokens, 5);
  expect(metrics.response_length_mean).toBeCloseTo(tokens / rollouts.length, 10);
  expect(metrics.truncated_fraction).toBeCloseTo(rollouts.filter((r) => !r.stopped).length / rollouts.length, 10);
  expect(new Set(rollouts.map((r) => r.tokens.length)).size).toBeGreaterThan(1); // a meaningful mix
});

/**
 * Learning, shown on CPU with the commands' own recipes: `runRmTrain` on the demo task's preference
 * set (preference-task.ts: the true sum of "a+b=", a, b < 5, preferred to any other answer) takes the
 * built-in tiny model's held-out pairwise accuracy from chance to ≥ 0.95 and saves a Hugging Face
 * sequence-classification checkpoint that `RewardModel` loads and `runRmEval` scores; then
 * `runGrpo` with that reward model as its only trained reward (`--reward_weights correct=0` keeps
 * exact match as a logged, untrained source: the independent truth) raises both the policy's reward
 * model score and how often its samples are right, in each of three seeds.
 */
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readMetrics, readParquet } from '@lathe/data';
import { readSafetensorsHeader } from '@lathe/models';
import { RewardModel } from '@lathe/reward-models';
import { additionTokenizer, defaults, grpoSchema, rmEvalSchema, rmTrainSchema, runGrpo, runRmEval, runRmTrain } from '@lathe/recipes';
import { writeAdditionTask } from './preference-task';

const root = mkdtempSync(join(tmpdir(), 'lathe-rm-learning-'));
const task = writeAdditionTask(root);
let rewardModel = '';

test('lathe rm train: held-out pairwise accuracy from chance to ≥ 0.95; the checkpoint is a sequence-classification folder that rm eval scores', async () => {
  const t0 = performance.now();
  const result = await runRmTrain({ ...defaults(rmTrainSchema), data: task.pairs, run_dir: join(root, 'rm'), steps: 200, batch_size: 32, lr: 3e-3, schedule: 'cosine', eval_examples: 40, eval_every: 50, log_every: 50, save_every: 0 });
  const seconds = (performance.now() - t0) / 1000;
  const [before, after] = [result.evals[0], result.evals.at(-1)!];
  console.log(`rm train: held-out accuracy ${before.accuracy.toFixed(3)} → ${after.accuracy.toFixed(3)} (margin ${before.margin.toFixed(3)} → ${after.margin.toFixed(3)}) in ${result.steps} steps, ${seconds.toFixed(1)} s`);
  expect([before.step, before.pairs, after.step]).toEqual([0, 40, 200]);
  expect(Math.abs(before.accuracy - 0.5)).toBeLessThan(0.2);
  expect(after.accuracy).toBeGreaterThanOrEqual(0.95);

  // a Hugging Face sequence-classification folder: one label, a score head, no LM head
  rewardModel = result.checkpoint;
  const config = JSON.parse(readFileSync(join(rewardModel, 'config.json'), 'utf8')) as { architectures: string[]; id2label: object; pad_token_id: number };
  expect(config.architectures).toEqual(['Qwen3ForSequenceClassification']);
  expect(Object.keys(config.id2label)).toHaveLength(1);
  expect(config.pad_token_id).toBe(additionTokenizer().padId);
  const names = readSafetensorsHeader(join(rewardModel, 'model.safetensors')).tensors.map((t) => t.name);
  expect(names).toContain('score.weight');
  expect(names).not.toContain('lm_head.weight');

  // the held-out rewards the run logged are what the saved model scores (independently encoded here)
  const rows = readFileSync(join(root, 'rm', 'eval', 'step-00000200.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { prompt: string; chosen: string; rejected: string; chosen_reward: number; rejected_reward: number; correct: boolean });
  const rm = await RewardModel.fromPretrained(rewardModel, { device: 'cpu' });
  const tok = additionTokenizer();
  const seqs = rows.flatMap((r) => [r.chosen, r.rejected].map((response) => [tok.bosId, ...tok.encode(r.prompt), ...tok.encode(response), tok.eosId]));
  const T = Math.max(...seqs.map((s) => s.length));
  const ids = BigInt64Array.from(seqs.flatMap((s) => [...s, ...new Array(T - s.length).fill(tok.padId)].map(BigInt)));
  const mask = BigInt64Array.from(seqs.flatMap((s) => [...s.map(() => 1n), ...new Array(T - s.length).fill(0n)]));
  const scores = await rm.score({ inputIds: { data: ids, dims: [seqs.length, T] }, attentionMask: { data: mask, dims: [seqs.length, T] } });
  rows.forEach((r, i) => {
    expect(scores[2 * i]).toBeCloseTo(r.chosen_reward, 4);
    expect(scores[2 * i + 1]).toBeCloseTo(r.rejected_reward, 4);
    expect(r.correct).toBe(r.chosen_reward > r.rejected_reward);
  });
  rm.dispose();

  // lathe rm eval: every pair scored, the same rewards for the same pairs, a Parquet file
  const output = join(root, 'scores.parquet');
  const summary = await runRmEval({ ...defaults(rmEvalSchema), model: rewardModel, tokenizer: 'builtin:addition', data: task.pairs, output });
  const table = await readParquet(output);
  expect([summary.pairs, table.numRows]).toEqual([300, 300]);
  const column = (name: string) => Array.from(table.getChild(name)!.toArray() as ArrayLike<unknown>);
  const [prompt, chosen, rejected, chosenReward, rejectedReward, correct] = ['prompt', 'chosen', 'rejected', 'chosen_reward', 'rejected_reward', 'correct'].map(column);
  expect(summary.accuracy).toBeCloseTo(correct.filter(Boolean).length / 300, 6);
  expect(correct).toEqual(chosenReward.map((c, i) => (c as number) > (rejectedReward[i] as number)));
  for (const r of rows) {
    const i = prompt.findIndex((p, k) => p === r.prompt && chosen[k] === r.chosen && rejected[k] === r.rejected);
    expect(chosenReward[i] as number).toBeCloseTo(r.chosen_reward, 4);
  }
  expect(existsSync(`${output}.tmp-${process.pid}`)).toBe(false);
}, 120_000);

test("lathe grpo with the learned reward model as its only trained reward, 3 seeds: the policy's reward model score rises, and its true accuracy from about chance to above any constant answer's", async () => {
  expect(rewardModel).not.toBe('');
  const t0 = performance.now();
  const mean = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;
  const runs: { untrained: number; trained: number; rm: [number, number] }[] = [];
  for (const seed of [0, 1, 2]) {
    const run_dir = join(root, `grpo-${seed}`);
    await runGrpo({
      ...defaults(grpoSchema),
      data: task.prompts,
      tokenizer: 'builtin:addition',
      run_dir,
      reward_model: rewardModel,
      // exact match is computed and logged (reward/correct/mean), not trained on
      reward_weights: 'correct=0',
      steps: 100,
      prompts_per_step: 12,
      group_size: 16,
      max_new_tokens: 1,
      eval_examples: 0,
      lr: 4e-3,
      // the KL to the random start keeps the policy sampling while it learns which sum goes with which prompt (without it, it collapses onto '4' and '5')
      kl_coef: 0.4,
      epochs: 2,
      n_minibatches: 2,
      save_every: 0,
      seed,
    });
    const steps = readMetrics(join(run_dir, 'metrics.jsonl')).filter((m) => 'reward/rm/mean' in m);
    expect(steps).toHaveLength(100);
    // the trained reward is the reward model's alone (the KL is a loss term, not a reward)
    for (const m of steps) expect(m.reward_mean as number).toBeCloseTo(m['reward/rm/mean'] as number, 4);
    const of = (xs: typeof steps, key: string) => mean(xs.map((m) => m[key] as number));
    // step 1's rollouts are sampled before any update: the untrained policy's accuracy
    runs.push({ untrained: steps[0]['reward/correct/mean'] as number, trained: of(steps.slice(-10), 'reward/correct/mean'), rm: [of(steps.slice(0, 5), 'reward/rm/mean'), of(steps.slice(-10), 'reward/rm/mean')] });
  }
  const seconds = (performance.now() - t0) / 1000;
  const [untrained, trained] = [mean(runs.map((r) => r.untrained)), mean(runs.map((r) => r.trained))];
  const each = runs.map((r, seed) => `seed ${seed}: rm score ${r.rm[0].toFixed(2)} → ${r.rm[1].toFixed(2)}, samples right ${r.untrained.toFixed(3)} → ${r.trained.toFixed(3)}`);
  console.log(`grpo on the reward model (untrained: step 1's samples; trained: the last 10 of 100 steps):\n${each.join('\n')}\nmean samples right ${untrained.toFixed(3)} → ${trained.toFixed(3)}, ${seconds.toFixed(1)} s`);
  for (const r of runs) {
    expect(r.rm[1] - r.rm[0]).toBeGreaterThan(2);
    // above 0.2, the most one answer for every prompt gets (5 of the 25 sums are 4): each policy answers by its prompt
    expect(r.trained).toBeGreaterThan(0.25);
  }
  expect(untrained).toBeLessThan(0.15); // about chance: 1 in 13 single-token answers
  expect(trained).toBeGreaterThanOrEqual(0.35);
  expect(trained).toBeGreaterThan(4 * untrained);
}, 300_000);

test('lathe grpo --reward none: prompts without answers, the reward model as the reward, held-out evaluation by its score; without any reward it is an error', async () => {
  expect(rewardModel).not.toBe('');
  const prompts = join(root, 'no-answers.jsonl');
  writeFileSync(prompts, ['1+2=', '3+1=', '2+2=', '0+4=', '4+3=', '1+1=', '2+3=', '3+3='].map((p) => JSON.stringify({ prompt: p })).join('\n') + '\n');
  const cfg = { ...defaults(grpoSchema), data: prompts, tokenizer: 'builtin:addition', reward: 'none' as const, reward_model: rewardModel, steps: 2, prompts_per_step: 4, group_size: 4, max_new_tokens: 1, eval_examples: 2, kl_coef: 0, save_every: 0 };
  const result = await runGrpo({ ...cfg, run_dir: join(root, 'grpo-none') });
  expect(result.steps).toBe(2);
  const evals = readMetrics(join(root, 'grpo-none', 'metrics.jsonl')).filter((m) => 'eval_reward_mean' in m);
  expect(evals.map((m) => m.step)).toEqual([0, 2]);
  expect(result.evals.map((e) => [Number.isNaN(e.accuracy), e.reward_mean])).toEqual(evals.map((m) => [true, m.eval_reward_mean]));
  // the evaluation's score is the reward model's own score of each greedy completion
  const rows = readFileSync(join(root, 'grpo-none', 'eval', 'step-00000002.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { reward: number });
  expect(rows.reduce((s, r) => s + r.reward, 0) / rows.length).toBeCloseTo(result.evals[1].reward_mean!, 6);
  await expect(runGrpo({ ...cfg, reward_model: '', run_dir: join(root, 'grpo-none-2') })).rejects.toThrow('--reward none: give the reward another way (--reward_model, --reward_fn or --format_reward)');
  // with the default reward the answer field is required, named
  await expect(runGrpo({ ...cfg, reward: 'exact' as const, run_dir: join(root, 'grpo-none-3') })).rejects.toThrow(/no field 'answer'/);
}, 120_000);

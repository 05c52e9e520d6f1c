/**
 * The preference recipes' machinery on the built-in tiny model (no learning here: rm-learning and
 * dpo-learning show that): an interrupted and resumed `lathe rm train` (LoRA) and `lathe dpo` equal
 * uninterrupted runs, the DPO reference log-probs read back from the run directory; skipped pairs
 * counted; bad input named (file and row, flag); and `lathe grpo`'s reward sources — a user
 * function from a file combined with weights, bad `--reward_fn` / `--reward_weights` /
 * `--reward_model` values, and a reward model that returns NaN refusing the step.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readMetrics } from '@lathe/data';
import { SCORE_WEIGHT } from '@lathe/models';
import { RewardModel } from '@lathe/reward-models';
import { defaults, dpoSchema, grpoSchema, REFERENCE_LOGPS_FILE, rmEvalSchema, rmTrainSchema, runDpo, runGrpo, runRmEval, runRmTrain, type DpoRunConfig, type GrpoConfig, type RmTrainConfig } from '@lathe/recipes';
import { writeAdditionTask } from './preference-task';

const root = mkdtempSync(join(tmpdir(), 'lathe-preference-runs-'));
const task = writeAdditionTask(root);
const small = { data: task.pairs, steps: 4, batch_size: 8, eval_examples: 8, eval_every: 2, save_every: 2, keep_last: 5, log_every: 1, lr: 1e-3 };
const rmConfig = (run: string, over: Partial<RmTrainConfig> = {}): RmTrainConfig => ({ ...defaults(rmTrainSchema), ...small, run_dir: join(root, run), ...over });
const dpoConfig = (run: string, over: Partial<DpoRunConfig> = {}): DpoRunConfig => ({ ...defaults(dpoSchema), ...small, run_dir: join(root, run), ...over });
const grpoConfig = (run: string, over: Partial<GrpoConfig> = {}): GrpoConfig => ({
  ...defaults(grpoSchema),
  data: task.prompts,
  tokenizer: 'builtin:addition',
  run_dir: join(root, run),
  steps: 2,
  prompts_per_step: 4,
  group_size: 4,
  max_new_tokens: 2,
  eval_examples: 4,
  save_every: 0,
  ...over,
});

/** Two checkpoints hold byte-identical weights, adapters, AdamW moments and state. */
function expectSameCheckpoint(a: string, b: string) {
  for (const f of ['model.safetensors', 'optimizer.safetensors', 'adapter_model.safetensors', 'trainer_state.json']) {
    expect([f, existsSync(join(b, f))]).toEqual([f, existsSync(join(a, f))]);
    if (existsSync(join(a, f))) expect([f, readFileSync(join(b, f)).equals(readFileSync(join(a, f)))]).toEqual([f, true]);
  }
}

/** metrics.jsonl without its timings. */
const metricsOf = (run: string) => readMetrics(join(root, run, 'metrics.jsonl')).map((m) => Object.fromEntries(Object.entries(m).filter(([k]) => !/_ms$|per_s$/.test(k))));

let loraRewardModel = '';

test('rm train with LoRA: stopped after step 2 (as Ctrl-C does) and resumed equals 4 steps straight; the checkpoint loads as a reward model', async () => {
  const lora = { lora_rank: 4, lora_alpha: 8 };
  const straight = await runRmTrain(rmConfig('rm-straight', lora));
  const controller = new AbortController();
  const first = await runRmTrain(rmConfig('rm-resumed', lora), { onStep: (m) => m.step === 2 && controller.abort() }, controller.signal);
  expect([first.steps, first.interrupted]).toEqual([2, true]);
  const second = await runRmTrain(rmConfig('rm-resumed', { ...lora, resume: true }));
  expect(second.steps).toBe(4);
  expectSameCheckpoint(straight.checkpoint, second.checkpoint);
  expect(existsSync(join(second.checkpoint, 'adapter_model.safetensors'))).toBe(true);
  expect(metricsOf('rm-resumed')).toEqual(metricsOf('rm-straight'));
  expect(metricsOf('rm-straight').filter((m) => 'eval_accuracy' in m).map((m) => m.step)).toEqual([0, 2, 4]);
  // the adapters are merged into a plain sequence-classification folder
  loraRewardModel = second.checkpoint;
  const rm = await RewardModel.fromPretrained(loraRewardModel, { device: 'cpu' });
  const ids = { data: BigInt64Array.from([1n, 3n, 12n, 4n, 13n, 6n, 2n]), dims: [1, 7] };
  const [reward] = await rm.score({ inputIds: ids, attentionMask: { data: new BigInt64Array(7).fill(1n), dims: [1, 7] } });
  expect(Number.isFinite(reward)).toBe(true);
  rm.dispose();
}, 60_000);

test('rm train --quantize_base nf4 (QLoRA): the losses track LoRA over the dense base, the checkpoint holds adapters and a dense merged model; without --lora_rank it is refused', async () => {
  const lora = { lora_rank: 4, lora_alpha: 8, save_every: 0 };
  const qlora = await runRmTrain(rmConfig('rm-qlora', { ...lora, quantize_base: 'nf4' }));
  const losses = (run: string) => readMetrics(join(root, run, 'metrics.jsonl')).filter((m) => 'loss' in m).map((m) => m.loss as number);
  const [q, dense] = [losses('rm-qlora'), losses('rm-straight')];
  expect(q).toHaveLength(dense.length);
  // NF4 moves the base's outputs a little, never by much: each loss within 5 % of LoRA's over the float32 base, and not identical to it
  for (const [i, l] of q.entries()) expect(Math.abs(l - dense[i]) / dense[i]).toBeLessThan(0.05);
  expect(q).not.toEqual(dense);
  expect(existsSync(join(qlora.checkpoint, 'adapter_model.safetensors'))).toBe(true);
  const rm = await RewardModel.fromPretrained(qlora.checkpoint, { device: 'cpu' });
  expect(rm.config.hiddenSize).toBeGreaterThan(0);
  rm.dispose();
  await expect(runRmTrain(rmConfig('rm-qlora-no-lora', { quantize_base: 'nf4' }))).rejects.toThrow(/--quantize_base nf4 trains LoRA adapters over a frozen quantized base: set --lora_rank > 0/);
}, 60_000);

test('dpo: stopped after step 2 and resumed equals 4 steps straight; the resume reads the cached reference log-probs', async () => {
  const straight = await runDpo(dpoConfig('dpo-straight'));
  const controller = new AbortController();
  await runDpo(dpoConfig('dpo-resumed'), { onStep: (m) => m.step === 2 && controller.abort() }, controller.signal);
  expect(existsSync(join(root, 'dpo-resumed', REFERENCE_LOGPS_FILE))).toBe(true);
  // another β would train a different run: refused, naming the key
  await expect(runDpo(dpoConfig('dpo-resumed', { resume: true, beta: 0.5 }))).rejects.toThrow(/--resume: the config differs from the checkpoint's .* in beta: 0.1 → 0.5; pass --force/);
  let cached: boolean | undefined;
  const second = await runDpo(dpoConfig('dpo-resumed', { resume: true, keep_last: 3 }), { onStart: (i) => (cached = i.referenceCached) });
  expect(cached).toBe(true);
  expectSameCheckpoint(straight.checkpoint, second.checkpoint);
  expect(metricsOf('dpo-resumed')).toEqual(metricsOf('dpo-straight'));
  // the policy is saved as a causal LM
  expect(JSON.parse(readFileSync(join(second.checkpoint, 'config.json'), 'utf8')).architectures).toEqual(['Qwen3ForCausalLM']);
}, 60_000);

test('skipped pairs are counted; bad data and options are errors naming the file and row or the flag', async () => {
  const file = join(root, 'mixed.jsonl');
  writeFileSync(
    file,
    [
      { prompt: '1+1=', chosen: '2', rejected: '3' },
      { prompt: '1+1=', chosen: '2', rejected: '2' }, // identical as read
      { prompt: '1+2=', chosen: '<think>x</think>3', rejected: '<think>y</think>3' }, // identical once thinking is stripped
      { prompt: '1+2=', chosen: '3', rejected: '4444444444444' }, // over max_length
      ...Array.from({ length: 6 }, (_, i) => ({ prompt: `${i}+0=`, chosen: String(i), rejected: String(i + 1) })),
    ]
      .map((r) => JSON.stringify(r))
      .join('\n'),
  );
  let skipped: unknown;
  await runRmTrain(rmConfig('skips', { data: file, steps: 1, eval_examples: 2, max_length: 10, save_every: 0 }), { onStart: (i) => (skipped = i.skipped) });
  expect(skipped).toEqual({ overLength: 1, identical: 2 });

  await expect(runRmTrain(rmConfig('too-long', { max_length: 4 }))).rejects.toThrow(/--max_length 4: the training pairs of .*pairs.jsonl: no usable preference pair among \d+: \d+ longer than max_length 4/);
  await expect(runRmTrain(rmConfig('no-margin', { margin: true }))).rejects.toThrow(/pairs.jsonl:\d+: no 'margin' field \(--margin reads one from every pair\)/);
  await expect(runRmTrain(rmConfig('no-data', { data: join(root, 'missing.jsonl') }))).rejects.toThrow(/--data .*missing.jsonl: no such file/);
  await expect(runDpo(dpoConfig('dpo-on-rm', { model: loraRewardModel, tokenizer: 'builtin:addition' }))).rejects.toThrow(/--model .* is a reward model \(Qwen3ForSequenceClassification\); DPO trains a causal LM/);
  const causal = join(root, 'rm-straight', 'base-model');
  await expect(runRmEval({ ...defaults(rmEvalSchema), model: causal, tokenizer: 'builtin:addition', data: task.pairs, output: join(root, 'x.parquet') })).rejects.toThrow(/--model .*base-model: .*causal LM checkpoint with no score head/);
  await expect(runRmEval({ ...defaults(rmEvalSchema), model: loraRewardModel, data: task.pairs, output: join(root, 'x.parquet') })).rejects.toThrow(/--tokenizer model: no tokenizer.json in .*uses --tokenizer builtin:addition/);
}, 60_000);

test("grpo: a user's reward function from a file, weighted with the grader; each source's mean logged per step", async () => {
  const file = join(root, 'my-rewards.ts');
  writeFileSync(file, 'export const longer = (_prompt: string, completion: string): number => completion.length;\nexport const notAFunction = 3;\n');
  await runGrpo(grpoConfig('grpo-fn', { reward_fn: `${file}#longer`, reward_weights: 'correct=2,longer=0.5' }));
  const steps = readMetrics(join(root, 'grpo-fn', 'metrics.jsonl')).filter((m) => 'reward_mean' in m);
  expect(steps).toHaveLength(2);
  for (const m of steps) {
    const [correct, longer] = [m['reward/correct/mean'] as number, m['reward/longer/mean'] as number];
    expect(longer).toBeGreaterThanOrEqual(0);
    expect(m.reward_mean as number).toBeCloseTo(2 * correct + 0.5 * longer, 5);
  }
}, 60_000);

test('grpo: bad --reward_fn, --reward_weights and --reward_model values are named; a reward model that returns NaN refuses the step', async () => {
  const file = join(root, 'my-rewards.ts');
  await expect(runGrpo(grpoConfig('bad-1', { reward_fn: join(root, 'nope.ts#f') }))).rejects.toThrow(/--reward_fn .*nope.ts#f: no file .*nope.ts/);
  await expect(runGrpo(grpoConfig('bad-2', { reward_fn: `${file}#shorter` }))).rejects.toThrow(/--reward_fn .*my-rewards.ts#shorter: .*my-rewards.ts has no export 'shorter' \(its function exports: longer\)/);
  await expect(runGrpo(grpoConfig('bad-3', { reward_fn: `${file}#notAFunction` }))).rejects.toThrow(/export 'notAFunction' of .*my-rewards.ts is a number, not a function/);
  await expect(runGrpo(grpoConfig('bad-4', { reward_weights: 'rm=1' }))).rejects.toThrow("--reward_weights: this run has no reward source 'rm' (its sources: correct)");
  await expect(runGrpo(grpoConfig('bad-5', { reward_weights: 'correct=high' }))).rejects.toThrow("--reward_weights: 'correct=high' is not source=weight with a finite number");
  await expect(runGrpo(grpoConfig('bad-6', { reward_model: join(root, 'rm-straight', 'base-model') }))).rejects.toThrow(/--reward_model .*base-model: .*Qwen3ForCausalLM is a causal LM checkpoint with no score head/);
  await expect(runGrpo(grpoConfig('bad-7', { reward_model: loraRewardModel, enable_thinking: true }))).rejects.toThrow(/--reward_model .*: the reward model was trained with --enable_thinking false, this run has --enable_thinking true/);

  // a reward model whose head holds NaN: the first step is refused, named, with the weights before it saved
  const broken = await RewardModel.fromPretrained(loraRewardModel);
  const weights = broken.float32Weights();
  weights.set(SCORE_WEIGHT, new Float32Array(weights.get(SCORE_WEIGHT)!.length).fill(NaN));
  const nanModel = join(root, 'nan-rm');
  mkdirSync(nanModel);
  RewardModel.fromWeights(broken.config, weights).save(nanModel);
  await expect(runGrpo(grpoConfig('grpo-nan', { reward_model: nanModel, eval_examples: 0 }))).rejects.toThrow(
    /step 1: reward 'rm': reward model: non-finite rewards for rows 0, 1, .* of 16 .*; the weights before this step are saved in .*grpo-nan.*step-00000000/,
  );
}, 60_000);

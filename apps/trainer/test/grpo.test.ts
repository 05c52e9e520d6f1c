/**
 * `lathe grpo` on the built-in tiny model (random weights: these tests check the run's machinery,
 * not learning — packages/grpo's tests and the demo show learning): help text, YAML + flags, the
 * run directory (config, metrics, rollouts in SQLite, evaluations, checkpoints), exact resume after
 * an interruption, a changed config refused unless forced, a prompt set smaller than a step; and
 * the plumbing of options into the trainer: LoRA (adapters, exact resume), epochs, the sampling
 * filters, the overlong reward, the math grader with the format reward, and exact resume under
 * dynamic sampling.
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { readEvalRollouts, readMetrics, readTrainRollouts } from '@lathe/data';
import { CausalLM } from '@lathe/models';
import { loadCheckpoint } from '@lathe/train';
import { GrpoTrainer } from '@lathe/grpo';
import { grpoSchema, runGrpo, type GrpoConfig } from '@lathe/recipes';
import { configFromArgv } from '../src/config-flags';
import { smallGrpo } from './small-grpo';

const root = mkdtempSync(join(tmpdir(), 'lathe-grpo-cli-'));
const small = (run: string, over: Partial<GrpoConfig> = {}): GrpoConfig => smallGrpo(root, run, over);

test('config: defaults ← YAML ← flags, errors name the source and key', () => {
  const file = join(root, 'grpo.yaml');
  writeFileSync(file, 'group_size: 4\nkl_coef: 0.1\nestimator: rloo\n');
  const cfg = configFromArgv(grpoSchema, { config: file, kl_coef: 0.2 });
  expect([cfg.group_size, cfg.kl_coef, cfg.estimator, cfg.clip_low]).toEqual([4, 0.2, 'rloo', 0.2]);
  writeFileSync(file, 'estimator: ppo\n');
  expect(() => configFromArgv(grpoSchema, { config: file })).toThrow(/grpo.yaml: option 'estimator' must be one of grpo, dr_grpo/);
  expect(() => configFromArgv(grpoSchema, { n_minibatches: 0 })).toThrow(/option 'n_minibatches' must be ≥ 1/);
});

test('a run writes its config, metrics, rollouts (SQLite) and evaluations; an interrupted run resumes exactly', async () => {
  // the reference: 4 steps straight through
  const straight = await runGrpo(small('straight'));
  expect(straight.steps).toBe(4);
  const dir = join(root, 'straight');
  expect(parseYaml(readFileSync(join(dir, 'config.yaml'), 'utf8'))).toEqual(small('straight'));
  const metrics = readMetrics(join(dir, 'metrics.jsonl'));
  const steps = metrics.filter((m) => 'reward_mean' in m);
  expect(steps.map((m) => m.step)).toEqual([1, 2, 3, 4]);
  for (const m of steps) {
    for (const k of ['reward/correct/mean', 'reward/correct/std', 'kl_ref', 'clip_fraction', 'entropy', 'response_length_mean', 'generation_ms', 'scoring_ms', 'training_ms', 'rewards_ms', 'host_ms']) expect([k, typeof m[k]]).toEqual([k, 'number']);
    expect(m.logp_parity as number).toBeCloseTo(1, 4);
    expect(m.updates).toBe(2);
  }
  expect(metrics.filter((m) => 'eval_accuracy' in m).map((m) => m.step)).toEqual([0, 2, 4]);
  const train = readTrainRollouts(join(dir, 'rollouts.sqlite'));
  expect(train).toHaveLength(4 * 4 * 4);
  expect(new Set(train.map((r) => r.step))).toEqual(new Set([1, 2, 3, 4]));
  expect((train[0].extra as { tokens: number[] }).tokens.length).toBeGreaterThan(0);
  expect(readEvalRollouts(join(dir, 'rollouts.sqlite'), { dataset: 'heldout' })).toHaveLength(3 * 8);

  // the same run stopped after step 2 (as Ctrl-C does), then resumed
  const controller = new AbortController();
  const first = await runGrpo(small('resumed'), { onStep: (m) => m.step === 2 && controller.abort() }, controller.signal);
  expect([first.steps, first.interrupted]).toEqual([2, true]);
  const second = await runGrpo(small('resumed', { resume: true }));
  expect(second.steps).toBe(4);
  const a = loadCheckpoint(straight.checkpoint);
  const b = loadCheckpoint(second.checkpoint);
  expect(b.state).toEqual(a.state);
  for (const [name, v] of a.values) expect([name, Buffer.from(b.values.get(name)!.buffer).equals(Buffer.from(v.buffer))]).toEqual([name, true]);
  for (const [name, v] of a.m) expect([name, Buffer.from(b.m.get(name)!.buffer).equals(Buffer.from(v.buffer))]).toEqual([name, true]);
  const rows = (run: string) => readTrainRollouts(join(root, run, 'rollouts.sqlite'), { minStep: 3 }).map((r) => [r.step, r.prompt_index, r.rollout_index, r.completion, r.reward, r.advantage]);
  expect(rows('resumed')).toEqual(rows('straight'));
  const losses = (run: string) => readMetrics(join(root, run, 'metrics.jsonl')).filter((m) => 'loss' in m && m.step > 2).map((m) => [m.step, m.loss, m.reward_mean]);
  expect(losses('resumed')).toEqual(losses('straight'));
}, 60_000);

test('eval_sampled: mean@G on the held-out prompts in metrics and SQLite, without changing what is trained', async () => {
  const plain = await runGrpo(small('eval-plain', { steps: 2 }));
  const sampled = await runGrpo(small('eval-sampled', { steps: 2, eval_sampled: true }));
  expect(sampled.evals.map((e) => e.step)).toEqual([0, 2]);
  for (const e of sampled.evals) {
    expect(e.sampled_accuracy).toBeGreaterThanOrEqual(0);
    expect(e.sampled_accuracy).toBeLessThanOrEqual(1);
  }
  const rows = readEvalRollouts(join(root, 'eval-sampled', 'rollouts.sqlite'), { dataset: 'heldout-sampled' });
  expect(rows).toHaveLength(2 * 8 * 4); // evaluations × held-out prompts × group size
  expect(rows.filter((r) => r.step === 2).reduce((n, r) => n + (r.correct ? 1 : 0), 0) / 32).toBeCloseTo(sampled.evals[1].sampled_accuracy!, 10);
  const m = readMetrics(join(root, 'eval-sampled', 'metrics.jsonl')).filter((x) => 'eval_sampled_accuracy' in x);
  expect(m.map((x) => x.step)).toEqual([0, 2]);
  // evaluation samples on streams of their own: the trained weights are bit-identical
  const a = loadCheckpoint(plain.checkpoint);
  const b = loadCheckpoint(sampled.checkpoint);
  for (const [name, v] of a.values) expect([name, Buffer.from(b.values.get(name)!.buffer).equals(Buffer.from(v.buffer))]).toEqual([name, true]);
}, 60_000);

test('a resume with a changed config is refused, naming the keys, unless --force; bookkeeping keys may change', async () => {
  const cfg = small('changed', { steps: 2 });
  await runGrpo(cfg);
  await expect(runGrpo({ ...cfg, resume: true, steps: 3, kl_coef: 0.1 })).rejects.toThrow(/differs from the checkpoint's .* in kl_coef: 0.04 → 0.1, steps: 2 → 3; pass --force/);
  await expect(runGrpo({ ...cfg, resume: false })).rejects.toThrow(/already holds checkpoints: pass --resume/);
  const forced = await runGrpo({ ...cfg, resume: true, force: true, steps: 3, kl_coef: 0.1, eval_every: 0, log_every: 5 });
  expect(forced.steps).toBe(3);
  const state = loadCheckpoint(forced.checkpoint, GrpoTrainer.trainableParams(loadCheckpoint(forced.checkpoint).config)).state as { optimizerStep?: number };
  expect(state.optimizerStep).toBe(6); // 3 RL steps × 2 minibatches
}, 60_000);

test('a prompt set smaller than a step is an error naming --prompts_per_step', async () => {
  const data = join(root, 'few.jsonl');
  writeFileSync(data, ['1+1=', '2+2=', '3+3=', '4+4=', '5+5='].map((p, i) => JSON.stringify({ question: p, solution: String(2 * (i + 1)) })).join('\n') + '\n');
  const cfg = small('few', { data, prompt_field: 'question', answer_field: 'solution', eval_examples: 2 });
  await expect(runGrpo(cfg)).rejects.toThrow(/--prompts_per_step 4 needs at least that many training prompts; .*few.jsonl has 3 after holding out --eval_examples 2/);
  await expect(runGrpo({ ...cfg, answer_field: 'answer' })).rejects.toThrow(/few.jsonl:1: no field 'answer' \(the row has 'question', 'solution'; the reference answer: see --answer_field\)/);
  const ok = await runGrpo({ ...cfg, prompts_per_step: 3, steps: 2, eval_every: 0 }); // 3 prompts per step cycle through the 3 training prompts, reshuffled each epoch
  expect(ok.steps).toBe(2);
  const seen = readTrainRollouts(join(root, 'few', 'rollouts.sqlite')).map((r) => r.prompt);
  expect(new Set(seen.slice(0, 12)).size).toBe(3);
}, 60_000);

test('--lora_rank: a LoRA run writes adapters over the unchanged base, and its resume continues exactly', async () => {
  const lora = (run: string, over: Partial<GrpoConfig> = {}) => small(run, { lora_rank: 4, lora_alpha: 8, steps: 2, eval_every: 0, ...over });
  const straight = await runGrpo(lora('lora'));
  // the adapter file's own header: 2 layers × 7 projections × (A [4, in], B [out, 4]), rank 4
  const file = readFileSync(join(straight.checkpoint, 'adapter_model.safetensors'));
  const header = JSON.parse(file.subarray(8, 8 + Number(file.readBigUInt64LE(0))).toString()) as Record<string, { shape: number[] }>;
  const adapters = Object.entries(header)
    .filter(([name]) => name !== '__metadata__')
    .map(([name, t]) => ({ name, shape: t.shape, decay: false }));
  expect(adapters).toHaveLength(2 * 7 * 2);
  for (const p of adapters) expect([p.name, /lora_A/.test(p.name) ? p.shape[0] : /lora_B/.test(p.name) ? p.shape[1] : NaN]).toEqual([p.name, 4]);
  const a = loadCheckpoint(straight.checkpoint, adapters);
  expect(a.lora).toBe(true);
  const base = (await CausalLM.fromPretrained(join(root, 'lora', 'base-model'))).float32Weights();
  // the adapters moved (B starts at 0), the merged model differs from the base only in adapted matrices
  expect([...a.values].some(([name, v]) => name.includes('lora_B') && v.some((x) => x !== 0))).toBe(true);
  expect(a.model.get('model.embed_tokens.weight')).toEqual(base.get('model.embed_tokens.weight'));
  expect(a.model.get('model.layers.0.self_attn.q_proj.weight')).not.toEqual(base.get('model.layers.0.self_attn.q_proj.weight'));

  const controller = new AbortController();
  const first = await runGrpo(lora('lora-resumed'), { onStep: (m) => m.step === 1 && controller.abort() }, controller.signal);
  expect([first.steps, first.interrupted]).toEqual([1, true]);
  const second = await runGrpo(lora('lora-resumed', { resume: true }));
  expect(second.steps).toBe(2);
  const b = loadCheckpoint(second.checkpoint, adapters);
  expect(b.state).toEqual(a.state);
  for (const [name, v] of a.values) expect([name, Buffer.from(b.values.get(name)!.buffer).equals(Buffer.from(v.buffer))]).toEqual([name, true]);
  for (const [name, v] of a.v) expect([name, Buffer.from(b.v.get(name)!.buffer).equals(Buffer.from(v.buffer))]).toEqual([name, true]);
  const rows = (run: string) => readTrainRollouts(join(root, run, 'rollouts.sqlite'), { minStep: 2 }).map((r) => [r.prompt_index, r.rollout_index, r.completion, r.reward, r.advantage]);
  expect(rows('lora-resumed')).toEqual(rows('lora'));
  // a full fine-tuning resume of a LoRA checkpoint is refused
  await expect(runGrpo(lora('lora-resumed', { resume: true, force: true, lora_rank: 0, steps: 3 }))).rejects.toThrow(/is a LoRA checkpoint but --lora_rank is 0/);
}, 60_000);

test('--epochs 2: twice the updates per step', async () => {
  const r = await runGrpo(small('epochs', { epochs: 2, steps: 2, eval_every: 0 }));
  const steps = readMetrics(join(root, 'epochs', 'metrics.jsonl')).filter((m) => 'updates' in m);
  expect(steps.map((m) => m.updates)).toEqual([4, 4]); // 2 epochs × 2 minibatches (the 1-epoch run above makes 2)
  expect((loadCheckpoint(r.checkpoint, GrpoTrainer.trainableParams(loadCheckpoint(r.checkpoint).config)).state as { optimizerStep?: number }).optimizerStep).toBe(8);
}, 60_000);

test('--top_k 1, --top_p ≈ 0 and --min_p 1 reach the sampler: every sample is the greedy completion, whatever the seed', async () => {
  // 4 prompts, each 4 times: the held-out split then shares prompts with the training set, so the
  // greedy evaluation before step 1 gives the greedy completion of the prompts step 1 samples
  const data = join(root, 'repeated.jsonl');
  const problems = ['12+34=', '5+6=', '70+8=', '9+90='];
  writeFileSync(data, problems.flatMap((p) => [0, 1, 2, 3].map(() => JSON.stringify({ prompt: p, answer: '0' }))).join('\n') + '\n');
  const model = join(root, 'sampler-0', 'base-model');
  const sampled = async (run: string, over: Partial<GrpoConfig>) => {
    await runGrpo(small(run, { data, eval_examples: 8, steps: 1, eval_every: 0, ...over }));
    const greedy = new Map(readFileSync(join(root, run, 'eval', 'step-00000000.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { prompt: string; generated: string }).map((e) => [e.prompt, e.generated]));
    const rollouts = readTrainRollouts(join(root, run, 'rollouts.sqlite'));
    expect(rollouts).toHaveLength(16);
    return { greedy, rollouts };
  };
  // the first run makes the built-in model; the others (other seeds: other prompts, splits and noise) load it
  const runs = [
    await sampled('sampler-0', { top_k: 1, seed: 0 }),
    await sampled('sampler-1', { model, tokenizer: 'builtin:addition', top_p: 1e-6, seed: 1 }),
    await sampled('sampler-2', { model, tokenizer: 'builtin:addition', min_p: 1, seed: 2 }),
  ];
  const greedy = new Map(runs.flatMap((r) => [...r.greedy]));
  expect(greedy.size).toBe(problems.length);
  for (const r of runs) {
    for (const [p, g] of r.greedy) expect(greedy.get(p)).toBe(g); // one model: one greedy completion per prompt
    for (const x of r.rollouts) expect([x.prompt, x.completion]).toEqual([x.prompt, greedy.get(x.prompt)]);
  }
  // control: unfiltered sampling from the same model and seed does not give the greedy completions
  const free = await sampled('sampler-free', { model, tokenizer: 'builtin:addition', seed: 0 });
  expect(free.rollouts.filter((x) => x.completion !== greedy.get(x.prompt)).length).toBeGreaterThan(8);
}, 60_000);

test('--overlong_buffer adds the overlong reward source: 0 up to max_new_tokens − buffer, then down to −1', async () => {
  await runGrpo(small('overlong', { overlong_buffer: 2, steps: 1, eval_every: 0 }));
  const [m] = readMetrics(join(root, 'overlong', 'metrics.jsonl')).filter((x) => 'reward_mean' in x);
  for (const k of ['reward/overlong/mean', 'reward/overlong/std', 'reward/overlong/failures']) expect([k, typeof m[k]]).toEqual([k, 'number']);
  const rollouts = readTrainRollouts(join(root, 'overlong', 'rollouts.sqlite'));
  // max_new_tokens 4, buffer 2: lengths ≤ 2 → 0, 3 → −0.5, 4 → −1 (the stop token counts)
  const expected = rollouts.map((r) => [0, 0, 0, -0.5, -1][(r.extra as { tokens: number[] }).tokens.length]);
  expect(new Set(expected).size).toBeGreaterThan(1);
  expect(rollouts.map((r) => (r.extra as { rewards: Record<string, number> }).rewards.overlong)).toEqual(expected);
  expect(rollouts.map((r) => r.reward)).toEqual(rollouts.map((r, i) => (r.extra as { rewards: Record<string, number> }).rewards.correct + expected[i]));
  expect(m['reward/overlong/mean'] as number).toBeCloseTo(expected.reduce((a, b) => a + b, 0) / expected.length, 6);
}, 60_000);

test('--reward math with --format_reward: both sources reach the scorer and combine with their weights', async () => {
  await runGrpo(small('math-format', { reward: 'math', format_reward: 0.5, steps: 1, eval_every: 1 }));
  const [m] = readMetrics(join(root, 'math-format', 'metrics.jsonl')).filter((x) => 'reward_mean' in x);
  for (const k of ['reward/correct/mean', 'reward/format/mean', 'reward/format/failures']) expect([k, typeof m[k]]).toEqual([k, 'number']);
  const rollouts = readTrainRollouts(join(root, 'math-format', 'rollouts.sqlite'));
  expect(rollouts).toHaveLength(16);
  for (const r of rollouts) {
    const { correct, format } = (r.extra as { rewards: Record<string, number> }).rewards;
    // 4 new tokens cannot spell '…</think> <answer>…</answer>': the format reward is 0 for all
    expect(format).toBe(0);
    expect(r.reward).toBe(correct + 0.5 * format);
    // the math grader on a bare integer is numeric equality with the sum the prompt 'a+b=' asks for
    const [a, b] = r.prompt.replace('=', '').split('+').map(Number);
    if (/^\s*-?\d+\s*$/.test(r.completion)) expect([r.prompt, r.completion, correct]).toEqual([r.prompt, r.completion, Number(r.completion) === a + b ? 1 : 0]);
    else expect([0, 1]).toContain(correct);
  }
  expect(rollouts.filter((r) => /^\s*-?\d+\s*$/.test(r.completion)).length).toBeGreaterThan(0); // the check above ran
  const evals = readEvalRollouts(join(root, 'math-format', 'rollouts.sqlite'));
  expect(evals.length).toBeGreaterThan(0);
}, 60_000);

test('with --dynamic_sampling an interrupted run resumes exactly (the prompt stream moved by the extra rounds is restored)', async () => {
  const cfg = (run: string, over: Partial<GrpoConfig> = {}) => small(run, { dynamic_sampling: true, max_sampling_rounds: 3, eval_every: 0, overlong_buffer: 2, ...over }); // length-shaped rewards: the random model's correctness is all 0
  const straight = await runGrpo(cfg('dyn-straight'));
  const metrics = readMetrics(join(root, 'dyn-straight', 'metrics.jsonl')).filter((m) => 'reward_mean' in m);
  expect(metrics.some((m) => (m.sampling_rounds as number) > 1)).toBe(true); // extra rounds did consume prompts
  const controller = new AbortController();
  await runGrpo(cfg('dyn-resumed'), { onStep: (m) => m.step === 2 && controller.abort() }, controller.signal);
  const resumed = await runGrpo(cfg('dyn-resumed', { resume: true }));
  const [a, b] = [loadCheckpoint(straight.checkpoint), loadCheckpoint(resumed.checkpoint)];
  expect(b.state).toEqual(a.state);
  for (const [name, v] of a.values) expect([name, Buffer.from(b.values.get(name)!.buffer).equals(Buffer.from(v.buffer))]).toEqual([name, true]);
  const rows = (run: string) => readTrainRollouts(join(root, run, 'rollouts.sqlite'), { minStep: 3 }).map((r) => [r.step, r.prompt_index, r.completion, r.reward]);
  expect(rows('dyn-resumed')).toEqual(rows('dyn-straight'));
}, 60_000);

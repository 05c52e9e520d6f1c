/**
 * `lathe grpo` on the built-in tiny model (random weights: these tests check the run's machinery,
 * not learning — packages/grpo's tests and the demo show learning): help text, YAML + flags, the
 * run directory (config, metrics, rollouts in SQLite, evaluations, checkpoints), exact resume after
 * an interruption, a changed config refused unless forced, a prompt set smaller than a step.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { readEvalRollouts, readMetrics, readTrainRollouts } from '@lathe/data';
import { defaults } from '@lathe/data';
import { loadCheckpoint } from '@lathe/train';
import { GrpoTrainer, grpoSchema, runGrpo, type GrpoConfig } from '@lathe/grpo';
import { configFromArgv } from '../src/config-flags';

const root = mkdtempSync(join(tmpdir(), 'lathe-grpo-cli-'));
/** A small run: 4 prompts × 4 samples per step, 2 minibatches, KL to the reference. */
const small = (run: string, over: Partial<GrpoConfig> = {}): GrpoConfig => ({
  ...defaults(grpoSchema),
  run_dir: join(root, run),
  steps: 4,
  prompts_per_step: 4,
  group_size: 4,
  max_new_tokens: 4,
  eval_examples: 8,
  eval_every: 2,
  save_every: 2,
  keep_last: 5,
  n_minibatches: 2,
  lr: 1e-3,
  ...over,
});

test('lathe grpo --help lists every option of the schema with its help text and default', () => {
  const r = spawnSync(process.execPath, [join(__dirname, '..', 'bin', 'lathe.cjs'), 'grpo', '--help'], { encoding: 'utf8', timeout: 60_000 });
  expect(r.status).toBe(0);
  const squash = (s: string) => s.replace(/\s+/g, '');
  const text = squash(r.stdout);
  for (const [name, spec] of Object.entries(grpoSchema)) {
    expect(text).toContain(`--${name}`);
    expect(text).toContain(squash(spec.describe.slice(0, 30)));
    expect(text).toContain(squash(`[default: ${JSON.stringify(spec.default)}]`));
  }
}, 60_000);

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
  await expect(runGrpo({ ...cfg, answer_field: 'answer' })).rejects.toThrow(/row 1 has no 'answer' field/);
  const ok = await runGrpo({ ...cfg, prompts_per_step: 3, steps: 2, eval_every: 0 }); // 3 prompts per step cycle through the 3 training prompts, reshuffled each epoch
  expect(ok.steps).toBe(2);
  const seen = readTrainRollouts(join(root, 'few', 'rollouts.sqlite')).map((r) => r.prompt);
  expect(new Set(seen.slice(0, 12)).size).toBe(3);
}, 60_000);

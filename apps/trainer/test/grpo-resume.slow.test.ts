/**
 * `lathe grpo` and its run directory after a crash: --resume leaves metrics.jsonl, the rollout store
 * (SQLite) and eval/ equal to an uninterrupted run's (killed in process, and with kill -9 through
 * the CLI); a run that crashed before its first checkpoint is refused without --overwrite; a failed
 * run's built-in model is not reused; a missing prompt or answer field names the row's fields.
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readEvalRollouts, readMetrics, readTrainRollouts } from '@lathe/data';
import { loadCheckpoint } from '@lathe/train';
import { runGrpo, type GrpoConfig, type GrpoEvents } from '@lathe/recipes';
import { grpoMain } from '../src/commands/grpo';
import { smallGrpo } from './small-grpo';

const root = mkdtempSync(join(tmpdir(), 'lathe-grpo-resume-'));
const bin = join(__dirname, '..', 'bin', 'lathe.cjs');

const small = (run: string, over: Partial<GrpoConfig> = {}): GrpoConfig => smallGrpo(root, run, over);

/** Stands in for kill -9 when step `step` is reported: nothing after it is logged or saved. */
const crashAt = (step: number): GrpoEvents => ({
  onStep: (m) => {
    if (m.step === step) throw new Error('killed');
  },
});

/** A run's files as an uninterrupted run must match them: metrics without timings, rollouts without row ids and commit times, evaluations. */
function files(run: string) {
  const dir = join(root, run);
  const untimed = (m: Record<string, unknown>) => Object.fromEntries(Object.entries(m).filter(([k]) => !/_ms$/.test(k)));
  const row = <T extends { id: number; created_at: number }>({ id: _id, created_at: _at, ...rest }: T) => rest;
  return {
    metrics: readMetrics(join(dir, 'metrics.jsonl')).map(untimed),
    train: readTrainRollouts(join(dir, 'rollouts.sqlite')).map(row),
    evals: readEvalRollouts(join(dir, 'rollouts.sqlite')).map(row),
    evalFiles: Object.fromEntries(readdirSync(join(dir, 'eval')).map((f) => [f, readFileSync(join(dir, 'eval', f), 'utf8')])),
  };
}

let straight: Awaited<ReturnType<typeof runGrpo>>;
beforeAll(async () => {
  straight = await runGrpo(small('straight'));
}, 60_000);

test('after a crash, --resume leaves metrics.jsonl, the rollout store and eval/ equal to an uninterrupted run', async () => {
  // killed at step 4: step 3's metrics, steps 3–4's rollouts and step 4's evaluation came after the checkpoint of step 2
  await expect(runGrpo(small('crashed'), crashAt(4))).rejects.toThrow('killed');
  const before = files('crashed');
  expect(before.metrics.map((m) => m.step)).toEqual([0, 1, 2, 3]);
  expect([...new Set(before.train.map((r) => r.step))]).toEqual([1, 2, 3, 4]);
  expect(Object.keys(before.evalFiles)).toContain('step-00000004.jsonl');

  // through the command, for its summary line
  let printed = '';
  const log = jest.spyOn(console, 'log').mockImplementation((s: string) => void (printed += s));
  try {
    await grpoMain(small('crashed', { resume: true }));
  } finally {
    log.mockRestore();
  }
  const summary = JSON.parse(printed) as { steps: number; checkpoint: string; acc_before_grpo: number; acc_after_grpo: number };
  expect(files('crashed')).toEqual(files('straight'));
  expect(files('crashed').train).toHaveLength(4 * 4 * 4);
  const [a, b] = [loadCheckpoint(straight.checkpoint), loadCheckpoint(summary.checkpoint)];
  expect(b.state).toEqual(a.state);
  // the step-0 evaluation was before the checkpoint: the summary reads it back
  expect([summary.steps, summary.acc_before_grpo, summary.acc_after_grpo]).toEqual([4, straight.evals[0].accuracy, straight.evals.at(-1)!.accuracy]);
}, 60_000);

test('kill -9 through the CLI, then --resume: the same files as an uninterrupted run', async () => {
  const args = (run: string) => ['grpo', '--run_dir', join(root, run), '--steps', '12', '--prompts_per_step', '4', '--group_size', '4', '--max_new_tokens', '4', '--eval_examples', '8', '--eval_every', '2', '--save_every', '5', '--keep_last', '5', '--n_minibatches', '2', '--lr', '1e-3'];
  const dir = join(root, 'killed');
  const cli = spawn(process.execPath, [bin, ...args('killed')], { stdio: ['ignore', 'ignore', 'pipe'] });
  const exited = new Promise((resolve) => cli.on('exit', resolve));
  // killed as step 8 is reported: metrics, rollouts and an evaluation of steps after the checkpoint of step 5 were written
  let stderr = '';
  await new Promise<void>((resolve, reject) => {
    cli.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
      if (/step 8\/12/.test(stderr)) resolve();
    });
    void exited.then(() => reject(new Error(`exited before step 8:\n${stderr}`)));
  });
  const trainer = Number(readFileSync(`/proc/${cli.pid}/task/${cli.pid}/children`, 'utf8').trim());
  process.kill(trainer, 'SIGKILL');
  await exited;
  expect(readdirSync(join(dir, 'checkpoints')).filter((c) => c.startsWith('step-'))).toEqual(['step-00000005']);
  expect(Math.max(...readMetrics(join(dir, 'metrics.jsonl')).map((m) => m.step))).toBeGreaterThanOrEqual(7);
  expect(existsSync(join(dir, 'eval', 'step-00000006.jsonl'))).toBe(true);
  const resumed = spawnSync(process.execPath, [bin, ...args('killed'), '--resume'], { encoding: 'utf8' });
  expect(resumed.stderr).not.toMatch(/Error/);
  expect(resumed.status).toBe(0);
  await runGrpo({ ...small('uninterrupted'), steps: 12, save_every: 5 });
  expect(files('killed')).toEqual(files('uninterrupted'));
}, 120_000);

test('a run that crashed before its first checkpoint: a new run is refused unless --overwrite, which starts clean', async () => {
  await expect(runGrpo(small('early'), crashAt(2))).rejects.toThrow('killed');
  const dir = join(root, 'early');
  await expect(runGrpo(small('early'))).rejects.toThrow(`--run_dir ${dir} holds an earlier run (metrics.jsonl, eval/, rollouts.sqlite) with no checkpoint to resume from: pass --overwrite to start over, or choose another --run_dir`);
  await runGrpo(small('early', { overwrite: true }));
  expect(files('early')).toEqual(files('straight'));
}, 60_000);

test("a failed run's built-in model is not reused by a run with another seed", async () => {
  await expect(runGrpo(small('failed', { prompt_format: 'chat' }))).rejects.toThrow(/the builtin:addition tokenizer has no chat template/); // after the model was made
  expect(existsSync(join(root, 'failed', 'base-model', 'model.safetensors'))).toBe(true);
  const one = { steps: 1, eval_examples: 0, save_every: 0, seed: 1 };
  await runGrpo(small('failed', one));
  await runGrpo(small('fresh', one));
  const weights = (run: string) => readFileSync(join(root, run, 'base-model', 'model.safetensors'));
  expect(weights('failed').equals(weights('fresh'))).toBe(true);
}, 60_000);

test('a missing prompt or answer field: the error names the row, lists its fields and the flag (as lathe generate does)', async () => {
  const data = join(root, 'qa.jsonl');
  writeFileSync(data, Array.from({ length: 12 }, (_, i) => JSON.stringify({ question: `${i}+1=`, solution: String(i + 1) })).join('\n') + '\n');
  await expect(runGrpo(small('fields', { data }))).rejects.toThrow(`${data}:1: no field 'prompt' (the row has 'question', 'solution'; see --prompt_field)`);
  await expect(runGrpo(small('fields', { data, prompt_field: 'question' }))).rejects.toThrow(`${data}:1: no field 'answer' (the row has 'question', 'solution'; the reference answer: see --answer_field)`);
  expect(existsSync(join(root, 'fields'))).toBe(false); // checked before anything was written
}, 60_000);

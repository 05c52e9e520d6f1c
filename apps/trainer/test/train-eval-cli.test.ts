/**
 * `lathe sft` and `lathe grpo` with `--eval_benchmarks` on the built-in model and a fixture
 * benchmark of addition problems: avg@n logged at the evaluation steps in metrics.jsonl, the
 * completions saved beside the held-out evaluations, a line per evaluation on stderr, and a bad
 * benchmark name refused before training with the known names.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');
const DATA = resolve(__dirname, '../../../fixtures/train-eval');
const lathe = (cwd: string, ...args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', cwd });
const bench = ['--eval_benchmarks', 'math500', '--eval_data_dir', DATA, '--eval_limit', '4', '--eval_samples', '2', '--eval_template', '{problem}'];

/** metrics.jsonl's lines that hold `key`: [step, value]. */
function logged(run: string, key: string): [number, number][] {
  return readFileSync(join(run, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, number>)
    .flatMap((l) => (key in l ? [[l.step, l[key]] as [number, number]] : []));
}

test.each([
  ['sft', ['--batch_size', '8', '--eval_examples', '0']],
  ['grpo', ['--prompts_per_step', '4', '--group_size', '2', '--max_new_tokens', '4', '--eval_examples', '4', '--n_minibatches', '1']],
])('lathe %s --eval_benchmarks math500 --eval_every 2: eval/math500/avg@2 at steps 0, 2 and 4', (command, flags) => {
  const cwd = mkdtempSync(join(tmpdir(), 'lathe-train-eval-'));
  const r = lathe(cwd, command, '--steps', '4', '--eval_every', '2', '--save_every', '0', '--run_dir', 'run', ...flags, ...bench);
  expect(r.stderr).toMatch(/benchmarks at step 0: math500 avg@2 \d+\.\d% \(8 samples, [\d.]+ s\)/);
  expect(r.status).toBe(0);
  const points = logged(join(cwd, 'run'), 'eval/math500/avg@2');
  expect(points.map(([s]) => s)).toEqual([0, 2, 4]);
  // 4 problems × 2 samples: multiples of 1/8
  for (const [, v] of points) expect(Number.isInteger(v * 8)).toBe(true);
  for (const s of [0, 2, 4]) expect(existsSync(join(cwd, 'run', 'eval', `benchmarks-step-${String(s).padStart(8, '0')}.parquet`))).toBe(true);
}, 120_000);

test('an unknown benchmark is refused before training, listing the known ones', () => {
  const cwd = mkdtempSync(join(tmpdir(), 'lathe-train-eval-'));
  const r = lathe(cwd, 'sft', '--steps', '2', '--run_dir', 'run', '--eval_benchmarks', 'math501');
  expect(r.status).not.toBe(0);
  expect(r.stderr).toMatch(/--eval_benchmarks math501: unknown benchmark 'math501' \(known: aime24, aime25, amc23, math500, minerva, olympiadbench, gsm8k\)/);
  expect(existsSync(join(cwd, 'run', 'metrics.jsonl'))).toBe(false);
}, 60_000);

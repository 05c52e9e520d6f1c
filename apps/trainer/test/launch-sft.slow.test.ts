/**
 * `lathe sft` under `lathe launch` on the CPU (2 processes over the TCP rendezvous): the loss
 * trajectory of one process on the same global batch, one run directory written by rank 0, and a
 * checkpoint that resumes on another number of ranks.
 */
import { spawnLathe } from './spawn-lathe';
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const cwd = mkdtempSync(join(tmpdir(), 'lathe-launch-sft-'));
const common = ['--batch_size', '8', '--eval_every', '0', '--log_every', '1', '--seed', '3'];

const lathe = (...args: string[]) => spawnLathe(cwd, ...args);
const losses = (run: string) =>
  readFileSync(join(cwd, 'runs', run, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { step: number; loss: number })
    .map((m) => [m.step, m.loss]);

test('2 ranks take the steps of one process on the same global batch; rank 0 alone writes the run; a checkpoint resumes on another world size', async () => {
  const [one, two, half] = await Promise.all([
    lathe('sft', '--steps', '4', '--run_dir', 'runs/one', ...common),
    lathe('launch', '--gpus', '2', '--master_port', '29691', '--', 'sft', '--steps', '4', '--run_dir', 'runs/two', ...common),
    lathe('sft', '--steps', '2', '--run_dir', 'runs/resumed', ...common),
  ]);
  for (const r of [one, two, half]) expect(r.status).toBe(0);
  // 1 process to step 2, then 2 ranks from its checkpoint to step 4
  const resumed = await lathe('launch', '--gpus', '2', '--master_port', '29692', '--', 'sft', '--steps', '4', '--run_dir', 'runs/resumed', '--resume', '--force', ...common);
  expect(resumed.status).toBe(0);

  const ref = losses('one');
  expect(ref.map(([s]) => s)).toEqual([1, 2, 3, 4]);
  for (const run of ['two', 'resumed']) {
    const got = losses(run);
    expect(got.map(([s]) => s)).toEqual([1, 2, 3, 4]);
    got.forEach(([, l], i) => expect(Math.abs(l - ref[i][1]) / ref[i][1]).toBeLessThanOrEqual(1e-5));
  }
  // one summary per rank; rank 0's names the run's checkpoint, and only rank 0 wrote the run directory
  const summary = JSON.parse(two.stdout.trim().split('\n').filter((l) => l.startsWith('{')).at(-1)!) as { checkpoint: string; steps: number };
  expect(summary).toMatchObject({ steps: 4, checkpoint: 'runs/two/checkpoints/step-00000004' });
  expect(two.stdout).toMatch(/^\[rank 1\] \{"run_dir":"runs\/two","steps":4/m);
  expect(readdirSync(join(cwd, 'runs', 'two', 'checkpoints'))).toEqual(['step-00000004']);
  expect(readFileSync(join(cwd, 'runs', 'two', 'metrics.jsonl'), 'utf8').trim().split('\n')).toHaveLength(4);
  expect(existsSync(join(cwd, 'runs', 'two', 'config.yaml'))).toBe(true);
}, 240_000);

test('rm train and dpo: 2 ranks take the steps of one process on the same global batch of pairs', async () => {
  const pairs: string[] = [];
  for (let a = 0; a < 5; a++) for (let b = 0; b < 5; b++) for (const wrong of ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '', '+', '=']) if (wrong !== String(a + b)) pairs.push(JSON.stringify({ prompt: `${a}+${b}=`, chosen: String(a + b), rejected: wrong }));
  writeFileSync(join(cwd, 'pairs.jsonl'), pairs.join('\n') + '\n');
  const opts = ['--data', 'pairs.jsonl', '--steps', '3', '--batch_size', '16', '--eval_examples', '40', '--eval_every', '0', '--log_every', '1'];
  const runs = await Promise.all([
    lathe('rm', 'train', ...opts, '--lr', '3e-3', '--run_dir', 'runs/rm-one'),
    lathe('launch', '--gpus', '2', '--master_port', '29694', '--', 'rm', 'train', ...opts, '--lr', '3e-3', '--run_dir', 'runs/rm-two'),
    lathe('dpo', ...opts, '--run_dir', 'runs/dpo-one'),
    lathe('launch', '--gpus', '2', '--master_port', '29695', '--', 'dpo', ...opts, '--run_dir', 'runs/dpo-two'),
  ]);
  // a failing run shows its output's end
  for (const r of runs) expect({ status: r.status, tail: r.status === 0 ? '' : r.stderr.slice(-3000) }).toEqual({ status: 0, tail: '' });
  for (const [one, two] of [['rm-one', 'rm-two'], ['dpo-one', 'dpo-two']]) {
    const ref = losses(one).filter(([, l]) => l !== undefined);
    const got = losses(two).filter(([, l]) => l !== undefined);
    expect(got.map(([s]) => s)).toEqual([1, 2, 3]);
    got.forEach(([, l], i) => expect(Math.abs(l - ref[i][1]) / ref[i][1]).toBeLessThanOrEqual(1e-5));
  }
}, 240_000);

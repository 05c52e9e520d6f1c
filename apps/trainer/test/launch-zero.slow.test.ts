/**
 * `--zero_stage 1` under `lathe launch` on the CPU (processes over the TCP rendezvous): sft, rm train
 * and dpo with the AdamW state split over the ranks take the steps of one process on the same
 * global batch, and a checkpoint written from 2 sharded ranks (rank 0 gathering the moments)
 * resumes on 4 sharded ranks and on one process, on the same trajectory.
 */
import { spawnLathe } from './spawn-lathe';
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const cwd = mkdtempSync(join(tmpdir(), 'lathe-launch-zero-'));

const lathe = (...args: string[]) => spawnLathe(cwd, ...args);
const losses = (run: string) =>
  readFileSync(join(cwd, 'runs', run, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { step: number; loss?: number })
    .filter((m) => m.loss !== undefined)
    .map((m) => [m.step, m.loss!]);
const ok = (r: { status: number | null; stderr: string }) => expect({ status: r.status, tail: r.status === 0 ? '' : r.stderr.slice(-3000) }).toEqual({ status: 0, tail: '' });

test('rm train and dpo with --zero_stage 1 on 2 ranks take the steps of one process; a sharded checkpoint resumes on 4 sharded ranks and on 1 process', async () => {
  const pairs: string[] = [];
  for (let a = 0; a < 5; a++) for (let b = 0; b < 5; b++) for (const wrong of ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '', '+', '=']) if (wrong !== String(a + b)) pairs.push(JSON.stringify({ prompt: `${a}+${b}=`, chosen: String(a + b), rejected: wrong }));
  writeFileSync(join(cwd, 'pairs.jsonl'), pairs.join('\n') + '\n');
  const opts = (steps: number) => ['--data', 'pairs.jsonl', '--steps', String(steps), '--batch_size', '16', '--eval_examples', '40', '--eval_every', '0', '--log_every', '1', '--save_every', '2'];
  const rm = ['rm', 'train', '--lr', '3e-3', '--schedule', 'constant']; // constant: a run of --steps 2 has the learning rates of a run of 4
  const launch = (port: number, gpus: number, ...cmd: string[]) => lathe('launch', '--gpus', String(gpus), '--master_port', String(port), '--', ...cmd, '--zero_stage', '1');
  const first = await Promise.all([
    lathe(...rm, ...opts(4), '--run_dir', 'runs/rm-one'),
    launch(29721, 2, ...rm, ...opts(4), '--run_dir', 'runs/rm-zero'),
    launch(29722, 2, ...rm, ...opts(2), '--run_dir', 'runs/rm-resumed'),
    launch(29725, 2, ...rm, ...opts(2), '--run_dir', 'runs/rm-resumed-one'),
    lathe('dpo', ...opts(3), '--run_dir', 'runs/dpo-one'),
    launch(29723, 2, 'dpo', ...opts(3), '--run_dir', 'runs/dpo-zero'),
  ]);
  first.forEach(ok);
  // checkpoints of 2 sharded ranks at step 2, continued on 4 sharded ranks and on one process
  const resumed = await Promise.all([
    launch(29724, 4, ...rm, ...opts(4), '--run_dir', 'runs/rm-resumed', '--resume', '--force'),
    lathe(...rm, ...opts(4), '--run_dir', 'runs/rm-resumed-one', '--resume', '--force'),
  ]);
  resumed.forEach(ok);
  for (const [one, zero, steps] of [['rm-one', 'rm-zero', 4], ['rm-one', 'rm-resumed', 4], ['rm-one', 'rm-resumed-one', 4], ['dpo-one', 'dpo-zero', 3]] as const) {
    const ref = losses(one);
    const got = losses(zero);
    expect(got.map(([s]) => s)).toEqual(Array.from({ length: steps }, (_, i) => i + 1));
    got.forEach(([, l], i) => expect(Math.abs(l - ref[i][1]) / ref[i][1]).toBeLessThanOrEqual(1e-5));
  }
  // rank 0 alone wrote the checkpoints, with the whole (gathered) AdamW state
  expect(readdirSync(join(cwd, 'runs', 'rm-zero', 'checkpoints'))).toEqual(['step-00000002', 'step-00000004']);
}, 300_000);

test('sft with --zero_stage 1 on 2 ranks takes the steps of one process on the same global batch', async () => {
  const common = ['--steps', '4', '--batch_size', '8', '--eval_every', '0', '--log_every', '1', '--seed', '3', '--save_every', '2'];
  const [one, zero] = await Promise.all([
    lathe('sft', ...common, '--run_dir', 'runs/sft-one'),
    lathe('launch', '--gpus', '2', '--master_port', '29726', '--', 'sft', ...common, '--run_dir', 'runs/sft-zero', '--zero_stage', '1'),
  ]);
  [one, zero].forEach(ok);
  const ref = losses('sft-one');
  const got = losses('sft-zero');
  expect(got.map(([s]) => s)).toEqual([1, 2, 3, 4]);
  got.forEach(([, l], i) => expect(Math.abs(l - ref[i][1]) / ref[i][1]).toBeLessThanOrEqual(1e-5));
  expect(readdirSync(join(cwd, 'runs', 'sft-zero', 'checkpoints'))).toEqual(['step-00000002', 'step-00000004']);
}, 240_000);

test('sft on 2 ranks with --grad_reduce_dtype bfloat16, alone and with --zero_stage 2: the first loss is one process\'s, later ones within the bfloat16 gradients\' effect, and the config records the option', async () => {
  const common = ['--steps', '3', '--batch_size', '8', '--eval_every', '0', '--log_every', '1', '--seed', '3', '--save_every', '0'];
  const runs = await Promise.all([
    lathe('sft', ...common, '--run_dir', 'runs/sft-bf16-one'),
    lathe('launch', '--gpus', '2', '--master_port', '29727', '--', 'sft', ...common, '--run_dir', 'runs/sft-bf16', '--grad_reduce_dtype', 'bfloat16'),
    lathe('launch', '--gpus', '2', '--master_port', '29728', '--', 'sft', ...common, '--run_dir', 'runs/sft-bf16-zero2', '--grad_reduce_dtype', 'bfloat16', '--zero_stage', '2'),
  ]);
  runs.forEach(ok);
  const ref = losses('sft-bf16-one');
  for (const run of ['sft-bf16', 'sft-bf16-zero2']) {
    const got = losses(run);
    expect(got.map(([s]) => s)).toEqual([1, 2, 3]);
    expect(Math.abs(got[0][1] - ref[0][1]) / ref[0][1]).toBeLessThanOrEqual(1e-6);
    // AdamW divides by the gradients' own scale, so their bfloat16 rounding moves the losses little (4e-8 relative at step 3), but it moves them
    got.forEach(([, l], i) => expect(Math.abs(l - ref[i][1]) / ref[i][1]).toBeLessThanOrEqual(1e-4));
    expect(got.some(([, l], i) => l !== ref[i][1])).toBe(true);
    expect(readFileSync(join(cwd, 'runs', run, 'config.yaml'), 'utf8')).toMatch(/grad_reduce_dtype: bfloat16/);
  }
  expect(readFileSync(join(cwd, 'runs', 'sft-bf16-zero2', 'config.yaml'), 'utf8')).toMatch(/zero_stage: 2/);
}, 240_000);

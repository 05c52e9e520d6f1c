/**
 * `lathe launch` on the CPU: real processes over the TCP rendezvous, each running
 * launch-worker.ts (tiny-decoder SFT steps on its share of each global batch, as a lathe command
 * does through joinDataParallel).
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { defaults, launchSchema, rankEnv, runLaunch } from '@lathe/recipes';
import { rankCommand } from '../src/commands/launch';

const LATHE = join(__dirname, '..', 'bin', 'lathe.cjs');
const WORKER = join(__dirname, 'launch-worker.ts');
const TSX = pathToFileURL(require.resolve('tsx')).href;
const worker = [process.execPath, '--conditions=lathe-source', '--import', TSX, WORKER];
const dir = mkdtempSync(join(tmpdir(), 'lathe-launch-test-'));

function config(name: string, c: Record<string, unknown>): string {
  const file = join(dir, name);
  writeFileSync(file, JSON.stringify(c));
  return file;
}

function run(argv: string[]): Promise<{ status: number | null; stdout: string; stderr: string; ms: number }> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const p = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    p.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    p.on('close', (status) => resolve({ status, stdout, stderr, ms: Date.now() - t0 }));
  });
}
const launch = (port: number, ...cmd: string[]) => run([process.execPath, LATHE, 'launch', '--gpus', '2', '--master_port', String(port), '--', ...cmd]);

test("each rank's environment: torchrun's variables, NVLink multicast off unless set, the CLI wrapper's pid dropped", () => {
  const cfg = { ...defaults(launchSchema), gpus: 4, nnodes: 2, node_rank: 1, master_addr: '10.0.0.1', master_port: 29700 };
  expect(rankEnv(cfg, 2, { PATH: '/bin', LATHE_WRAPPER_PID: '12' })).toEqual({
    PATH: '/bin',
    RANK: '6',
    WORLD_SIZE: '8',
    LOCAL_RANK: '2',
    LOCAL_WORLD_SIZE: '4',
    GROUP_RANK: '1',
    MASTER_ADDR: '10.0.0.1',
    MASTER_PORT: '29700',
    NCCL_NVLS_ENABLE: '0',
  });
  expect(rankEnv(cfg, 0, { NCCL_NVLS_ENABLE: '1' }).NCCL_NVLS_ENABLE).toBe('1');
});

test('2 processes over TCP take the losses of one process on the same global batch (fp32, ≤ 1e-5 relative), also as two one-rank "nodes"', async () => {
  const cfg = config('same.json', { steps: 3, batch_size: 4, micro_batches: 2, lr: 0.02 });
  // and the same 2 ranks as two one-process "nodes": two launches sharing node 0's rendezvous
  const node = (rank: number) => run([process.execPath, LATHE, 'launch', '--gpus', '1', '--nnodes', '2', '--node_rank', String(rank), '--master_port', '29660', '--', ...worker, cfg]);
  const [two, one, n0, n1] = await Promise.all([launch(29661, ...worker, cfg), run([...worker, cfg]), node(0), node(1)]);
  expect(two.stderr).toBe('');
  expect(two.status).toBe(0);
  const lines = two.stdout.trim().split('\n');
  // rank 0's output as it is (its last line a command's JSON summary), the others' prefixed
  const r0 = JSON.parse(lines.find((l) => l.startsWith('{'))!) as { rank: number; world: number; losses: number[] };
  const r1 = JSON.parse(lines.find((l) => l.startsWith('[rank 1] '))!.slice('[rank 1] '.length)) as { rank: number; losses: number[] };
  const single = JSON.parse(one.stdout) as { world: number; losses: number[] };
  expect([r0.rank, r0.world, r1.rank, single.world]).toEqual([0, 2, 1, 1]);
  expect(r1.losses).toEqual(r0.losses);
  r0.losses.forEach((l, i) => expect(Math.abs(l - single.losses[i]) / single.losses[i]).toBeLessThanOrEqual(1e-5));
  const nodes = [n0, n1].map((r) => JSON.parse(r.stdout.trim().replace(/^\[rank 1\] /, '')) as { rank: number; world: number; losses: number[] });
  expect(nodes.map((n) => [n.rank, n.world])).toEqual([[0, 2], [1, 2]]);
  expect(nodes[0].losses).toEqual(r0.losses);
}, 120_000);

test('bad starts stop every rank with a message naming the cause: a rank that dies, mismatched configs, a batch that does not split', async () => {
  const die = config('die.json', { steps: 6, batch_size: 4, micro_batches: 1, lr: 0.02, die_at_step: 1, die_rank: 1 });
  config('cfg-0.json', { steps: 2, batch_size: 4, micro_batches: 1, lr: 0.02 });
  config('cfg-1.json', { steps: 2, batch_size: 4, micro_batches: 1, lr: 0.03 });
  const odd = config('odd.json', { steps: 2, batch_size: 5, micro_batches: 1, lr: 0.02 });
  const [dead, mismatch, split] = await Promise.all([launch(29662, ...worker, die), launch(29663, ...worker, join(dir, 'cfg-%r.json')), launch(29664, ...worker, odd)]);

  expect(dead.status).toBe(3);
  expect(dead.stderr).toContain('lathe launch: rank 1 exited with code 3; stopping the other ranks');
  expect(dead.stderr).toContain('worker rank 0: rank 1 disconnected: its process exited or crashed');

  expect(mismatch.status).toBe(1);
  expect(mismatch.stderr).toContain('worker rank 0: the ranks were started with different configs: rank 1 differs from rank 0 in lr (0.03 vs 0.02)');

  expect(split.status).toBe(1);
  expect(split.stderr).toContain('--batch_size 5 is not divisible by the world size 2 (WORLD_SIZE, lathe launch --gpus)');
}, 120_000);

test('a rank that does not exit after another failed gets SIGTERM after --grace_s, and is killed, named, after another --grace_s', async () => {
  // rank 1 ignores SIGTERM and would run for a minute; rank 0 fails once rank 1's handler is in
  // place (on a loaded machine a rank may take seconds to start)
  const ready = join(mkdtempSync(join(tmpdir(), 'lathe-launch-ready-')), 'ready');
  const prog = `const fs = require('fs'); if (process.env.RANK === '0') { const wait = () => (fs.existsSync(${JSON.stringify(ready)}) ? process.exit(4) : setTimeout(wait, 20)); wait(); } else { process.on('SIGTERM', () => console.log('ignoring SIGTERM')); fs.writeFileSync(${JSON.stringify(ready)}, ''); setTimeout(() => {}, 60000); }`;
  const t0 = Date.now();
  const r = await run([process.execPath, LATHE, 'launch', '--gpus', '2', '--grace_s', '1', '--master_port', '29666', '--', process.execPath, '-e', prog]);
  expect(r.status).toBe(4);
  expect(r.stderr).toContain('lathe launch: rank 0 exited with code 4; stopping the other ranks');
  expect(r.stderr).toContain('lathe launch: rank 1 did not exit within 1 s of SIGTERM: killing it');
  expect(r.stdout).toContain('[rank 1] ignoring SIGTERM');
  expect(Date.now() - t0).toBeLessThan(30_000);
}, 60_000);

test('a lathe command given after -- runs this CLI again, if it joins data-parallel jobs; no command is an error saying how', async () => {
  const r = await run([process.execPath, LATHE, 'launch', '--gpus', '2', '--master_port', '29665', '--', 'grade', '--help']);
  expect(r.status).toBe(1);
  expect(r.stderr).toMatch(/lathe grade --help does not join a data-parallel job \(.*\); lathe launch would start independent copies writing one run directory/);
  expect(await rankCommand(['rm', 'train', '--steps', '2'], new Set(['rm train']))).toEqual([process.execPath, ...process.execArgv, process.argv[1], 'rm', 'train', '--steps', '2']);
  await expect(rankCommand(['rm', 'eval'], new Set(['rm train']))).rejects.toThrow('lathe rm eval does not join a data-parallel job (the commands that do: rm train)');
  expect(await rankCommand(['grade', '--help'], new Set(['grade']))).toEqual([process.execPath, ...process.execArgv, process.argv[1], 'grade', '--help']);
  expect(await rankCommand(['python3', 'train.py'])).toEqual(['python3', 'train.py']);
  const io = { stdout: () => undefined, stderr: () => undefined };
  expect(() => runLaunch(defaults(launchSchema), [], io)).toThrow('no command to run: give it after --, e.g. lathe launch --gpus 2 -- sft --config sft.yaml');
  expect(() => runLaunch({ ...defaults(launchSchema), node_rank: 2, nnodes: 2 }, ['true'], io)).toThrow('--node_rank 2 is not below --nnodes 2');
}, 120_000);

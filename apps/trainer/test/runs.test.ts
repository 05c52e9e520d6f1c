import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { defaults, runSft, sftSchema } from '@lathe/recipes';
import { runsSubcommands } from '../src/commands/runs';

/**
 * Runs `lathe runs <sub> …` in this process by calling the subcommand's handler with parsed flags
 * (yargs 18 is ESM-only and does not load under jest; the real binary is exercised at the end),
 * capturing stdout; a thrown error becomes `stderr` and status 1, as main.ts reports it.
 */
async function lathe(args: string[]): Promise<{ status: number; stdout: string; stderr: string }> {
  const [runs, sub, ...rest] = args;
  if (runs !== 'runs') throw new Error('only lathe runs here');
  const argv: Record<string, unknown> = { _: [runs, sub], $0: 'lathe' };
  const positional: string[] = [];
  for (let i = 0; i < rest.length; i++) {
    const a = rest[i];
    if (!a.startsWith('--')) positional.push(a);
    else if (i + 1 < rest.length && !rest[i + 1].startsWith('--') || /^-\d/.test(rest[i + 1] ?? '')) argv[a.slice(2)] = Number.isNaN(Number(rest[i + 1])) ? rest[++i] : Number(rest[++i]);
    else argv[a.slice(2)] = true;
  }
  const names = { list: [], show: ['run'], diff: ['a', 'b'], prune: ['run'] }[sub as 'list'] as string[];
  names.forEach((n, k) => (argv[n] = positional[k]));
  let stdout = '';
  const spy = jest.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
    stdout += chunk.toString();
    return true;
  });
  try {
    await runsSubcommands[sub as keyof typeof runsSubcommands].handler(argv as never);
    return { status: 0, stdout, stderr: '' };
  } catch (e) {
    return { status: 1, stdout, stderr: (e as Error).message };
  } finally {
    spy.mockRestore();
  }
}

/** Two real `lathe sft` runs (the built-in tiny model, a few steps) that differ in their learning rate. */
const root = mkdtempSync(path.join(tmpdir(), 'lathe-runs-cli-'));
beforeAll(async () => {
  for (const [name, lr] of [['fast', 0.005], ['slow', 0.001]] as const) {
    await runSft({ ...defaults(sftSchema), run_dir: path.join(root, name), steps: 4, batch_size: 8, eval_examples: 8, eval_every: 2, save_every: 1, keep_last: 10, log_every: 1, lr });
  }
}, 120_000);

describe('lathe runs (on real lathe sft run directories)', () => {
  test('list --json: both runs with their checkpoints, evaluations and last metrics', async () => {
    const r = await lathe(['runs', 'list', '--root', root, '--json']);
    expect(r.status).toBe(0);
    const runs = JSON.parse(r.stdout) as { name: string; checkpoints: { step: number }[]; evals: { step: number }[]; lastMetrics: { step: number; loss: number } }[];
    expect(runs.map((x) => x.name).sort()).toEqual(['fast', 'slow']);
    for (const run of runs) {
      expect(run.checkpoints.map((c) => c.step)).toEqual([1, 2, 3, 4]);
      expect(run.evals.map((e) => e.step)).toEqual([0, 2, 4]);
      expect(run.lastMetrics.step).toBe(4);
      expect(typeof run.lastMetrics.loss).toBe('number');
    }
    const text = await lathe(['runs', 'list', '--root', root]);
    expect(text.stdout).toMatch(/^run\s+modified\s+checkpoints/);
    expect(text.stdout).toMatch(/fast\s+\S+ \S+\s+4 \(last 4\)/);
  });

  test('show: the saved config and the last metrics lines', async () => {
    const r = await lathe(['runs', 'show', 'fast', '--root', root, '--metrics', '2', '--json']);
    expect(r.status).toBe(0);
    const s = JSON.parse(r.stdout) as { config: Record<string, unknown>; metrics: { step: number }[] };
    expect(s.config).toMatchObject({ lr: 0.005, steps: 4, run_dir: path.join(root, 'fast') });
    expect(s.metrics.map((m) => m.step)).toEqual([3, 4]);
    const text = await lathe(['runs', 'show', path.join(root, 'slow')]);
    expect(text.stdout).toContain('  lr: 0.001');
    expect(text.stdout).toMatch(/checkpoints: step 1 \(.*\), step 2/);
  });

  test('diff: exactly the options that differ', async () => {
    const r = await lathe(['runs', 'diff', 'fast', 'slow', '--root', root, '--json']);
    expect(r.status).toBe(0);
    expect(JSON.parse(r.stdout).differences).toEqual([
      { key: 'lr', a: 0.005, b: 0.001 },
      { key: 'run_dir', a: path.join(root, 'fast'), b: path.join(root, 'slow') },
    ]);
  });

  test('prune: dry run, then keep the last and the lowest-loss checkpoint; bad flags name the flag', async () => {
    const dry = await lathe(['runs', 'prune', 'fast', '--root', root, '--keep_last', '1', '--dry_run']);
    expect(dry.status).toBe(0);
    expect(dry.stdout).toMatch(/would delete 3 checkpoint\(s\)/);
    expect(readdirSync(path.join(root, 'fast', 'checkpoints')).length).toBe(4);
    const r = await lathe(['runs', 'prune', 'fast', '--root', root, '--keep_last', '1', '--keep_best', '1', '--metric', 'loss', '--mode', 'min', '--json']);
    expect(r.status).toBe(0);
    const res = JSON.parse(r.stdout) as { kept: { step: number; reason: string[] }[]; deleted: { step: number }[] };
    expect(res.kept.some((k) => k.step === 4 && k.reason.includes('last 1'))).toBe(true);
    expect(res.kept.length + res.deleted.length).toBe(4);
    for (const d of res.deleted) expect(existsSync(path.join(root, 'fast', 'checkpoints', `step-${String(d.step).padStart(8, '0')}`))).toBe(false);
    const bad = await lathe(['runs', 'prune', 'slow', '--root', root, '--keep_last', '-1']);
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toContain("option 'keep_last' must be ≥ 0, got -1");
    const missing = await lathe(['runs', 'show', 'nope', '--root', root]);
    expect(missing.stderr).toContain(`run 'nope': neither a directory nor a run under ${root}`);
  });

  test('the real binary: runs and its subcommands have --help', () => {
    const LATHE = path.join(__dirname, '..', 'bin', 'lathe.cjs');
    const r = spawnSync(process.execPath, [LATHE, 'runs', '--help'], { encoding: 'utf8', timeout: 60_000 });
    expect(r.status).toBe(0);
    for (const sub of ['list', 'show <run>', 'diff <a> <b>', 'prune <run>']) expect(r.stdout).toContain(`lathe runs ${sub}`);
    const prune = spawnSync(process.execPath, [LATHE, 'runs', 'prune', '--help'], { encoding: 'utf8', timeout: 60_000 });
    expect(prune.stdout).toMatch(/--keep_last\s+Keep the newest N checkpoints \[default: 2\]/);
  }, 60_000);
});

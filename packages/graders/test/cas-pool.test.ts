/**
 * The CAS worker pool starts its workers whatever the process's working directory, and a worker
 * that cannot start fails the checks with its error instead of being restarted forever.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { CasPool } from '@lathe/graders';

test('a symbolic check from a working directory outside the repository (the CLI run from anywhere)', () => {
  const cwd = mkdtempSync(join(tmpdir(), 'lathe-cas-cwd-'));
  const graders = join(__dirname, '..', 'src', 'index.ts');
  const script = `const { MathGrader } = require(${JSON.stringify(graders)}); const g = new MathGrader(); g.grade('(x+1)^2', 'x^2+2x+1', 'raw').then(async (v) => { console.log(JSON.stringify(v)); await g.close(); });`;
  const tsx = pathToFileURL(require.resolve('tsx')).href;
  const r = spawnSync(process.execPath, ['--conditions=lathe-source', '--import', tsx, '-e', script], { cwd, encoding: 'utf8', timeout: 60_000 });
  expect(r.stderr).toBe('');
  expect(JSON.parse(r.stdout.trim())).toMatchObject({ correct: true, reason: 'symbolic' });
}, 70_000);

test('a worker that cannot start fails the checks, named, after three tries', async () => {
  const pool = new CasPool({ workerCode: "throw new Error('no CAS here')" });
  await expect(pool.check({ kind: 'expr', gold: 'x', pred: 'x', relTol: 1e-9 })).rejects.toThrow('CAS worker thread failed to start 3 times in a row (no CAS here)');
  await expect(pool.check({ kind: 'expr', gold: 'y', pred: 'y', relTol: 1e-9 })).rejects.toThrow(/failed to start 3 times/);
  await pool.close();
});

test('bundled: the grader finds cas-worker.js beside the bundle, and names the file when it is missing', () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-cas-bundle-'));
  const entry = join(dir, 'entry.ts');
  const graders = join(__dirname, '..', 'src', 'index.ts');
  writeFileSync(entry, `import { MathGrader } from ${JSON.stringify(graders)};\nconst g = new MathGrader();\ng.grade('(x+1)^2', 'x^2+2x+1', 'raw').then(async (v) => { console.log(JSON.stringify(v)); await g.close(); }, (e) => { console.log(JSON.stringify({ error: String(e.message) })); });\n`);
  const esbuild = require.resolve('esbuild/bin/esbuild');
  const bundle = (from: string, out: string) => {
    const r = spawnSync(esbuild, [from, '--bundle', '--platform=node', '--conditions=lathe-source', '--log-level=error', `--outfile=${out}`], { encoding: 'utf8' });
    expect(r.stderr).toBe('');
  };
  bundle(entry, join(dir, 'app.js'));
  const missing = spawnSync(process.execPath, [join(dir, 'app.js')], { cwd: dir, encoding: 'utf8', timeout: 60_000 });
  expect(JSON.parse(missing.stdout.trim()).error).toContain(`${join(dir, 'cas-worker.js')} does not exist`);
  bundle(join(__dirname, '..', 'src', 'math', 'cas-worker.ts'), join(dir, 'cas-worker.js'));
  const r = spawnSync(process.execPath, [join(dir, 'app.js')], { cwd: dir, encoding: 'utf8', timeout: 60_000 });
  expect(r.stderr).toBe('');
  expect(JSON.parse(r.stdout.trim())).toMatchObject({ correct: true, reason: 'symbolic' });
}, 120_000);

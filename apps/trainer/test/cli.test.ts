import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateSchema, grpoSchema, sftSchema, type OptionSchema } from '@lathe/recipes';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');
const lathe = (...args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', cwd: mkdtempSync(join(tmpdir(), 'lathe-cli-')) });

test.each([
  ['sft', sftSchema],
  ['grpo', grpoSchema],
  ['generate', generateSchema],
] as [string, OptionSchema][])('lathe %s --help lists every option of the schema with its help text and default', (command, schema) => {
  const r = lathe(command, '--help');
  expect(r.status).toBe(0);
  const squash = (s: string) => s.replace(/\s+/g, ''); // yargs wraps (and breaks) long lines
  const text = squash(r.stdout);
  for (const [name, spec] of Object.entries(schema)) {
    expect(text).toContain(`--${name}`);
    expect(text).toContain(squash(spec.describe.slice(0, 30)));
    expect(text).toContain(squash(`[default: ${JSON.stringify(spec.default)}]`));
  }
}, 60_000);

test('bad flags and config files are reported by name, before any work', () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-cli-'));
  let r = lathe('sft', '--steps', 'many');
  expect(r.status).not.toBe(0);
  expect(r.stderr).toMatch(/option 'steps' must be a number/);
  writeFileSync(join(dir, 'bad.yaml'), 'steps: 3\nlearning_rat: 0.1\n');
  r = lathe('sft', '--config', join(dir, 'bad.yaml'));
  expect(r.status).not.toBe(0);
  expect(r.stderr).toMatch(/bad.yaml: unknown option 'learning_rat' \(did you mean 'lr'\?\)/);
  r = lathe('sft', '--config', join(dir, 'missing.yaml'));
  expect(r.stderr).toMatch(/--config .*missing.yaml: cannot read \(ENOENT\)/);
}, 30_000);

test('a YAML config with a flag overriding it runs, and the run saves the resolved config', () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-cli-'));
  writeFileSync(join(dir, 'sft.yaml'), `steps: 50\nbatch_size: 4\neval_examples: 4\nrun_dir: ${join(dir, 'run')}\nsave_every: 0\n`);
  const r = lathe('sft', '--config', join(dir, 'sft.yaml'), '--steps', '3');
  expect(r.stderr).not.toMatch(/Error/);
  expect(r.status).toBe(0);
  const summary = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { steps: number; checkpoint: string };
  expect(summary.steps).toBe(3);
  const saved = readFileSync(join(dir, 'run', 'config.yaml'), 'utf8');
  expect(saved).toMatch(/^steps: 3$/m);
  expect(saved).toMatch(/^batch_size: 4$/m);
  expect(readFileSync(join(summary.checkpoint, 'config.yaml'), 'utf8')).toBe(saved);
}, 60_000);

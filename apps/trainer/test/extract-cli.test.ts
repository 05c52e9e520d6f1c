/**
 * `lathe extract` on the command line: the four subcommands are there, each with its option table
 * in --help, and bad input is a short error naming the flag or the file's column (the runs
 * themselves are tested in packages/recipes/test/extract-commands.test.ts).
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeTrajectories } from '@lathe/data';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');
const dir = mkdtempSync(join(tmpdir(), 'lathe-extract-cli-'));
const lathe = (args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', cwd: dir, timeout: 60_000 });

test('help lists generate, train, rft and eval with their options', () => {
  const top = lathe(['extract', '--help']);
  expect(top.status).toBe(0);
  for (const sub of ['generate', 'train', 'rft', 'eval']) expect(top.stdout).toContain(`lathe extract ${sub}`);
  const gen = lathe(['extract', 'generate', '--help']);
  for (const flag of ['--tau', '--min_p', '--critic', '--enable_thinking', '--max_new_tokens', '--seed', '--html']) expect(gen.stdout).toContain(flag);
  expect(lathe(['extract', 'train', '--help']).stdout).toContain('--kl');
}, 60_000);

test('bad input: τ ≤ 0 names --tau; a file without candidate columns names them', async () => {
  const data = join(dir, 'plain.parquet');
  await writeTrajectories(data, [{ prompt_idx: 0, prompt: '1+2=', prompt_token_ids: [4, 13, 5, 14], output_token_ids: [6, 2], correct: 1 }]);
  const tau = lathe(['extract', 'train', '--data', data, '--tau', '0', '--run_dir', join(dir, 'run')]);
  expect(tau.status).not.toBe(0);
  expect(tau.stderr).toContain('--tau must be > 0');
  const cols = lathe(['extract', 'train', '--data', data, '--run_dir', join(dir, 'run')]);
  expect(cols.status).not.toBe(0);
  expect(cols.stderr).toContain(`--data ${data}: no column 'candidate_ids', 'candidate_q_values', 'candidate_ref_logprobs'`);
  expect(cols.stderr).not.toMatch(/^\s+at /m);
}, 60_000);

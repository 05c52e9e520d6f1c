/**
 * A boolean option whose default is `auto` (`lathe sft --logprob_kernel`) on the command line: a bare
 * flag is true, `auto`/`true`/`false` are taken as words, anything else is a usage error naming the
 * option. Through the binary, since yargs does not load under jest.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');
const dir = mkdtempSync(join(tmpdir(), 'lathe-auto-flag-'));
const lathe = (...args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', cwd: dir, timeout: 60_000 });

test("lathe sft --logprob_kernel: bare is true (refused with composed attention), false is off, the saved config says what was given, a word other than true, false or auto is a usage error", () => {
  let r = lathe('sft', '--logprob_kernel', 'maybe');
  expect(r.status).not.toBe(0);
  expect(r.stderr).toMatch(/option 'logprob_kernel' must be true or false or 'auto', got "maybe"/);
  // the flag given bare, then another flag: true, which the composed attention refuses once the run starts
  r = lathe('sft', '--logprob_kernel', '--attention', 'composed', '--steps', '1', '--run_dir', join(dir, 'bare'));
  expect(r.status).not.toBe(0);
  expect(r.stderr).toMatch(/--logprob_kernel needs the attention kernels, and the run's attention is 'composed'/);
  r = lathe('sft', '--logprob-kernel', 'true', '--attention', 'composed', '--steps', '1', '--run_dir', join(dir, 'true'));
  expect(r.stderr).toMatch(/--logprob_kernel needs the attention kernels/);
  // false is off; the saved config records the option as given (auto by default), as it does --attention
  const quick = ['--attention', 'composed', '--steps', '1', '--batch_size', '2', '--eval_examples', '0', '--save_every', '0'];
  r = lathe('sft', '--logprob_kernel', 'false', ...quick, '--run_dir', join(dir, 'false'));
  expect(r.status).toBe(0);
  expect(readFileSync(join(dir, 'false', 'config.yaml'), 'utf8')).toMatch(/^logprob_kernel: false$/m);
  r = lathe('sft', ...quick, '--run_dir', join(dir, 'auto'));
  expect(r.status).toBe(0);
  expect(readFileSync(join(dir, 'auto', 'config.yaml'), 'utf8')).toMatch(/^logprob_kernel: auto$/m);
}, 60_000);

/**
 * `lathe sft --serve_port` from the command line: the flags exist with the shared defaults, and the
 * runs it cannot serve stop at once with a message naming the flags.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defaults, sftSchema } from '@lathe/recipes';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');
const dir = mkdtempSync(join(tmpdir(), 'lathe-sft-serve-cli-'));
const lathe = (args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', cwd: dir, timeout: 120_000 });

test('--serve_port, --serve_host and --serve_max_rows: off by default, on loopback, 32 rows', () => {
  expect(defaults(sftSchema)).toMatchObject({ serve_port: 0, serve_host: '127.0.0.1', serve_max_rows: 32 });
  const help = lathe(['sft', '--help']).stdout;
  for (const f of ['--serve_port', '--serve_host', '--serve_max_rows']) expect(help).toContain(f);
}, 60_000);

test('the built-in model (no Hugging Face tokenizer) and --quantize_base are refused, naming the flags', () => {
  const builtin = lathe(['sft', '--serve_port', '8123', '--steps', '1', '--run_dir', 'runs/a']);
  expect(builtin.status).toBe(1);
  expect(builtin.stderr).toContain("--serve_port serves text through the model's Hugging Face tokenizer, and this run uses the built-in one");
  const qlora = lathe(['sft', '--serve_port', '8123', '--lora_rank', '4', '--quantize_base', 'nf4', '--run_dir', 'runs/b']);
  expect(qlora.status).toBe(1);
  expect(qlora.stderr).toContain('--serve_port with --quantize_base nf4 is not supported');
}, 120_000);

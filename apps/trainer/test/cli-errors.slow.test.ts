import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sftSchema } from '@lathe/recipes';
import { configFromArgv, suggestName } from '../src/config-flags';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');
const dir = mkdtempSync(join(tmpdir(), 'lathe-cli-errors-'));
const lathe = (args: string[], input = '') => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', cwd: dir, input, timeout: 60_000 });
const lines = (s: string) => s.trimEnd().split('\n');

/** An error's output: a one-line message and a one-line hint on stderr, nothing on stdout, no help text and no stack. */
function expectShortError(r: ReturnType<typeof lathe>, status: number): [string, string] {
  expect(r.stdout).toBe('');
  expect(lines(r.stderr)).toHaveLength(2);
  expect(r.stderr).not.toMatch(/^\s+at /m);
  expect(r.stderr).not.toMatch(/Options:|Examples:/);
  expect(r.status).toBe(status);
  return lines(r.stderr) as [string, string];
}

describe('usage errors: one line and a hint, exit code 2', () => {
  test('a bad flag value names the flag and what was given', () => {
    const [msg, hint] = expectShortError(lathe(['sft', '--steps', 'many']), 2);
    expect(msg).toBe("lathe sft: command line: option 'steps' must be a number, got text that is not a number");
    expect(hint).toMatch(/lathe sft --help/);
  }, 30_000);

  test('an unknown option is answered with the nearest real option', () => {
    let [msg] = expectShortError(lathe(['sft', '--sed', '3']), 2);
    expect(msg).toBe("lathe sft: unknown option --sed (did you mean --seed?)");
    [msg] = expectShortError(lathe(['sft', '--learning_rat', '3e-4']), 2);
    expect(msg).toBe("lathe sft: unknown option --learning_rat (did you mean --lr?)");
    [msg] = expectShortError(lathe(['sft', '--zzzzzz', '1']), 2);
    expect(msg).toBe('lathe sft: unknown option --zzzzzz');
  }, 60_000);

  test('an unknown command is answered with the nearest command', () => {
    const [msg, hint] = expectShortError(lathe(['sfft']), 2);
    expect(msg).toBe("lathe: unknown command 'sfft' (did you mean 'sft'?)");
    expect(hint).toMatch(/lathe --help/);
    expect(expectShortError(lathe([]), 2)[0]).toMatch(/^lathe: name a command/);
    expect(expectShortError(lathe(['runs', 'lst']), 2)).toEqual(["lathe runs: unknown command 'lst' (did you mean 'list'?)", "Run 'lathe runs --help' for usage."]);
    expect(expectShortError(lathe(['runs']), 2)[0]).toBe('lathe runs: name a runs subcommand: list, show, diff, prune');
  }, 60_000);

  test('a flag with nothing after it is refused by name, not read as an empty value', () => {
    expect(expectShortError(lathe(['sft', '--run-dir']), 2)[0]).toBe('lathe sft: --run-dir needs a value');
    expect(expectShortError(lathe(['sft', '--steps']), 2)[0]).toBe('lathe sft: --steps needs a value');
  }, 60_000);

  test('a value outside the choices names the flag, the choices and the nearest one', () => {
    const [msg] = expectShortError(lathe(['sft', '--schedule', 'cosin']), 2);
    expect(msg).toBe("lathe sft: --schedule must be one of constant, linear, cosine, got 'cosin' (did you mean 'cosine'?)");
  }, 30_000);

  test('an option given under two of its names is refused', () => {
    const [msg] = expectShortError(lathe(['sft', '--lr', '1e-3', '--learning_rate', '2e-3']), 2);
    expect(msg).toBe('lathe sft: --lr is given twice (as --lr and --learning_rate)');
  }, 30_000);

  test('a malformed YAML config names the file and the line', () => {
    const file = join(dir, 'broken.yaml');
    writeFileSync(file, 'steps: 3\nbatch_size: [4\nlr: 0.1\n');
    const [msg] = expectShortError(lathe(['sft', '--config', file]), 2);
    expect(msg).toMatch(new RegExp(`^lathe sft: ${file.replace(/[.]/g, '\\.')}:3:\\d+: malformed YAML \\(`));
    writeFileSync(file, 'steps: 3\nsteps: 4\n');
    expect(expectShortError(lathe(['sft', '--config', file]), 2)[0]).toMatch(new RegExp(`${file.replace(/[.]/g, '\\.')}:2:1: malformed YAML \\(Map keys must be unique\\)$`));
  }, 60_000);

  test('an unknown key in a YAML config names the file and suggests the option', () => {
    const file = join(dir, 'typo.yaml');
    writeFileSync(file, 'steps: 3\nwarmup_step: 5\n');
    const [msg] = expectShortError(lathe(['sft', '--config', file]), 2);
    expect(msg).toBe(`lathe sft: ${file}: unknown option 'warmup_step' (did you mean 'warmup_steps'?)`);
  }, 30_000);
});

describe('runtime failures: one line and a hint, exit code 1; the stack only with --verbose', () => {
  test('a missing input file', () => {
    const [msg, hint] = expectShortError(lathe(['grade', join(dir, 'missing.jsonl')]), 1);
    expect(msg).toMatch(/^lathe grade: .*missing\.jsonl: cannot read the input \(ENOENT\)$/);
    expect(hint).toMatch(/--verbose/);
    const verbose = lathe(['grade', join(dir, 'missing.jsonl'), '--verbose']);
    expect(verbose.status).toBe(1);
    expect(verbose.stderr).toMatch(/missing\.jsonl: cannot read the input/);
    expect(verbose.stderr).toMatch(/^\s+at .*grade\.ts/m);
  }, 60_000);
});

describe('flag names: kebab-case and the names TRL users type', () => {
  // yargs (ESM only) does not load under jest: `argv` here is what it hands a handler for these flags.
  const resolve = (argv: Record<string, unknown>) => configFromArgv(sftSchema, argv);

  test('--run-dir is --run_dir, --learning_rate is --lr, --max_steps is --steps, --output_dir is --run_dir', () => {
    expect(resolve({ 'run-dir': 'a', learning_rate: 0.001, max_steps: 7 })).toMatchObject({ run_dir: 'a', lr: 0.001, steps: 7 });
    expect(resolve({ output_dir: 'b', per_device_train_batch_size: 4, 'max-grad-norm': 0.5 })).toMatchObject({ run_dir: 'b', batch_size: 4, max_grad_norm: 0.5 });
  });

  test('the same names work in a YAML config, and flags override them', () => {
    const file = join(dir, 'trl.yaml');
    writeFileSync(file, 'learning_rate: 0.002\nrun-dir: c\nlogging_steps: 3\n');
    expect(resolve({ config: file })).toMatchObject({ lr: 0.002, run_dir: 'c', log_every: 3 });
    expect(resolve({ config: file, lr: 0.005 })).toMatchObject({ lr: 0.005, run_dir: 'c' });
  });

  test('lathe sft takes TRL and kebab-case flags, and the run saves them under their own names', () => {
    const run = join(dir, 'trl-run');
    const r = lathe(['sft', '--max_steps', '2', '--output_dir', run, '--per_device_train_batch_size', '4', '--eval-examples', '4', '--save-every', '0', '--learning_rate', '0.003']);
    expect(r.stderr).not.toMatch(/^lathe sft:/m);
    expect(r.status).toBe(0);
    const saved = readFileSync(join(run, 'config.yaml'), 'utf8');
    for (const line of ['steps: 2', 'batch_size: 4', 'eval_examples: 4', 'save_every: 0', 'lr: 0.003']) expect(saved).toMatch(new RegExp(`^${line}$`, 'm'));
  }, 60_000);

  test('a boolean flag in kebab-case does not swallow the positional after it', () => {
    const file = join(dir, 'preds.jsonl');
    writeFileSync(file, `${JSON.stringify({ pred: '$-2 \\le x \\le 7$', gold: '$[-2, 7]$' })}\n`); // correct only with --set_relation
    const r = lathe(['grade', '--set-relation', file]);
    expect(r.status).toBe(0);
    expect(JSON.parse(r.stdout.trim())).toMatchObject({ correct: true });
  }, 30_000);

  test('suggestions: an alias maps to its option, a near miss to the nearest name, a far one to nothing', () => {
    const names = Object.keys(sftSchema);
    expect(suggestName('learning_rate', names)).toBe('lr');
    expect(suggestName('warmup-step', names)).toBe('warmup_steps');
    expect(suggestName('gradient_checkpoint', names)).toBe('gradient_checkpointing');
    expect(suggestName('zzzzzz', names)).toBeUndefined();
  });
});

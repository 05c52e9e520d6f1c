/**
 * `lathe sft --serve_port`: the policy being trained answers OpenAI requests while it trains, read
 * from the Trainer's own parameters (with LoRA: the frozen base plus the adapters). Independent
 * truth: each answer's `system_fingerprint` names a step (`step-N`), and `lathe serve` on that
 * step's saved checkpoint gives the same greedy text.
 */
import { spawn } from 'node:child_process';
import { createServer, type Server } from 'node:net';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defaults, runSft, sftSchema, type SftConfig } from '@lathe/recipes';
import { serve, tinyServeModel } from './serve-helpers';

/** A port nothing listens on now. */
async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

const PROMPT = 'The sum of two and three is';

/** A greedy completion from a server: its text and the fingerprint it reports. */
async function complete(url: string, model: string): Promise<{ text: string; fingerprint: string }> {
  const res = await fetch(`${url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, prompt: PROMPT, max_tokens: 6, temperature: 0 }) });
  const body = (await res.json()) as { choices: { text: string }[]; system_fingerprint?: string };
  if (res.status !== 200) throw new Error(JSON.stringify(body));
  return { text: body.choices[0].text, fingerprint: body.system_fingerprint ?? '' };
}

const model = tinyServeModel('policy');

/** An SFT config on a few prompt/response rows that moves the tiny model's weights at every step. */
function sftConfig(root: string, over: Partial<SftConfig>): SftConfig {
  const data = join(root, 'pairs.jsonl');
  writeFileSync(data, Array.from({ length: 8 }, (_, i) => JSON.stringify({ prompt: `The sum of ${i} and three is`, response: ` ${i + 3}, of course.` })).join('\n'));
  return { ...defaults(sftSchema), model, data, run_dir: join(root, 'run'), steps: 3, batch_size: 2, max_length: 32, lr: 5e-2, warmup_steps: 0, schedule: 'constant', eval_examples: 0, save_every: 1, keep_last: 10, log_every: 1, ...over };
}

/**
 * A client in its own process (as a real one is: its requests reach the server while a train step
 * holds the run's event loop) asking greedy completions one after another until the server goes.
 */
function askingClient(url: string): { answers: Promise<{ text: string; fingerprint: string }[]> } {
  const code = `(async () => {
    for (;;) {
      let res;
      try {
        res = await fetch(${JSON.stringify(`${url}/completions`)}, { method: 'POST', headers: { 'content-type': 'application/json' }, body: ${JSON.stringify(JSON.stringify({ model: 'run', prompt: PROMPT, max_tokens: 6, temperature: 0 }))} });
      } catch { return; }
      const body = await res.json();
      if (res.status !== 200) { console.error(JSON.stringify(body)); process.exit(1); }
      console.log(JSON.stringify({ text: body.choices[0].text, fingerprint: body.system_fingerprint }));
    }
  })();`;
  const child = spawn(process.execPath, ['-e', code], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  return {
    answers: new Promise((resolve, reject) =>
      child.on('exit', (code) => (code === 0 ? resolve(out.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as { text: string; fingerprint: string })) : reject(new Error(`client exited ${code}: ${err}`)))),
    ),
  };
}

/**
 * Runs `cfg` while a client asks the served policy one greedy completion after another, then
 * checks every answer against `lathe serve` on the checkpoint of the step it names.
 */
async function servedAnswersMatchCheckpoints(root: string, cfg: SftConfig): Promise<void> {
  let client: ReturnType<typeof askingClient> | undefined;
  let url = '';
  const result = await runSft(cfg, {
    onServe: (u) => {
      url = u;
      client = askingClient(u);
    },
  });
  // the client stops when the server closes with the run
  const answers = await client!.answers;
  expect(result.steps).toBe(cfg.steps);
  expect(url).toBe(`http://127.0.0.1:${cfg.serve_port}/v1`);
  const steps = [...new Set(answers.map((a) => a.fingerprint))].sort();
  for (const f of steps) expect(f).toMatch(/^step-[0-3]$/);
  // requests are answered between steps, not only before or after the run
  expect(steps.length).toBeGreaterThanOrEqual(2);
  // one lathe serve over every step's checkpoint (step 0: the starting model), each its own model id
  const dirOf = (f: string) => {
    const step = Number(f.slice('step-'.length));
    return step === 0 ? model : join(root, 'run', 'checkpoints', `step-${String(step).padStart(8, '0')}`);
  };
  const s = await serve({ model: steps.map((f) => `${f}=${dirOf(f)}`).join(',') });
  try {
    for (const f of steps) {
      const seen = new Set(answers.filter((a) => a.fingerprint === f).map((a) => a.text));
      expect([f, seen.size]).toEqual([f, 1]);
      expect([f, (await complete(s.url, f)).text]).toEqual([f, [...seen][0]]);
    }
  } finally {
    await s.close();
  }
  // the port is free again once the run returns
  await expect(complete(url, 'run')).rejects.toThrow();
}

test('requests during a full fine-tuning SFT run are answered by the weights of the step they name, as lathe serve answers from that checkpoint', async () => {
  const root = mkdtempSync(join(tmpdir(), 'lathe-serve-sft-'));
  await servedAnswersMatchCheckpoints(root, sftConfig(root, { serve_port: await freePort() }));
}, 240_000);

test('with LoRA the served policy is the base plus the adapters being trained, as lathe serve answers from the merged checkpoint', async () => {
  const root = mkdtempSync(join(tmpdir(), 'lathe-serve-sft-lora-'));
  await servedAnswersMatchCheckpoints(root, sftConfig(root, { serve_port: await freePort(), lora_rank: 4, lora_alpha: 8, lr: 1e-1 }));
}, 240_000);

test('--serve_port refuses --quantize_base, and a taken port is an error naming it', async () => {
  const root = mkdtempSync(join(tmpdir(), 'lathe-serve-sft-bad-'));
  await expect(runSft(sftConfig(root, { serve_port: 1, lora_rank: 4, quantize_base: 'int8' }))).rejects.toThrow(/--serve_port with --quantize_base int8 is not supported/);
  const taken: Server = createServer();
  await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
  const port = (taken.address() as { port: number }).port;
  try {
    await expect(runSft(sftConfig(root, { serve_port: port, overwrite: true }))).rejects.toThrow(new RegExp(`--serve_host 127.0.0.1 --serve_port ${port}: cannot listen \\(EADDRINUSE\\)`));
  } finally {
    await new Promise<void>((r) => taken.close(() => r()));
  }
}, 120_000);

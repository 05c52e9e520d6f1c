/**
 * `lathe serve`'s run, `startServe(cfg)`: loads each model onto the device, builds its slot engine
 * and scheduler (continuous batching, @lathe/rollout's serve module) and its tokenizer, and starts
 * the OpenAI-compatible HTTP server over all of them. Options in serve-config.ts.
 */
import { existsSync } from 'node:fs';
import { basename, extname, join, resolve } from 'node:path';
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import type { DType } from '@lathe/onnx';
import { readConfig, type DecoderConfig } from '@lathe/models';
import { isQuantizedConfig, schemeFromConfig } from '@lathe/quantization';
import { HfTokenizer } from '@lathe/tokenizer';
import { createOpenAiServer, kvCacheUnsupported, registerServeTokenizerLoader, Scheduler, SlotEngine, startThreadedOpenAiServer, type ServedModel, type TokenizerSource } from '@lathe/rollout';
import type { ServeConfig } from './serve-config';
import { cudaDecodeFacts, decodeEngineOptions, resolveDecodeOptions, type DecodeEngineOptions, type DecodeFacts, type DecodeOptionsConfig, type ResolvedDecodeOptions } from './decode-options';
import { kernelsOfDevice, openDevice } from './scaffold';
import { denseEngineWeights, engineWeights, planModelWeights, type EngineWeights, type ModelWeights } from './model-weights';
import { isAdapterFolder, loadAdapterMerged, readAdapterConfig } from './serve-adapter';
import { loadServeTokenizer } from './serve-tokenizer';

// A bundled program's HTTP thread loads the bundle, and with it this registration.
registerServeTokenizerLoader('loadServeTokenizer', loadServeTokenizer);

/** Where the HTTP thread loads the Hugging Face tokenizer of `folder` (serve-tokenizer.ts, beside this file). */
export function hfTokenizerSource(folder: string): TokenizerSource {
  return { loader: 'loadServeTokenizer', module: join(__dirname, `serve-tokenizer${extname(__filename)}`), args: [resolve(folder)] };
}

/** One `--model` entry: the id clients send and the folder. */
export interface ServeModelSpec {
  id: string;
  dir: string;
  /** A LoRA adapter folder's base model folder (its adapters are merged in at load). */
  base?: string;
}

/** `--model` entries (`DIR` or `NAME=DIR`, comma-separated or repeated) → ids and folders; errors name the entry. */
export function parseServeModels(spec: string | readonly string[]): ServeModelSpec[] {
  const entries = (typeof spec === 'string' ? [spec] : spec).flatMap((s) => s.split(',')).map((s) => s.trim()).filter((s) => s !== '');
  if (entries.length === 0) throw new Error('--model is required (a model folder, or NAME=DIR; see lathe serve --help)');
  const out = entries.map((e) => {
    const eq = e.indexOf('=');
    const dir = eq > 0 ? e.slice(eq + 1) : e;
    const id = eq > 0 ? e.slice(0, eq) : basename(resolve(dir));
    if (!/^[\w.:/-]+$/.test(id)) throw new Error(`--model ${e}: the id '${id}' may hold letters, digits and . _ - : / only`);
    if (isAdapterFolder(dir)) {
      try {
        return { id, dir, base: readAdapterConfig(dir).base };
      } catch (err) {
        throw new Error(`--model ${e}: ${(err as Error).message}`);
      }
    }
    if (!existsSync(join(dir, 'config.json'))) throw new Error(`--model ${e}: no config.json in ${dir} (expected a Hugging Face model folder, or a LoRA adapter folder with adapter_config.json)`);
    return { id, dir };
  });
  const seen = new Set<string>();
  for (const m of out) {
    if (seen.has(m.id)) throw new Error(`--model: two models have the id '${m.id}'; name them with NAME=DIR`);
    seen.add(m.id);
  }
  return out;
}

/** Callbacks for progress. */
export interface ServeEvents {
  /**
   * A model is loading (before its weights are read), with its slot engine's decode options as resolved
   * (`describeDecode` words them) and how its weights will run (`describeWeights` words them).
   */
  onLoad?(info: { id: string; dir: string; rows: number; maxModelLen: number; dtype: DType; decode: ResolvedDecodeOptions; weights: ModelWeights }): void;
  /** A model's weights are on the device: how they run, with what the load measured (bytes, uint8 code tensors, the W4A16 plans' tuning time). */
  onLoaded?(info: { id: string; weights: ModelWeights }): void;
  /** One line per finished HTTP request. */
  onRequest?(line: string): void;
}

/** A running server. */
export interface RunningServe {
  /** The HTTP server, when it runs on this thread (`http_thread` false). */
  server: Server | undefined;
  /** The base URL of the API, e.g. `http://127.0.0.1:8000/v1`. */
  url: string;
  port: number;
  models: ServedModel[];
  /** Stops accepting connections, lets running requests finish, then frees engines and weights. */
  close(): Promise<void>;
}

/** Starts `server` listening on `host`:`port`; a failure is an error naming both flags (and, for a taken port, what to do). */
export async function listenOn(server: Server, host: string, port: number): Promise<void> {
  try {
    await new Promise<void>((res, rej) => {
      server.once('error', rej);
      server.listen(port, host, () => {
        server.off('error', rej);
        res();
      });
    });
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new Error(`--host ${host} --port ${port}: cannot listen (${code ?? (e as Error).message})${code === 'EADDRINUSE' ? '; the port is taken: choose another with --port' : ''}`);
  }
}

/**
 * The decode options of a served model: `lathe generate`'s resolution (errors name the flags), on
 * the slot engine — a KV-cache engine — with what cuda adds: whether Lathe's kernels can run (the
 * GPU already opened through them, or NVRTC and the driver found) and whether the decode attention
 * kernel takes the model's heads in `dtype`.
 */
export function resolveServeDecode(cfg: Pick<ServeConfig, 'device' | keyof DecodeOptionsConfig>, config: DecoderConfig, dtype: DType): ResolvedDecodeOptions {
  const facts: DecodeFacts = { device: cfg.device, engine: 'kv-cache', ...(cfg.device === 'cuda' ? cudaDecodeFacts(config, dtype, cfg.kv_cache_dtype) : {}) };
  const { kv_cache_dtype, decode_attention, swiglu_kernel, residual_dtype } = cfg;
  return resolveDecodeOptions({ kv_cache_dtype, decode_attention, swiglu_kernel, residual_dtype }, facts);
}

/** The decode options' notes written to stderr in this process: each once (a process may start several servers, as lathe studio does). */
const notesWritten = new Set<string>();

/** Loads every model, starts the server and resolves once it listens. */
export async function startServe(cfg: ServeConfig, events: ServeEvents = {}): Promise<RunningServe> {
  const specs = parseServeModels(cfg.model);
  if (cfg.device === 'cpu' && (cfg.compute_dtype === 'bfloat16' || cfg.compute_dtype === 'float16')) throw new Error(`--compute_dtype ${cfg.compute_dtype} needs --device cuda (ONNX Runtime's CPU kernels are float32)`);
  if (cfg.cuda_graph && cfg.device !== 'cuda') throw new Error('--cuda_graph needs --device cuda');
  const warmLengths = cfg.warm_prefill === '' ? [] : cfg.warm_prefill.split(',').map((x) => Number(x.trim()));
  const badLength = warmLengths.find((n) => !Number.isInteger(n) || n < 1);
  if (badLength !== undefined) throw new Error(`--warm_prefill: '${cfg.warm_prefill}' must be comma-separated positive integers (prompt lengths)`);
  const dtype: DType = cfg.compute_dtype === 'auto' ? (cfg.device === 'cuda' ? 'bfloat16' : 'float32') : cfg.compute_dtype;
  // Everything checked before any weights are read.
  const plans = await Promise.all(
    specs.map(async (s) => {
      const { config, raw } = readConfig(s.base ?? s.dir);
      const scheme = isQuantizedConfig(raw) ? schemeFromConfig(raw, join(s.base ?? s.dir, 'config.json')) : undefined;
      if (scheme && s.base && cfg.quantized_weights === 'auto') {
        throw new Error(`--model ${s.dir}: a LoRA adapter over a quantized base (${s.base}, ${scheme.format}) is served merged into the dequantized base; pass --quantized_weights dequantize`);
      }
      const why = kvCacheUnsupported(config, cfg.device, dtype);
      if (why) throw new Error(`--model ${s.dir}: the serving engine cannot run this model: ${why}`);
      const maxModelLen = cfg.max_model_len || Math.min(config.maxPositionEmbeddings, 4096);
      if (maxModelLen > config.maxPositionEmbeddings) throw new Error(`--max_model_len ${maxModelLen} exceeds ${s.dir}'s max_position_embeddings (${config.maxPositionEmbeddings})`);
      if (maxModelLen < 2) throw new Error(`--max_model_len must be at least 2, got ${maxModelLen}`);
      // an adapter folder without tokenizer files uses its base's
      const tokDir = cfg.tokenizer !== 'model' ? cfg.tokenizer : s.base && !existsSync(join(s.dir, 'tokenizer.json')) ? s.base : s.dir;
      let tokenizer: HfTokenizer;
      try {
        tokenizer = await HfTokenizer.fromFolder(tokDir);
      } catch (e) {
        throw new Error(`${cfg.tokenizer === 'model' ? `--model ${s.dir}` : `--tokenizer ${cfg.tokenizer}`}: ${(e as Error).message}`);
      }
      tokenizer.tokenBytes(); // builds the per-token byte table now rather than in the first request
      if (tokenizer.vocabSize > config.vocabSize) throw new Error(`--model ${s.dir}: the tokenizer has ${tokenizer.vocabSize} ids, the model's vocab_size is ${config.vocabSize}`);
      const eos = config.eosTokenId;
      const stopIds = [...new Set([tokenizer.eosId, ...(eos === undefined ? [] : Array.isArray(eos) ? eos : [eos])])];
      const facts = cfg.device === 'cuda' ? cudaDecodeFacts(config, dtype, cfg.kv_cache_dtype) : {};
      const weights = planModelWeights(scheme, { request: cfg.quantized_weights as 'auto' | 'dequantize', device: cfg.device, dtype, engine: { engine: 'kv-cache' }, kernelsUnavailable: facts.kernelsUnavailable });
      const decode = resolveServeDecode(cfg, config, dtype);
      // packing q/k/v and gate/up is for dense weights: a quantized model's kernel path concatenates its own
      const quantized = weights.runs !== 'dense' && weights.runs !== 'dequantized';
      return { ...s, config, maxModelLen, tokenizer, tokDir, stopIds, weights, decode: quantized ? { ...decode, concatProjections: false } : decode };
    }),
  );
  for (const p of plans) {
    if (p.decode.note && !notesWritten.has(p.decode.note)) {
      notesWritten.add(p.decode.note);
      process.stderr.write(`${p.decode.note}\n`);
    }
  }
  // on cuda through Lathe's kernels where NVRTC is present, so the decode options' kernels run on the sessions' stream
  const device = openDevice(cfg.device);
  const loaded: { weights: EngineWeights; engine?: SlotEngine; ops: DecodeEngineOptions }[] = [];
  const free = () => {
    for (const l of loaded) {
      l.engine?.dispose();
      l.ops.dispose();
      l.weights.dispose();
    }
  };
  const models: (ServedModel & { tokenizerSource: TokenizerSource })[] = [];
  try {
    for (const p of plans) {
      events.onLoad?.({ id: p.id, dir: p.dir, rows: cfg.max_rows, maxModelLen: p.maxModelLen, dtype, decode: p.decode, weights: p.weights });
      const kernels = cfg.device === 'cuda' ? kernelsOfDevice(0) : undefined;
      const weights = p.base ? denseEngineWeights(loadAdapterMerged(p.dir, { device, dtype })) : engineWeights(p.dir, device, dtype, p.weights.runs, kernels);
      let ops: DecodeEngineOptions;
      try {
        ops = decodeEngineOptions(p.decode, kernels, p.config);
      } catch (e) {
        weights.dispose();
        throw e;
      }
      const l: (typeof loaded)[number] = { weights, ops };
      loaded.push(l);
      events.onLoaded?.({ id: p.id, weights: { ...p.weights, ...weights.loaded } });
      const engine = weights.createSlots({
        slots: cfg.max_rows,
        maxLength: p.maxModelLen,
        padTokenId: p.tokenizer.padId < p.config.vocabSize ? p.tokenizer.padId : 0,
        maxTopLogprobs: cfg.max_logprobs,
        cudaGraph: cfg.cuda_graph,
        prefillGraphs: cfg.prefill_graphs,
        ...ops.options,
      });
      l.engine = engine;
      engine.warm();
      try {
        if (warmLengths.length) engine.warmPrefills(warmLengths, cfg.max_prefill_tokens);
      } catch (e) {
        throw new Error(`--warm_prefill: ${(e as Error).message}`);
      }
      const scheduler = new Scheduler(engine, { maxQueue: cfg.max_queue, maxTokens: cfg.max_num_tokens || undefined, maxPrefillTokens: cfg.max_prefill_tokens, admitWaitMs: cfg.admit_wait_ms });
      models.push({ id: p.id, scheduler, tokenizer: p.tokenizer, tokenizerSource: hfTokenizerSource(p.tokDir), stopIds: p.stopIds, maxN: Math.min(cfg.max_n, cfg.max_rows) });
    }
  } catch (e) {
    free();
    throw e;
  }
  const host = cfg.host.includes(':') ? `[${cfg.host}]` : cfg.host;
  if (cfg.http_thread) {
    let threaded: Awaited<ReturnType<typeof startThreadedOpenAiServer>>;
    try {
      threaded = await startThreadedOpenAiServer({ models, host: cfg.host, port: cfg.port, ...(events.onRequest ? { log: events.onRequest } : {}) });
    } catch (e) {
      free();
      throw e;
    }
    return {
      server: undefined,
      url: `http://${host}:${threaded.port}/v1`,
      port: threaded.port,
      models,
      close: async () => {
        await threaded.close();
        free();
      },
    };
  }
  const server = createOpenAiServer({ models, log: events.onRequest });
  try {
    await listenOn(server, cfg.host, cfg.port);
  } catch (e) {
    free();
    throw e;
  }
  const port = (server.address() as AddressInfo).port;
  return {
    server,
    url: `http://${host}:${port}/v1`,
    port,
    models,
    close: async () => {
      for (const m of models) m.scheduler.close();
      const closed = new Promise<void>((r) => server.close(() => r()));
      server.closeIdleConnections();
      await Promise.all(models.map((m) => m.scheduler.idle()));
      server.closeAllConnections(); // clients' idle keep-alive sockets
      await closed;
      free();
    },
  };
}

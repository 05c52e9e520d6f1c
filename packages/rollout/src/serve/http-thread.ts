/**
 * The OpenAI-compatible server with its HTTP layer on a worker thread: node:http, parsing and
 * validation, chat templates, detokenisation, stop strings and SSE/JSON writing run there
 * (http-worker.ts), so that this thread — the one that owns the device, and with `lathe sft/grpo
 * --serve_port` the trainer's — runs only the schedulers' decode loops. Requests come here as
 * compact messages; each turn of a decode loop sends every row's tokens back in one message of
 * typed arrays (thread-protocol.ts). Back-pressure stays the scheduler's: a full queue answers the
 * HTTP thread's submit with a refusal, which becomes the 429.
 */
import { existsSync } from 'node:fs';
import { basename, join } from 'node:path';
import { Worker } from 'node:worker_threads';
import { ServerBusyError, type FinishReason, type Ticket } from './scheduler';
import type { ServedModel } from './openai-server';
import type { SlotToken } from './slot-engine';
import { FINISH_REASONS, type DownMessage, type TokenBatch, type TokenizerSource, type UpMessage, type WorkerInit } from './thread-protocol';

export { registerServeTokenizerLoader, type ServeTokenizerLoader } from './http-worker';
export type { TokenizerSource } from './thread-protocol';

/** A model served from the HTTP thread: a {@link ServedModel} and where that thread loads its tokenizer. */
export interface ThreadedModel extends ServedModel {
  tokenizerSource: TokenizerSource;
}

/** Options of {@link startThreadedOpenAiServer}. */
export interface ThreadedServerOptions {
  models: readonly ThreadedModel[];
  host: string;
  /** 0: any free port. */
  port: number;
  maxBodyBytes?: number;
  /** One line per finished request (method, path, status, milliseconds). */
  log?: (line: string) => void;
  /** Modules the HTTP thread loads before it starts (e.g. the tokenizer loaders' files); ignored in a bundle. */
  modules?: readonly string[];
}

/** A listening threaded server. */
export interface ThreadedServer {
  port: number;
  /** Stops accepting connections and refuses new requests, lets running ones finish, then ends the HTTP thread. */
  close(): Promise<void>;
}

/** A growing typed array. */
class Grow<T extends Int32Array | Float32Array | Uint8Array> {
  private a: T;
  n = 0;
  constructor(private readonly make: (n: number) => T) {
    this.a = make(256);
  }
  push(x: number): void {
    if (this.n === this.a.length) {
      const b = this.make(this.a.length * 2);
      b.set(this.a);
      this.a = b;
    }
    this.a[this.n++] = x;
  }
  /** The values so far, in a buffer of their own (to transfer); empties this. */
  take(): T {
    const out = this.a.slice(0, this.n) as T;
    this.n = 0;
    return out;
  }
}

/** A batch being gathered over one turn of the decode loop. */
class BatchBuilder {
  admitted = new Grow((n) => new Int32Array(n));
  fingerprints: (string | null)[] = [];
  req = new Grow((n) => new Int32Array(n));
  choice = new Grow((n) => new Int32Array(n));
  token = new Grow((n) => new Int32Array(n));
  raw = new Grow((n) => new Float32Array(n));
  stop = new Grow((n) => new Uint8Array(n));
  topCount = new Grow((n) => new Int32Array(n));
  topIds = new Grow((n) => new Int32Array(n));
  topLogprobs = new Grow((n) => new Float32Array(n));
  finReq = new Grow((n) => new Int32Array(n));
  finChoice = new Grow((n) => new Int32Array(n));
  finReason = new Grow((n) => new Uint8Array(n));
  failed: { id: number; message: string }[] = [];

  get empty(): boolean {
    return this.admitted.n === 0 && this.req.n === 0 && this.finReq.n === 0 && this.failed.length === 0;
  }

  token1(id: number, choice: number, t: SlotToken, stop: boolean): void {
    this.req.push(id);
    this.choice.push(choice);
    this.token.push(t.token);
    this.raw.push(t.rawLogprob);
    this.stop.push(stop ? 1 : 0);
    const k = t.top?.ids.length ?? 0;
    this.topCount.push(k);
    for (let j = 0; j < k; j++) {
      this.topIds.push(t.top!.ids[j]);
      this.topLogprobs.push(t.top!.logprobs[j]);
    }
  }

  finish(id: number, choice: number, reason: FinishReason): void {
    this.finReq.push(id);
    this.finChoice.push(choice);
    this.finReason.push(FINISH_REASONS.indexOf(reason));
  }

  take(): { batch: TokenBatch; transfer: ArrayBuffer[] } {
    const batch: TokenBatch = {
      t: 'batch',
      admitted: this.admitted.take(),
      fingerprints: this.fingerprints,
      req: this.req.take(),
      choice: this.choice.take(),
      token: this.token.take(),
      raw: this.raw.take(),
      stop: this.stop.take(),
      topCount: this.topCount.take(),
      topIds: this.topIds.take(),
      topLogprobs: this.topLogprobs.take(),
      finReq: this.finReq.take(),
      finChoice: this.finChoice.take(),
      finReason: this.finReason.take(),
      failed: this.failed,
    };
    this.fingerprints = [];
    this.failed = [];
    const transfer = [batch.admitted, batch.req, batch.choice, batch.token, batch.raw, batch.stop, batch.topCount, batch.topIds, batch.topLogprobs, batch.finReq, batch.finChoice, batch.finReason].map((a) => a.buffer as ArrayBuffer);
    return { batch, transfer };
  }
}

/**
 * How to start the HTTP thread from here: from its TypeScript source (through tsx, the workspace's
 * packages by their lathe-source condition), from the compiled http-worker.js beside this file,
 * or, in a bundle (this file is the bundle), the bundle itself — its entry must then do nothing
 * outside the main thread (`if (isMainThread) main()`).
 */
function workerOf(init: WorkerInit): Worker {
  const name = basename(__filename);
  if (name === 'http-thread.ts') {
    const boot = `require(${JSON.stringify(require.resolve('tsx/cjs'))});require(${JSON.stringify(join(__dirname, 'http-worker.ts'))});`;
    return new Worker(boot, { eval: true, workerData: init, execArgv: ['--conditions=lathe-source'] });
  }
  if (name === 'http-thread.js' && existsSync(join(__dirname, 'http-worker.js'))) return new Worker(join(__dirname, 'http-worker.js'), { workerData: init });
  return new Worker(__filename, { workerData: { ...init, modules: [] } });
}

/**
 * Starts the HTTP thread over the models' schedulers (on this thread) and resolves once it
 * listens on `host`:`port`; a failure to listen is an error naming both (as `--host`/`--port`).
 */
export async function startThreadedOpenAiServer(opts: ThreadedServerOptions): Promise<ThreadedServer> {
  const ids = new Set(opts.models.map((m) => m.id));
  if (ids.size !== opts.models.length) throw new Error(`two served models share an id: ${opts.models.map((m) => m.id).join(', ')}`);
  const init: WorkerInit = {
    latheServeHttp: 1,
    models: opts.models.map((m) => ({ id: m.id, tokenizer: m.tokenizerSource, stopIds: [...m.stopIds], maxN: m.maxN, limits: m.scheduler.limits, fingerprint: m.fingerprint?.() ?? null })),
    host: opts.host,
    port: opts.port,
    ...(opts.maxBodyBytes ? { maxBodyBytes: opts.maxBodyBytes } : {}),
    log: opts.log !== undefined,
    modules: [...(opts.modules ?? [])],
  };
  const worker = workerOf(init);
  const bridge = new Bridge(worker, opts.models);
  let port: number;
  try {
    port = await new Promise<number>((resolve, reject) => {
      bridge.onStart = (m) => (m.t === 'listening' ? resolve(m.port) : reject(m));
      worker.once('error', (e) => reject(new Error(`the HTTP thread failed to start: ${e.message}`)));
      worker.once('exit', (code) => reject(new Error(`the HTTP thread exited (${code}) before listening`)));
    });
  } catch (e) {
    await worker.terminate();
    if (e instanceof Error) throw e;
    const f = e as { message: string; code?: string };
    throw new Error(`--host ${opts.host} --port ${opts.port}: cannot listen (${f.code ?? f.message})${f.code === 'EADDRINUSE' ? '; the port is taken: choose another with --port' : ''}`);
  }
  bridge.log = opts.log;
  worker.removeAllListeners('exit');
  worker.removeAllListeners('error');
  let closing = false;
  worker.on('error', (e) => opts.log?.(`the HTTP thread failed: ${e.message}`));
  worker.on('exit', (code) => {
    if (!closing) opts.log?.(`the HTTP thread exited (${code}): no requests are served`);
  });
  return {
    port,
    close: async () => {
      closing = true;
      for (const m of opts.models) m.scheduler.close();
      const closed = new Promise<void>((r) => (bridge.onClosed = r));
      bridge.send({ t: 'close' });
      await Promise.all(opts.models.map((m) => m.scheduler.idle()));
      await bridge.flushed();
      bridge.send({ t: 'drop' });
      await closed;
      await worker.terminate();
    },
  };
}

/** This thread's end: submits to the schedulers, gathers their tokens into one batch per turn of the loop. */
class Bridge {
  private readonly tickets = new Map<number, Ticket>();
  private readonly batch = new BatchBuilder();
  private flushQueued = false;
  onStart: ((m: { t: 'listening'; port: number } | { t: 'fatal'; message: string; code?: string }) => void) | undefined;
  onClosed: (() => void) | undefined;
  log: ((line: string) => void) | undefined;

  constructor(
    private readonly worker: Worker,
    private readonly models: readonly ThreadedModel[],
  ) {
    worker.on('message', (m: UpMessage) => this.receive(m));
  }

  send(m: DownMessage, transfer: ArrayBuffer[] = []): void {
    this.worker.postMessage(m, transfer);
  }

  /** Resolves once the gathered batch went out. */
  async flushed(): Promise<void> {
    this.flush();
    await new Promise((r) => setImmediate(r));
  }

  /** Sends the batch at the end of this turn of the event loop: one message per decode-loop turn. */
  private queueFlush(): void {
    if (this.flushQueued) return;
    this.flushQueued = true;
    queueMicrotask(() => this.flush());
  }

  private flush(): void {
    this.flushQueued = false;
    if (this.batch.empty) return;
    const { batch, transfer } = this.batch.take();
    this.send(batch, transfer);
  }

  private receive(m: UpMessage): void {
    switch (m.t) {
      case 'listening':
      case 'fatal':
        return this.onStart?.(m);
      case 'closed':
        return this.onClosed?.();
      case 'log':
        return this.log?.(m.line);
      case 'load': {
        const s = this.models[m.model].scheduler;
        return this.send({ t: 'load', q: m.q, load: { ...s.load, slots: s.engine.slots } });
      }
      case 'cancel':
        return this.tickets.get(m.id)?.cancel();
      case 'stop':
        return this.tickets.get(m.id)?.stop(m.choice);
      case 'submit':
        return this.submit(m);
    }
  }

  private submit(m: Extract<UpMessage, { t: 'submit' }>): void {
    const model = this.models[m.model];
    const b = this.batch;
    const id = m.id;
    let ticket: Ticket;
    try {
      ticket = model.scheduler.submit({
        prompt: Array.from(m.prompt),
        n: m.n,
        maxTokens: m.maxTokens,
        sampling: m.sampling,
        seed: m.seed,
        topLogprobs: m.topLogprobs,
        stopIds: new Set(m.stopIds),
        onAdmit: () => {
          b.admitted.push(id);
          b.fingerprints.push(model.fingerprint?.() ?? null);
          this.queueFlush();
        },
        onToken: (choice: number, t: SlotToken, stop: boolean) => {
          b.token1(id, choice, t, stop);
          this.queueFlush();
        },
        onFinish: (choice: number, reason: FinishReason) => {
          b.finish(id, choice, reason);
          this.queueFlush();
        },
      });
    } catch (e) {
      const busy = e instanceof ServerBusyError;
      this.send({ t: 'refused', id, message: (e as Error).message, busy, retryAfter: busy ? e.retryAfterSeconds : 0 });
      return;
    }
    this.tickets.set(id, ticket);
    this.send({ t: 'accepted', id });
    ticket.done.then(
      () => this.tickets.delete(id),
      (e: Error) => {
        this.tickets.delete(id);
        b.failed.push({ id, message: e.message });
        this.queueFlush();
      },
    );
  }
}

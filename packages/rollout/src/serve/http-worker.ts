/**
 * The HTTP thread of startThreadedOpenAiServer (http-thread.ts): node:http, request parsing and
 * validation, chat templates, detokenisation, stop strings and SSE/JSON writing, over proxies of
 * the schedulers on the thread that owns the device (thread-protocol.ts). It loads the tokenizers
 * itself (a tokenizer object cannot cross threads). Started with `workerData.latheServeHttp` set,
 * it runs on load.
 */
import { isMainThread, parentPort, workerData, type MessagePort } from 'node:worker_threads';
import { createEndpointServer, type EndpointRequest, type EndpointTicket, type ModelEndpoint } from './openai-server';
import { ServerBusyError, type FinishReason } from './scheduler';
import type { ServeTokenizer } from './text';
import { FINISH_REASONS, type DownMessage, type TokenBatch, type TokenizerSource, type UpMessage, type WorkerInit, type WorkerModel } from './thread-protocol';

/** Loads a tokenizer from a {@link TokenizerSource}'s arguments. */
export type ServeTokenizerLoader = (...args: never[]) => Promise<ServeTokenizer>;

const loaders = new Map<string, ServeTokenizerLoader>();

/**
 * Registers a tokenizer loader by name, for the HTTP thread of a bundled program (where it cannot
 * load a module by path, the whole bundle being loaded there): register it at module load.
 */
export function registerServeTokenizerLoader(name: string, load: ServeTokenizerLoader): void {
  loaders.set(name, load);
}

async function loadTokenizer(src: TokenizerSource): Promise<ServeTokenizer> {
  const registered = loaders.get(src.loader);
  if (registered) return (registered as (...a: unknown[]) => Promise<ServeTokenizer>)(...src.args);
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const mod = require(src.module) as Record<string, unknown>;
  const load = mod[src.loader];
  if (typeof load !== 'function') throw new Error(`${src.module} has no function '${src.loader}' to load a tokenizer with`);
  return (load as (...a: unknown[]) => Promise<ServeTokenizer>)(...src.args);
}

interface Pending {
  model: number;
  req: EndpointRequest;
  finished: boolean[];
  open: number;
  accept: { resolve: () => void; reject: (e: Error) => void };
  done: { resolve: () => void; reject: (e: Error) => void };
  /** A sample ended with an engine error; `failure` is that error once it arrived. */
  errored?: boolean;
  failure?: Error;
}

/** The device thread's schedulers, seen from here. */
class Remote {
  private nextId = 1;
  private nextQuery = 1;
  readonly pending = new Map<number, Pending>();
  private readonly queries = new Map<number, (load: Record<string, number>) => void>();
  readonly fingerprints: (string | null)[];

  constructor(
    private readonly port: MessagePort,
    models: readonly WorkerModel[],
  ) {
    this.fingerprints = models.map((m) => m.fingerprint);
  }

  post(m: UpMessage, transfer: ArrayBuffer[] = []): void {
    this.port.postMessage(m, transfer);
  }

  endpoint(index: number, m: WorkerModel, tokenizer: ServeTokenizer): ModelEndpoint {
    return {
      id: m.id,
      tokenizer,
      stopIds: m.stopIds,
      maxN: m.maxN,
      limits: m.limits,
      fingerprint: () => this.fingerprints[index],
      load: () =>
        new Promise((resolve) => {
          const q = this.nextQuery++;
          this.queries.set(q, resolve);
          this.post({ t: 'load', q, model: index });
        }),
      submit: (req) => this.submit(index, req),
    };
  }

  private submit(model: number, req: EndpointRequest): EndpointTicket {
    const id = this.nextId++;
    let accept!: Pending['accept'];
    let done!: Pending['done'];
    const accepted = new Promise<void>((resolve, reject) => (accept = { resolve, reject }));
    const finished = new Promise<void>((resolve, reject) => (done = { resolve, reject }));
    // a refusal rejects both; the HTTP layer awaits `accepted` first
    finished.catch(() => undefined);
    this.pending.set(id, { model, req, finished: new Array<boolean>(req.n).fill(false), open: req.n, accept, done });
    const prompt = Int32Array.from(req.prompt);
    const stopIds = Int32Array.from(req.stopIds);
    this.post({ t: 'submit', id, model, prompt, n: req.n, maxTokens: req.maxTokens, sampling: req.sampling, seed: req.seed, topLogprobs: req.topLogprobs, stopIds }, [prompt.buffer as ArrayBuffer, stopIds.buffer as ArrayBuffer]);
    return { accepted, done: finished, cancel: () => this.pending.has(id) && this.post({ t: 'cancel', id }) };
  }

  private finish(id: number, p: Pending, choice: number, reason: FinishReason): void {
    if (p.finished[choice]) return;
    p.finished[choice] = true;
    p.open--;
    if (reason === 'error') p.errored = true;
    try {
      p.req.onFinish(choice, reason);
    } finally {
      this.settle(id, p);
    }
  }

  /** Once every sample ended: done resolves, or rejects with the engine's error (which may come in the next batch). */
  private settle(id: number, p: Pending): void {
    if (p.open > 0) return;
    if (p.failure) {
      this.pending.delete(id);
      p.done.reject(p.failure);
    } else if (!p.errored) {
      this.pending.delete(id);
      p.done.resolve();
    }
  }

  receive(m: DownMessage): void {
    switch (m.t) {
      case 'batch':
        return this.batch(m);
      case 'accepted':
        return this.pending.get(m.id)?.accept.resolve();
      case 'refused': {
        const p = this.pending.get(m.id);
        this.pending.delete(m.id);
        const e = m.busy ? new ServerBusyError(m.message, m.retryAfter) : new Error(m.message);
        p?.accept.reject(e);
        p?.done.reject(e);
        return;
      }
      case 'load':
        this.queries.get(m.q)?.(m.load);
        this.queries.delete(m.q);
        return;
      default:
        return;
    }
  }

  private batch(b: TokenBatch): void {
    b.admitted.forEach((id, i) => {
      const p = this.pending.get(id);
      if (!p) return;
      this.fingerprints[p.model] = b.fingerprints[i];
      p.req.onAdmit(b.fingerprints[i]);
    });
    let top = 0;
    for (let i = 0; i < b.req.length; i++) {
      const id = b.req[i];
      const k = b.topCount[i];
      const at = top;
      top += k;
      const p = this.pending.get(id);
      const choice = b.choice[i];
      if (!p || p.finished[choice]) continue; // stopped here or cancelled: the device thread's later tokens are dropped
      const stop = b.stop[i] === 1;
      const alternatives = k > 0 ? { ids: Array.from(b.topIds.subarray(at, at + k)), logprobs: Array.from(b.topLogprobs.subarray(at, at + k)) } : undefined;
      let end = false;
      try {
        end = p.req.onToken(choice, b.token[i], b.raw[i], alternatives, stop);
      } catch {
        end = true; // a consumer that throws ends its sample, as the scheduler does
      }
      if (end && !stop) {
        // a stop string: the sample ends here now; the device thread frees its row
        this.post({ t: 'stop', id, choice });
        this.finish(id, p, choice, 'stop');
      }
    }
    for (const f of b.failed) {
      const p = this.pending.get(f.id);
      if (!p) continue;
      p.failure = new Error(f.message);
      this.settle(f.id, p);
    }
    for (let i = 0; i < b.finReq.length; i++) {
      const p = this.pending.get(b.finReq[i]);
      if (p) this.finish(b.finReq[i], p, b.finChoice[i], FINISH_REASONS[b.finReason[i]]);
    }
  }
}

/** Runs the HTTP thread: loads the tokenizers, listens, then serves until told to close. */
export async function runHttpWorker(init: WorkerInit, port: MessagePort): Promise<void> {
  // let the rest of a bundle finish loading (its tokenizer loaders register themselves at load)
  await new Promise((r) => setImmediate(r));
  const remote = new Remote(port, init.models);
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    for (const m of init.modules) require(m);
    const tokenizers = await Promise.all(init.models.map((m) => loadTokenizer(m.tokenizer)));
    const endpoints = init.models.map((m, i) => remote.endpoint(i, m, tokenizers[i]));
    const server = createEndpointServer(endpoints, { ...(init.maxBodyBytes ? { maxBodyBytes: init.maxBodyBytes } : {}), ...(init.log ? { log: (line: string) => remote.post({ t: 'log', line }) } : {}) });
    port.on('message', (m: DownMessage) => {
      if (m.t === 'close') {
        server.close(() => remote.post({ t: 'closed' }));
        server.closeIdleConnections();
      } else if (m.t === 'drop') {
        // the last responses were written just now: let the sockets flush them first
        setTimeout(() => server.closeAllConnections(), 20);
      } else remote.receive(m);
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(init.port, init.host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    const address = server.address();
    remote.post({ t: 'listening', port: typeof address === 'object' && address ? address.port : init.port });
  } catch (e) {
    remote.post({ t: 'fatal', message: (e as Error).message, ...((e as NodeJS.ErrnoException).code ? { code: (e as NodeJS.ErrnoException).code } : {}) });
  }
}

if (!isMainThread && parentPort && (workerData as Partial<WorkerInit> | null)?.latheServeHttp === 1) void runHttpWorker(workerData as WorkerInit, parentPort);

/**
 * The messages between the thread that owns the device (schedulers) and the HTTP thread
 * (http-thread.ts, http-worker.ts). Requests go down as compact messages (token ids in typed
 * arrays); tokens come back batched, one message per turn of the decode loop for every row, in
 * typed arrays whose buffers are transferred, not one message or object per token.
 */
import type { FinishReason, ServeLimits } from './scheduler';
import type { RowSampling } from './slot-engine';

/** Where the HTTP thread gets a model's tokenizer: a loader registered by name, or else the named export of a module file, called with `args`. */
export interface TokenizerSource {
  /** The loader's name (see registerServeTokenizerLoader), and the export of `module` that is it. */
  loader: string;
  /** An absolute module path that exports `loader` (source and compiled runs; a bundle uses the registered loader). */
  module: string;
  /** The loader's arguments (structured-cloneable), e.g. the tokenizer folder. */
  args: unknown[];
}

/** One served model as the HTTP thread learns it at start. */
export interface WorkerModel {
  id: string;
  tokenizer: TokenizerSource;
  stopIds: number[];
  maxN: number;
  limits: ServeLimits;
  fingerprint: string | null;
}

/** The HTTP thread's `workerData`. */
export interface WorkerInit {
  latheServeHttp: 1;
  models: WorkerModel[];
  host: string;
  port: number;
  maxBodyBytes?: number;
  /** Whether to send a log line per finished request. */
  log: boolean;
  /** Modules the thread loads first (none in a bundle: it is the whole bundle). */
  modules: string[];
}

/** Finish reasons by code in {@link TokenBatch.finReason}. */
export const FINISH_REASONS: readonly FinishReason[] = ['stop', 'length', 'cancelled', 'error'];

/** Everything one turn of the decode loop produced for the HTTP thread's requests, in order: admissions, tokens, finishes, failures. */
export interface TokenBatch {
  t: 'batch';
  /** Request ids whose rows entered the engine, and each one's fingerprint then. */
  admitted: Int32Array;
  fingerprints: (string | null)[];
  /** One entry per token: request id, sample, token id, raw log-prob, 1 when it is a stop id. */
  req: Int32Array;
  choice: Int32Array;
  token: Int32Array;
  raw: Float32Array;
  stop: Uint8Array;
  /** Per token, how many top alternatives follow in topIds/topLogprobs (0: none asked). */
  topCount: Int32Array;
  topIds: Int32Array;
  topLogprobs: Float32Array;
  /** Samples that ended: request id, sample, index into FINISH_REASONS. */
  finReq: Int32Array;
  finChoice: Int32Array;
  finReason: Uint8Array;
  /** Requests the engine failed. */
  failed: { id: number; message: string }[];
}

/** HTTP thread → device thread. */
export type UpMessage =
  | { t: 'listening'; port: number }
  /** The thread could not start (`code`: the listen error's, e.g. EADDRINUSE). */
  | { t: 'fatal'; message: string; code?: string }
  | { t: 'submit'; id: number; model: number; prompt: Int32Array; n: number; maxTokens: number; sampling: RowSampling; seed: number; topLogprobs: number; stopIds: Int32Array }
  | { t: 'cancel'; id: number }
  /** End one sample now (a stop string appeared in its text). */
  | { t: 'stop'; id: number; choice: number }
  | { t: 'load'; q: number; model: number }
  | { t: 'log'; line: string }
  | { t: 'closed' };

/** Device thread → HTTP thread. */
export type DownMessage =
  | TokenBatch
  | { t: 'accepted'; id: number }
  | { t: 'refused'; id: number; message: string; busy: boolean; retryAfter: number }
  | { t: 'load'; q: number; load: Record<string, number> }
  /** Stop accepting connections (running requests go on). */
  | { t: 'close' }
  /** Every request is answered: end the idle keep-alive sockets too. */
  | { t: 'drop' };

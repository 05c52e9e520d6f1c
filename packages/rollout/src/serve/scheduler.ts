/**
 * Continuous batching over a {@link SlotEngine}: requests wait in a FIFO queue, join the running
 * decode batch at step boundaries (a request's `n` samples prefilled together, from one prompt),
 * and leave it the moment a row finishes — its slot is free for the next admission at the next
 * boundary. New requests are prefilled between decode steps, up to a budget of prompt tokens per
 * boundary, so a burst of arrivals does not stall the running rows for long.
 *
 * Limits: the engine's slots (rows decoding at once), `maxTokens` (cache positions reserved by the
 * admitted rows: prompt + max new tokens each) and `maxQueue` (requests waiting); a request that
 * finds the queue full is refused with {@link ServerBusyError} (HTTP 429 with Retry-After).
 * Cancelling a request (a client that went away) frees its slots at once, between two steps.
 */
import type { SlotEngine, SlotRow, SlotToken, RowSampling } from './slot-engine';

/** One generation request: a prompt, `n` samples, and callbacks for each token and each finish. */
export interface ScheduledRequest {
  prompt: readonly number[];
  /** Samples of the prompt (each its own slot, each with random-stream key = its index). */
  n: number;
  /** New tokens per sample at most (finish reason 'length'). */
  maxTokens: number;
  sampling: RowSampling;
  seed: number;
  /** Alternatives per token with their raw log-probs (0: none). */
  topLogprobs?: number;
  /** Token ids that end a sample (finish reason 'stop'; the stop token is reported with `stop` set). */
  stopIds?: ReadonlySet<number>;
  /**
   * Each sampled token of sample `choice`, in order. `stop` is true for a stop id (the sample ends
   * with it). Returning true ends the sample now with finish reason 'stop' (e.g. a stop string).
   */
  onToken(choice: number, token: SlotToken, stop: boolean): boolean | void;
  /** Sample `choice` ended. */
  onFinish(choice: number, reason: FinishReason): void;
  /** The request's rows entered the engine (the weights that answer it are fixed from here on, see {@link Scheduler.quiesce}). */
  onAdmit?(): void;
}

/** Why a sample ended: a stop id or the caller's stop, its token limit, a cancel, or an engine error. */
export type FinishReason = 'stop' | 'length' | 'cancelled' | 'error';

/** The handle of a submitted request. */
export interface Ticket {
  /** Ends every unfinished sample now ('cancelled'); their slots are free for the next admission. */
  cancel(): void;
  /** Ends sample `choice` now with finish reason 'stop' (as `onToken` returning true does), e.g. a stop string another thread found; no-op once it ended or before admission. */
  stop(choice: number): void;
  /** Resolves when every sample has finished (however); rejects with the engine's error, if one failed it. */
  done: Promise<void>;
}

/** The queue is full: try again after `retryAfterSeconds`. */
export class ServerBusyError extends Error {
  constructor(
    message: string,
    readonly retryAfterSeconds: number,
  ) {
    super(message);
  }
}

/** What bounds a request on one scheduler: the engine's vocabulary, context and rows, and the cache positions the rows may reserve. */
export interface ServeLimits {
  vocabSize: number;
  /** Cache positions per row (prompt + new tokens). */
  maxLength: number;
  /** Rows decoding at once. */
  slots: number;
  maxTopLogprobs: number;
  /** Cache positions the admitted rows may reserve in all. */
  maxNumTokens: number;
}

/**
 * Why a request can never run under these limits (too many samples, too long), or undefined — a
 * pure function of the limits, so that an HTTP layer on another thread answers it without asking.
 */
export function refusalUnder(limits: ServeLimits, prompt: number, n: number, maxTokens: number): string | undefined {
  if (n > limits.slots) return `n is ${n}, more than the ${limits.slots} rows this server decodes at once`;
  if (prompt + maxTokens > limits.maxLength) return `${prompt} prompt tokens + ${maxTokens} new exceed the context of ${limits.maxLength}`;
  if (n * (prompt + maxTokens) > limits.maxNumTokens) return `${n} × (${prompt} + ${maxTokens}) tokens exceed the server's max_num_tokens of ${limits.maxNumTokens}`;
  return undefined;
}

/** The scheduler's defaults (`lathe serve`'s options take theirs from here). */
export const SCHEDULER_DEFAULTS = { maxQueue: 256, maxPrefillTokens: 8192, admitWaitMs: 25 } as const;

/** Limits and hooks of a {@link Scheduler}. */
export interface SchedulerOptions {
  /** Requests that may wait for slots; one more is refused (ServerBusyError). Default 256. */
  maxQueue?: number;
  /** Cache positions the admitted rows may reserve (prompt + max_tokens each). Default slots × maxLength. */
  maxTokens?: number;
  /** Prompt tokens prefilled per step boundary (at least one request always is). Default 8192. */
  maxPrefillTokens?: number;
  /**
   * While rows are decoding, how long (ms) a request may wait for more arrivals to share its
   * prefill, unless the waiting prompts already fill the prefill budget or the free slots. Each
   * prefill pays a fixed cost (a kernel launch per op) beside its per-prompt work, so prefilling
   * arrivals one by one stalls the running rows for that cost again and again. 0: admit at every
   * step. Default 25.
   */
  admitWaitMs?: number;
  /** After every decode step: busy slots, queued requests. For progress and tests. */
  onStep?: (info: { busy: number; queued: number; steps: number }) => void;
}

interface Live {
  req: ScheduledRequest;
  /** Slot of each sample (−1 before admission or after it finished). */
  slots: number[];
  produced: number[];
  finished: boolean[];
  open: number;
  cancelled: boolean;
  /** performance.now() when it was queued. */
  queuedAt: number;
  resolve: () => void;
  reject: (e: Error) => void;
}

/** A queue and step loop over one engine; `submit` from anywhere on the event loop. */
export class Scheduler {
  private readonly queue: Live[] = [];
  /** Each busy slot's request and sample, by slot (an array: a lookup per token). */
  private readonly owner: ({ live: Live; choice: number } | undefined)[];
  private reserved = 0;
  private running = false;
  /** Set by {@link quiesce}: no admissions until {@link resume}. */
  private holding = false;
  private closed = false;
  /** Set while paused: the loop waits on it before its next step. */
  private pausedUntil: Promise<void> | undefined;
  private unpause: (() => void) | undefined;
  /** Called by the loop once it has collected its step and parked. */
  private parked: (() => void) | undefined;
  private readonly maxQueue: number;
  private readonly maxTokens: number;
  private readonly maxPrefillTokens: number;
  private readonly admitWaitMs: number;
  /** Requests finished (any reason), and decode steps run by this scheduler. */
  readonly counters = { finished: 0, steps: 0, admitted: 0 };
  /**
   * Milliseconds the loop spent, cumulative: waiting for the device's step (`collect`), prefilling
   * (`admit`), launching steps, handing tokens out to requests (on a GPU, while a step runs), and
   * yielding to the event loop between steps (the HTTP layer's reads and writes).
   */
  readonly timings = { collect: 0, admit: 0, launch: 0, handOut: 0, yield: 0 };

  constructor(
    readonly engine: SlotEngine,
    private readonly opts: SchedulerOptions = {},
  ) {
    this.owner = new Array<{ live: Live; choice: number } | undefined>(engine.slots).fill(undefined);
    this.maxQueue = opts.maxQueue ?? SCHEDULER_DEFAULTS.maxQueue;
    this.maxTokens = opts.maxTokens ?? engine.slots * engine.maxLength;
    this.maxPrefillTokens = opts.maxPrefillTokens ?? SCHEDULER_DEFAULTS.maxPrefillTokens;
    this.admitWaitMs = opts.admitWaitMs ?? SCHEDULER_DEFAULTS.admitWaitMs;
    for (const [k, v] of [['maxQueue', this.maxQueue], ['maxTokens', this.maxTokens], ['maxPrefillTokens', this.maxPrefillTokens], ['admitWaitMs', this.admitWaitMs]] as const) {
      const min = k === 'maxQueue' || k === 'admitWaitMs' ? 0 : 1;
      if (!Number.isInteger(v) || v < min) throw new Error(`${k} must be a ${min === 0 ? 'non-negative' : 'positive'} integer, got ${v}`);
    }
  }

  /** Busy slots, free slots and waiting requests now. */
  get load(): { busy: number; free: number; queued: number; reservedTokens: number } {
    return { busy: this.engine.busy, free: this.engine.free, queued: this.queue.length, reservedTokens: this.reserved };
  }

  /**
   * Why this request can never run here (too many samples, too long), or undefined. The HTTP layer
   * checks this first so that such a request is a 400, not a wait.
   */
  refusal(prompt: number, n: number, maxTokens: number): string | undefined {
    return refusalUnder(this.limits, prompt, n, maxTokens);
  }

  /** The limits a request is checked against (see {@link refusalUnder}). */
  get limits(): ServeLimits {
    const e = this.engine;
    return { vocabSize: e.config.vocabSize, maxLength: e.maxLength, slots: e.slots, maxTopLogprobs: e.maxTopLogprobs, maxNumTokens: this.maxTokens };
  }

  /**
   * Queues a request; throws ServerBusyError when the queue is full, and an error naming the field
   * when the request can never run (see {@link refusal}) or a sampling parameter is invalid.
   */
  submit(req: ScheduledRequest): Ticket {
    if (this.closed) throw new ServerBusyError('the server is shutting down', 1);
    if (!Number.isInteger(req.n) || req.n < 1) throw new Error(`n must be a positive integer, got ${req.n}`);
    if (!Number.isInteger(req.maxTokens) || req.maxTokens < 1) throw new Error(`max_tokens must be a positive integer, got ${req.maxTokens}`);
    const why = this.refusal(req.prompt.length, req.n, req.maxTokens);
    if (why) throw new Error(why);
    this.engine.checkRow(this.rowOf(req, 0));
    const waiting = this.waitingForRows(req.n);
    if (waiting > this.maxQueue) {
      throw new ServerBusyError(`${waiting - 1} requests are waiting (max_queue ${this.maxQueue}); retry later`, 1);
    }
    let resolve!: () => void;
    let reject!: (e: Error) => void;
    const done = new Promise<void>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    const live: Live = { req, slots: new Array<number>(req.n).fill(-1), produced: new Array<number>(req.n).fill(0), finished: new Array<boolean>(req.n).fill(false), open: req.n, cancelled: false, queuedAt: performance.now(), resolve, reject };
    this.queue.push(live);
    this.kick();
    return { cancel: () => this.cancel(live), stop: (c) => live.slots[c] >= 0 && this.finish(live, c, 'stop'), done };
  }

  /**
   * The queued requests, and one more of `n` samples behind them, that the free rows cannot take
   * (FIFO): the ones that would wait. Requests that arrive together (e.g. one batch of messages from
   * an HTTP thread) before the loop admits any are not counted against max_queue while rows are
   * free for them.
   */
  private waitingForRows(n: number): number {
    let free = this.engine.free;
    let fit = 0;
    for (const need of [...this.queue.map((l) => l.req.n), n]) {
      if (need > free) break;
      free -= need;
      fit++;
    }
    return this.queue.length + 1 - fit;
  }

  /** Resolves once no request is queued or running. */
  async idle(): Promise<void> {
    while (this.running || this.queue.length) await new Promise((r) => setTimeout(r, 5));
  }

  /**
   * Stops stepping at the next step boundary until {@link resume} (requests stay queued and their
   * rows keep their caches) — e.g. while a trainer updates the weights the engine reads, so that no
   * step sees half an update. Resolves once no step is in flight.
   */
  pause(): Promise<void> {
    if (!this.pausedUntil) this.pausedUntil = new Promise((r) => (this.unpause = r));
    if (!this.running || !this.engine.stepInFlight) return Promise.resolve();
    return new Promise((r) => (this.parked = r));
  }

  /**
   * Stops admitting requests (they queue), lets every running one finish, then pauses as
   * {@link pause} does — so that each request is answered by one version of the weights, e.g. while
   * a trainer rewrites the weights the engine reads between its steps. {@link resume} lets it go on.
   */
  async quiesce(): Promise<void> {
    this.holding = true;
    while (this.engine.busy > 0 || this.engine.stepInFlight) await new Promise((r) => setTimeout(r, 1));
    await this.pause();
  }

  /** Lets a paused (or quiesced) scheduler step and admit again. */
  resume(): void {
    this.holding = false;
    const go = this.unpause;
    this.pausedUntil = undefined;
    this.parked = undefined;
    this.unpause = undefined;
    go?.();
  }

  /** Refuses new requests; running and queued ones finish. */
  close(): void {
    this.closed = true;
  }

  private rowOf(req: ScheduledRequest, key: number): SlotRow {
    return { sampling: req.sampling, seed: req.seed, key, topLogprobs: req.topLogprobs ?? 0 };
  }

  private cancel(live: Live): void {
    if (live.open === 0) return;
    live.cancelled = true;
    const q = this.queue.indexOf(live);
    if (q >= 0) this.queue.splice(q, 1);
    for (let c = 0; c < live.req.n; c++) if (!live.finished[c]) this.finish(live, c, 'cancelled');
  }

  private finish(live: Live, choice: number, reason: FinishReason): void {
    if (live.finished[choice]) return;
    live.finished[choice] = true;
    const slot = live.slots[choice];
    if (slot >= 0) {
      this.engine.release(slot);
      this.owner[slot] = undefined;
      this.reserved -= live.req.prompt.length + live.req.maxTokens;
      live.slots[choice] = -1;
    }
    live.open--;
    try {
      live.req.onFinish(choice, reason);
    } finally {
      if (live.open === 0) {
        this.counters.finished++;
        live.resolve();
      }
    }
  }

  private take(tokens: SlotToken[]): void {
    for (const t of tokens) {
      const o = this.owner[t.slot];
      if (!o) continue; // cancelled during the step
      const { live, choice } = o;
      live.produced[choice]++;
      const stop = live.req.stopIds?.has(t.token) ?? false;
      let end = false;
      try {
        end = live.req.onToken(choice, t, stop) === true;
      } catch {
        end = true; // a consumer that throws ends its sample rather than the loop
      }
      if (stop || end) this.finish(live, choice, 'stop');
      else if (live.produced[choice] >= live.req.maxTokens) this.finish(live, choice, 'length');
    }
  }

  /**
   * The queue's head requests that fit now: slots, reserved tokens, prefill budget; FIFO. While rows
   * decode, none until the batch is full or its oldest has waited `admitWaitMs` (see the option).
   */
  private nextAdmissions(): Live[] {
    const out: Live[] = [];
    if (this.holding) return out;
    let free = this.engine.free;
    let reserved = this.reserved;
    let prefill = 0;
    for (const live of this.queue) {
      const need = live.req.n * (live.req.prompt.length + live.req.maxTokens);
      if (live.req.n > free || reserved + need > this.maxTokens) break;
      if (out.length > 0 && prefill + live.req.prompt.length > this.maxPrefillTokens) break;
      out.push(live);
      free -= live.req.n;
      reserved += need;
      prefill += live.req.prompt.length;
    }
    const full = out.length < this.queue.length || free === 0 || prefill >= this.maxPrefillTokens;
    if (out.length && !full && this.engine.busy > 0 && performance.now() - out[0].queuedAt < this.admitWaitMs) return [];
    return out;
  }

  /** The requests with a row in the engine. */
  private admittedLives(): Live[] {
    return this.owner.filter((o) => o !== undefined).map((o) => o.live);
  }

  private failAll(lives: Iterable<Live>, e: Error): void {
    for (const live of new Set(lives)) {
      live.reject(e);
      for (let c = 0; c < live.req.n; c++) if (!live.finished[c]) this.finish(live, c, 'error');
    }
  }

  private kick(): void {
    if (this.running) return;
    this.running = true;
    setImmediate(() => {
      this.loop()
        .catch(() => undefined)
        .finally(() => {
          this.running = false;
          if (this.queue.length) this.kick();
        });
    });
  }

  /**
   * The step loop. Each turn: collect the step in flight; admit what fits (prefill) and hand out the
   * new rows' first tokens; launch the next step over every busy row; then, while the device runs
   * it, hand the collected tokens to their requests (detokenising, streaming, stop checks) — so that
   * host work overlaps device work (on a GPU; the CPU runs a launched step at once, so there the
   * tokens go out before the launch). A row that finishes in a hand-out after the launch was
   * already in the launched step: its result there is dropped (the step computes every row anyway).
   */
  private async loop(): Promise<void> {
    for (;;) {
      const t = this.timings;
      let now = performance.now();
      const lap = (k: keyof Scheduler['timings']) => {
        const then = now;
        now = performance.now();
        t[k] += now - then;
      };
      let tokens: SlotToken[] = [];
      if (this.engine.stepInFlight) {
        try {
          tokens = this.engine.collect();
        } catch (e) {
          this.failAll(this.admittedLives(), e as Error);
        }
        this.counters.steps++;
        this.opts.onStep?.({ busy: this.engine.busy, queued: this.queue.length, steps: this.counters.steps });
        lap('collect');
      }
      if (this.pausedUntil) {
        this.take(tokens);
        tokens = [];
        this.parked?.();
        while (this.pausedUntil) await this.pausedUntil;
      }
      const admit = this.nextAdmissions();
      if (admit.length) {
        this.queue.splice(0, admit.length);
        let results: ReturnType<SlotEngine['admit']>;
        try {
          results = this.engine.admit(admit.map((l) => ({ prompt: l.req.prompt, rows: Array.from({ length: l.req.n }, (_, j) => this.rowOf(l.req, j)) })));
        } catch (e) {
          this.failAll(admit, e as Error);
          results = [];
        }
        results.forEach((r, i) => {
          const live = admit[i];
          this.counters.admitted++;
          live.req.onAdmit?.();
          r.slots.forEach((slot, c) => {
            live.slots[c] = slot;
            this.owner[slot] = { live, choice: c };
            this.reserved += live.req.prompt.length + live.req.maxTokens;
          });
        });
        // New rows' first tokens go out before the next step: time to first token is one prefill.
        this.take(results.flatMap((r) => r.tokens));
        lap('admit');
      }
      // On the CPU a launched step runs at once, so nothing would overlap it: hand out first.
      const overlap = this.engine.device.kind !== 'cpu';
      if (!overlap) this.take(tokens);
      if (!overlap) lap('handOut');
      if (this.engine.busy > 0) {
        try {
          this.engine.launch();
        } catch (e) {
          this.failAll(this.admittedLives(), e as Error);
        }
      }
      lap('launch');
      if (overlap) this.take(tokens);
      if (overlap) lap('handOut');
      if (!this.engine.stepInFlight && this.engine.busy === 0 && this.queue.length === 0) return;
      // Between steps: let the HTTP layer read new requests, write tokens and see disconnects. Two
      // turns of the event loop, since a disconnect takes two (the socket's end, then its close).
      await new Promise((r) => setImmediate(r));
      await new Promise((r) => setImmediate(r));
      lap('yield');
    }
  }
}

/**
 * Runs CAS checks on worker threads with a hard wall-clock bound: a check that overruns is
 * answered "timeout" and its worker is terminated and replaced, so no input can hang the caller.
 */
import { existsSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { Worker } from 'node:worker_threads';
import type { CasRequest, CasVerdict } from './cas';
import type { CasWorkerReply, CasWorkerRequest } from './cas-worker';

/** A CAS outcome, including the two the pool itself produces. */
export type CasOutcome = CasVerdict | 'timeout' | 'error';

/** Options of {@link CasPool}. */
export interface CasPoolOptions {
  /** Worker threads (checks run in parallel up to this many). */
  workers: number;
  /** Wall-clock limit of one check, in milliseconds, measured from when a worker takes it. */
  timeoutMs: number;
  /** Results remembered by request (an LRU of this many entries; 0 disables the cache). */
  cacheSize: number;
  /** The code each worker thread runs (default: the CAS worker); tests give one that cannot start. */
  workerCode?: string;
}

/** Defaults of {@link CasPoolOptions}. */
export const CAS_POOL_DEFAULTS: CasPoolOptions = { workers: 1, timeoutMs: 1000, cacheSize: 20000 };

interface Job {
  request: CasRequest;
  key: string;
  resolve: (outcome: CasOutcome) => void;
  reject: (error: Error) => void;
}

interface Slot {
  worker: Worker;
  job: Job | null;
  timer: NodeJS.Timeout | null;
  ready: boolean;
}

/**
 * The code a worker starts with: the compiled entry, or the TypeScript source through tsx. Inside a
 * bundle (this file is not cas-pool.*) the worker is `cas-worker.js` beside the bundle: requiring the
 * bundle itself would run its entry point again on the worker thread.
 */
export function casWorkerBootstrap(filename: string = __filename): string {
  const base = basename(filename);
  const entry = /^cas-pool\.(ts|js)$/.test(base) ? join(dirname(filename), base.replace('cas-pool', 'cas-worker')) : join(dirname(filename), 'cas-worker.js');
  if (!/^cas-pool\./.test(base) && !existsSync(entry)) {
    throw new Error(`the CAS grader's worker is missing: ${filename} is a bundle, and ${entry} does not exist; bundle packages/graders/src/math/cas-worker.ts to that file (esbuild --bundle --platform=node), or pass CasPool's workerCode`);
  }
  // resolved here: an eval'd worker resolves bare names from the process's working directory, which may lie outside the repository
  const register = entry.endsWith('.ts') ? `require(${JSON.stringify(require.resolve('tsx/cjs'))});` : '';
  return `${register}require(${JSON.stringify(entry)});`;
}

/** Workers that die before loading the CAS, in a row, after which checks fail instead of starting more. */
const MAX_START_FAILURES = 3;

/** A pool of CAS worker threads with per-check time limits and a result cache. */
export class CasPool {
  private readonly options: CasPoolOptions;
  private readonly slots: Slot[] = [];
  private readonly queue: Job[] = [];
  private readonly cache = new Map<string, CasOutcome>();
  private nextId = 1;
  private closed = false;
  private readonly readyWaiters: (() => void)[] = [];
  /** Workers that died before becoming ready, in a row, and the last one's error. */
  private startFailures = 0;
  private startError = '';
  /** Checks cut off by the time limit so far. */
  timeouts = 0;

  constructor(options: Partial<CasPoolOptions> = {}) {
    this.options = { ...CAS_POOL_DEFAULTS, ...options };
    if (!(this.options.workers >= 1)) throw new Error(`CasPool: workers must be ≥ 1, got ${this.options.workers}`);
  }

  /** Decides one request, from the cache when it was seen before. */
  check(request: CasRequest): Promise<CasOutcome> {
    if (this.closed) return Promise.reject(new Error('CasPool: check() after close()'));
    if (this.startFailures >= MAX_START_FAILURES) return Promise.reject(this.cannotStart());
    const key = JSON.stringify(request);
    const cached = this.cache.get(key);
    if (cached !== undefined) {
      this.cache.delete(key);
      this.cache.set(key, cached);
      return Promise.resolve(cached);
    }
    return new Promise((resolve, reject) => {
      this.queue.push({ request, key, resolve, reject });
      this.pump();
    });
  }

  private cannotStart(): Error {
    return new Error(`CAS worker thread failed to start ${this.startFailures} times in a row${this.startError ? ` (${this.startError})` : ''}`);
  }

  /** Starts a worker if none runs and resolves once one has loaded the CAS (start-up is paid once per process). */
  warmUp(): Promise<void> {
    if (this.closed) return Promise.reject(new Error('CasPool: warmUp() after close()'));
    if (this.slots.some((s) => s.ready)) return Promise.resolve();
    if (this.slots.length === 0) this.slots.push(this.spawn());
    return new Promise((resolve) => this.readyWaiters.push(resolve));
  }

  /** Terminates every worker; pending checks are answered "error". */
  async close(): Promise<void> {
    this.closed = true;
    for (const job of this.queue.splice(0)) job.resolve('error');
    for (const wake of this.readyWaiters.splice(0)) wake();
    await Promise.all(
      this.slots.splice(0).map((slot) => {
        if (slot.timer) clearTimeout(slot.timer);
        slot.job?.resolve('error');
        return slot.worker.terminate();
      }),
    );
  }

  private remember(key: string, outcome: CasOutcome): void {
    if (this.options.cacheSize <= 0 || outcome === 'error') return;
    this.cache.set(key, outcome);
    if (this.cache.size > this.options.cacheSize) this.cache.delete(this.cache.keys().next().value as string);
  }

  private spawn(): Slot {
    const worker = new Worker(this.options.workerCode ?? casWorkerBootstrap(), { eval: true });
    const slot: Slot = { worker, job: null, timer: null, ready: false };
    worker.on('message', (reply: CasWorkerReply) => {
      if (reply.id === 0) {
        // the worker has loaded the CAS: only now do time limits start
        slot.ready = true;
        this.startFailures = 0;
        for (const wake of this.readyWaiters.splice(0)) wake();
        this.pump();
      } else this.finish(slot, reply.verdict ?? 'error');
    });
    worker.on('error', (e: Error) => {
      if (!slot.ready) this.startError = e.message;
      this.replace(slot, 'error');
    });
    worker.on('exit', () => {
      if (this.slots.includes(slot)) this.replace(slot, 'error');
    });
    return slot;
  }

  private finish(slot: Slot, outcome: CasOutcome): void {
    const job = slot.job;
    if (slot.timer) clearTimeout(slot.timer);
    slot.timer = null;
    slot.job = null;
    if (job) {
      this.remember(job.key, outcome);
      job.resolve(outcome);
    }
    this.pump();
  }

  /** Ends a slot's worker (stuck or crashed) and answers its job with `outcome`. */
  private replace(slot: Slot, outcome: CasOutcome): void {
    const i = this.slots.indexOf(slot);
    if (i < 0) return; // already replaced ('error' and 'exit' both report a crash)
    this.slots.splice(i, 1);
    if (!slot.ready && ++this.startFailures >= MAX_START_FAILURES) {
      // a worker that cannot start (a missing module, a broken install) never will: fail the checks, start no more
      for (const queued of this.queue.splice(0)) queued.reject(this.cannotStart());
    }
    if (slot.timer) clearTimeout(slot.timer);
    const job = slot.job;
    slot.job = null;
    void slot.worker.terminate();
    // a worker that died while starting wakes whoever waited for it: the next check starts another
    for (const wake of this.readyWaiters.splice(0)) wake();
    if (job) {
      this.remember(job.key, outcome);
      job.resolve(outcome);
    }
    this.pump();
  }

  private pump(): void {
    if (this.closed) return;
    this.dispatch();
    // idle workers must not keep the process alive; busy or starting ones must
    for (const s of this.slots) {
      if (s.job === null && s.ready) s.worker.unref();
      else s.worker.ref();
    }
  }

  private dispatch(): void {
    while (this.queue.length > 0) {
      const slot = this.slots.find((s) => s.ready && s.job === null);
      if (!slot) {
        if (this.slots.length < this.options.workers) this.slots.push(this.spawn());
        return;
      }
      const job = this.queue.shift() as Job;
      const busy = slot;
      busy.job = job;
      busy.timer = setTimeout(() => {
        this.timeouts++;
        this.replace(busy, 'timeout');
      }, this.options.timeoutMs);
      const msg: CasWorkerRequest = { id: this.nextId++, request: job.request };
      busy.worker.postMessage(msg);
    }
  }
}

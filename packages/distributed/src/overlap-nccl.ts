/**
 * `NcclInRunReducer`: the in-run all-reduce (overlap.ts) on NCCL. A bucket node's compute records
 * an event on the compute stream (where ONNX Runtime has just enqueued the kernels producing the
 * bucket's gradients), makes NCCL's stream wait for it, enqueues the bucket's in-place
 * ncclAllReduce on NCCL's stream and returns, so ORT goes on with the backward while NCCL sums.
 * After the run (ORT has synchronised the compute stream) `drain` waits for NCCL's stream at host
 * level, as `NcclCollectives` does, so the apply run reads the sums. With the update in the same
 * run, the join node's compute (`joinInRun`), after every bucket's,
 * records an event on NCCL's stream and makes the compute stream wait for it, so the update's
 * kernels, enqueued after it, read finished sums. With `timing` it also records
 * timing events around each bucket, so a device run shows whether NCCL's work ran beside the
 * backward or after it (`lastTimings`, `overlapSummary`).
 */
import * as koffi from 'koffi';
import type { DType } from '@lathe/onnx';
import { DistributedError } from './collectives';
import { NcclApi, type NcclCollectives } from './nccl';
import type { InRunBuffer, InRunReducer, InRunShardPair, InRunTimings } from './overlap';

type Fn = (...args: unknown[]) => unknown;

/** ncclDataType_t of the dtypes gradients are summed in. */
const NCCL_TYPES: Partial<Record<DType, number>> = { float32: 7, bfloat16: 9 };
const NCCL_SUM = 0;
const NCCL_IN_PROGRESS = 7;
const CUDA_NOT_READY = 600;
/** cudaEventDisableTiming: a pure ordering event, the cheapest to record. */
const EVENT_DISABLE_TIMING = 2;

/** The CUDA event calls the reducer adds to NcclApi's (same library file: dlopen returns the loaded one). */
interface EventApi {
  cudaEventCreateWithFlags: Fn;
  cudaEventRecord: Fn;
  cudaStreamWaitEvent: Fn;
  cudaEventDestroy: Fn;
  cudaEventSynchronize: Fn;
  cudaEventElapsedTime: Fn;
}

let events: EventApi | undefined;
function eventApi(api: NcclApi): EventApi {
  if (events) return events;
  const lib = koffi.load(api.cudartPath);
  events = {
    cudaEventCreateWithFlags: lib.func('int cudaEventCreateWithFlags(_Out_ void** event, unsigned int flags)'),
    cudaEventRecord: lib.func('int cudaEventRecord(void* event, void* stream)'),
    cudaStreamWaitEvent: lib.func('int cudaStreamWaitEvent(void* stream, void* event, unsigned int flags)'),
    cudaEventDestroy: lib.func('int cudaEventDestroy(void* event)'),
    cudaEventSynchronize: lib.func('int cudaEventSynchronize(void* event)'),
    cudaEventElapsedTime: lib.func('int cudaEventElapsedTime(_Out_ float* ms, void* start, void* end)'),
  };
  return events;
}

/** Options of `NcclInRunReducer.create`. */
export interface NcclInRunReducerOptions {
  /** Record timing events around each bucket's collectives and keep the last run's times (`lastTimings`). */
  timing?: boolean;
}

/** The timing events of one bucket enqueued in a run. */
interface BucketEvents {
  /** On the compute stream when the node ran: its gradients are written when the device reaches it. */
  ready: bigint;
  /** On NCCL's stream after the wait: the device starts the bucket's collectives (after the earlier buckets'). */
  start: bigint;
  /** On NCCL's stream after the collectives. */
  done: bigint;
}

/** The in-run all-reduce over an `NcclCollectives` group (its communicator and stream). */
export class NcclInRunReducer implements InRunReducer {
  readonly backend = 'nccl';
  private error: Error | undefined;
  private disposed = false;
  /** Timing events, reused run after run; `used` of them belong to the current run. */
  private readonly timed: BucketEvents[] = [];
  private used = 0;
  private timings: InRunTimings | undefined;
  /** The event `markStepStart` recorded for the current run, if any. */
  private stepStart: bigint | undefined;
  /** With `timing`: host ms spent in `enqueue` during the current run. */
  private enqueueMs = 0;

  private constructor(
    private readonly nccl: NcclCollectives,
    private readonly api: NcclApi,
    private readonly ev: EventApi,
    /** One ordering event, re-recorded for each bucket (a wait takes the record current at the call). */
    private readonly event: bigint,
    private readonly timing: boolean,
  ) {}

  /** A reducer on `nccl`'s communicator and stream. */
  static create(nccl: NcclCollectives, opts: NcclInRunReducerOptions = {}): NcclInRunReducer {
    const api = NcclApi.get();
    const ev = eventApi(api);
    const out: (bigint | null)[] = [null];
    api.checkCuda('cudaEventCreateWithFlags', ev.cudaEventCreateWithFlags(out, EVENT_DISABLE_TIMING));
    return new NcclInRunReducer(nccl, api, ev, out[0]!, opts.timing ?? false);
  }

  /** The device times of the last drained run's buckets (with `timing`), else undefined. */
  get lastTimings(): InRunTimings | undefined {
    return this.timings;
  }

  /**
   * With `timing`: records on `computeStream` when the step begins on the device (call it before
   * the step's first run), so the run's timings say how long the forward and the backward's first
   * layers took before the first bucket (`stepStarted`). No-op without `timing`.
   */
  markStepStart(computeStream: bigint): void {
    if (!this.timing) return;
    this.stepStart ??= this.timingEvent();
    this.api.checkCuda('cudaEventRecord', this.ev.cudaEventRecord(this.stepStart, computeStream));
  }

  /** A timing event (timing enabled: flags 0). */
  private timingEvent(): bigint {
    const out: (bigint | null)[] = [null];
    this.api.checkCuda('cudaEventCreateWithFlags', this.ev.cudaEventCreateWithFlags(out, 0));
    return out[0]!;
  }

  /** The events of the run's next bucket, created on first use. */
  private nextEvents(): BucketEvents {
    if (this.used === this.timed.length) this.timed.push({ ready: this.timingEvent(), start: this.timingEvent(), done: this.timingEvent() });
    return this.timed[this.used++];
  }

  /** Milliseconds from event `a` to event `b` (both complete after the drain). */
  private elapsed(a: bigint, b: bigint): number {
    const { api, ev } = this;
    api.checkCuda('cudaEventSynchronize', ev.cudaEventSynchronize(b));
    const ms = [0];
    api.checkCuda('cudaEventElapsedTime', ev.cudaEventElapsedTime(ms, a, b));
    return ms[0];
  }

  get rank(): number {
    return this.nccl.rank;
  }

  get worldSize(): number {
    return this.nccl.worldSize;
  }

  reduceInRun(bucket: readonly InRunBuffer[], stream: bigint | undefined): void {
    this.enqueue(stream, (api, comm, ncclStream) => {
      for (const b of bucket) {
        const type = NCCL_TYPES[b.dtype];
        if (type === undefined) throw new Error(`the in-run all-reduce sums float32 or bfloat16 buffers, got ${b.dtype}`);
        api.checkNccl('ncclAllReduce', api.fn.ncclAllReduce(b.data, b.data, b.size, type, NCCL_SUM, comm, ncclStream), comm);
      }
    });
  }

  /** The compute stream waits for NCCL's stream as it is now (every bucket's sums enqueued in the run). */
  joinInRun(stream: bigint | undefined): void {
    if (this.error) return;
    try {
      if (stream === undefined) throw new Error('the in-run collectives need the compute stream (a device opened with Kernels.withDevice)');
      const { api, ev } = this;
      // the wait takes the event's record as it is at the call: the same event serves the buckets' waits the other way
      api.checkCuda('cudaEventRecord', ev.cudaEventRecord(this.event, this.nccl.stream));
      api.checkCuda('cudaStreamWaitEvent', ev.cudaStreamWaitEvent(stream, this.event, 0));
    } catch (e) {
      this.error = e instanceof Error ? e : new Error(String(e));
      this.nccl.abort(`in-run join failed: ${this.error.message}`);
      throw this.error;
    }
  }

  /** Orders NCCL's stream after the compute stream's work so far and enqueues `calls` as one NCCL group. */
  private enqueue(stream: bigint | undefined, calls: (api: NcclApi, comm: bigint, ncclStream: bigint) => void): void {
    if (this.error) return;
    const t0 = this.timing ? performance.now() : 0;
    try {
      if (stream === undefined) throw new Error('the in-run collectives need the compute stream (a device opened with Kernels.withDevice)');
      const { api, ev } = this;
      const ncclStream = this.nccl.stream;
      const timed = this.timing ? this.nextEvents() : undefined;
      if (timed) api.checkCuda('cudaEventRecord', ev.cudaEventRecord(timed.ready, stream));
      api.checkCuda('cudaEventRecord', ev.cudaEventRecord(this.event, stream));
      api.checkCuda('cudaStreamWaitEvent', ev.cudaStreamWaitEvent(ncclStream, this.event, 0));
      if (timed) api.checkCuda('cudaEventRecord', ev.cudaEventRecord(timed.start, ncclStream));
      const comm = this.nccl.communicator;
      api.checkNccl('ncclGroupStart', api.fn.ncclGroupStart());
      try {
        calls(api, comm, ncclStream);
      } finally {
        api.checkNccl('ncclGroupEnd', api.fn.ncclGroupEnd(), comm);
      }
      if (timed) api.checkCuda('cudaEventRecord', ev.cudaEventRecord(timed.done, ncclStream));
      if (this.timing) this.enqueueMs += performance.now() - t0;
    } catch (e) {
      // the peers are inside the same collective: abort so they fail instead of hanging
      this.error = e instanceof Error ? e : new Error(String(e));
      this.nccl.abort(`in-run collective failed: ${this.error.message}`);
      throw this.error;
    }
  }

  reduceScatterInRun(pairs: readonly InRunShardPair[], stream: bigint | undefined): void {
    this.enqueue(stream, (api, comm, ncclStream) => {
      for (const { input, output } of pairs) {
        const type = NCCL_TYPES[input.dtype];
        if (type === undefined) throw new Error(`the in-run reduce-scatter sums float32 or bfloat16 buffers, got ${input.dtype}`);
        if (input.size % this.worldSize !== 0) throw new Error(`the in-run reduce-scatter of ${input.size} elements over ${this.worldSize} ranks`);
        api.checkNccl('ncclReduceScatter', api.fn.ncclReduceScatter(input.data, output, input.size / this.worldSize, type, NCCL_SUM, comm, ncclStream), comm);
      }
    });
  }

  /**
   * Waits for the run's collectives. `computeStream` (with `timing`): the stream the run computed
   * on, where an event recorded now marks the run's return on the device's clock.
   */
  async drain(computeStream?: bigint): Promise<void> {
    const { api } = this;
    const stream = this.nccl.stream;
    const returned = this.timing && this.used > 0 && computeStream !== undefined ? this.timingEvent() : undefined;
    if (returned !== undefined) api.checkCuda('cudaEventRecord', this.ev.cudaEventRecord(returned, computeStream));
    try {
      for (;;) {
        if (this.error) {
          const e = this.error;
          this.error = undefined;
          throw e;
        }
        const r = Number(api.fn.cudaStreamQuery(stream));
        if (r === 0) break;
        if (r !== CUDA_NOT_READY) api.checkCuda('in-run all-reduce: cudaStreamQuery', r);
        const asyncError = [0];
        api.fn.ncclCommGetAsyncError(this.nccl.communicator, asyncError);
        if (asyncError[0] !== 0 && asyncError[0] !== NCCL_IN_PROGRESS) {
          this.nccl.abort('in-run all-reduce failed');
          api.checkNccl('in-run all-reduce', asyncError[0]);
        }
        const failure = this.nccl.failure;
        if (failure) throw failure instanceof DistributedError ? failure : new DistributedError(failure.message);
        await new Promise((r) => setImmediate(r));
      }
      if (this.timing && this.used > 0) {
        const first = this.timed[0].ready;
        const at = (e: bigint) => +this.elapsed(first, e).toFixed(3);
        this.timings = {
          buckets: this.timed.slice(0, this.used).map((t) => ({ ready: at(t.ready), start: at(t.start), done: at(t.done) })),
          ...(returned !== undefined ? { runReturned: at(returned) } : {}),
          ...(this.stepStart !== undefined ? { stepStarted: -this.elapsed(this.stepStart, first) } : {}),
          enqueueHostMs: +this.enqueueMs.toFixed(3),
        };
      }
    } finally {
      this.used = 0;
      this.enqueueMs = 0;
      if (returned !== undefined) this.ev.cudaEventDestroy(returned);
    }
  }

  allReduceHost(values: Float64Array, op?: 'sum' | 'avg'): Promise<void> {
    return this.nccl.allReduceHost(values, op);
  }

  /** Destroys the event (the communicator stays with its `NcclCollectives`). */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.ev.cudaEventDestroy(this.event);
    for (const t of this.timed.splice(0)) for (const e of [t.ready, t.start, t.done]) this.ev.cudaEventDestroy(e);
    if (this.stepStart !== undefined) this.ev.cudaEventDestroy(this.stepStart);
  }
}

/**
 * `NcclInRunReducer`: the in-run all-reduce (overlap.ts) on NCCL. A bucket node's compute records
 * an event on the compute stream (where ONNX Runtime has just enqueued the kernels producing the
 * bucket's gradients), makes NCCL's stream wait for it, enqueues the bucket's in-place
 * ncclAllReduce on NCCL's stream and returns, so ORT goes on with the backward while NCCL sums.
 * After the run (ORT has synchronised the compute stream) `drain` waits for NCCL's stream at host
 * level, as `NcclCollectives` does, so the apply run reads the sums.
 */
import * as koffi from 'koffi';
import type { DType } from '@lathe/onnx';
import { DistributedError } from './collectives';
import { NcclApi, type NcclCollectives } from './nccl';
import type { InRunBuffer, InRunReducer, InRunShardPair } from './overlap';

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
  };
  return events;
}

/** The in-run all-reduce over an `NcclCollectives` group (its communicator and stream). */
export class NcclInRunReducer implements InRunReducer {
  readonly backend = 'nccl';
  private error: Error | undefined;
  private disposed = false;

  private constructor(
    private readonly nccl: NcclCollectives,
    private readonly api: NcclApi,
    private readonly ev: EventApi,
    /** One ordering event, re-recorded for each bucket (a wait takes the record current at the call). */
    private readonly event: bigint,
  ) {}

  /** A reducer on `nccl`'s communicator and stream. */
  static create(nccl: NcclCollectives): NcclInRunReducer {
    const api = NcclApi.get();
    const ev = eventApi(api);
    const out: (bigint | null)[] = [null];
    api.checkCuda('cudaEventCreateWithFlags', ev.cudaEventCreateWithFlags(out, EVENT_DISABLE_TIMING));
    return new NcclInRunReducer(nccl, api, ev, out[0]!);
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

  /** Orders NCCL's stream after the compute stream's work so far and enqueues `calls` as one NCCL group. */
  private enqueue(stream: bigint | undefined, calls: (api: NcclApi, comm: bigint, ncclStream: bigint) => void): void {
    if (this.error) return;
    try {
      if (stream === undefined) throw new Error('the in-run collectives need the compute stream (a device opened with Kernels.withDevice)');
      const { api, ev } = this;
      const ncclStream = this.nccl.stream;
      api.checkCuda('cudaEventRecord', ev.cudaEventRecord(this.event, stream));
      api.checkCuda('cudaStreamWaitEvent', ev.cudaStreamWaitEvent(ncclStream, this.event, 0));
      const comm = this.nccl.communicator;
      api.checkNccl('ncclGroupStart', api.fn.ncclGroupStart());
      try {
        calls(api, comm, ncclStream);
      } finally {
        api.checkNccl('ncclGroupEnd', api.fn.ncclGroupEnd(), comm);
      }
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

  async drain(): Promise<void> {
    const { api } = this;
    const stream = this.nccl.stream;
    for (;;) {
      if (this.error) {
        const e = this.error;
        this.error = undefined;
        throw e;
      }
      const r = Number(api.fn.cudaStreamQuery(stream));
      if (r === 0) return;
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
  }

  allReduceHost(values: Float64Array, op?: 'sum' | 'avg'): Promise<void> {
    return this.nccl.allReduceHost(values, op);
  }

  /** Destroys the event (the communicator stays with its `NcclCollectives`). */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.ev.cudaEventDestroy(this.event);
  }
}

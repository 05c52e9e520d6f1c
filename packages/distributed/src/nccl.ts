/**
 * `NcclCollectives`: NVIDIA's NCCL through koffi, on device tensors by address. One process per
 * GPU; NCCL's unique id goes from rank 0 to the others over a host group (the TCP rendezvous), which
 * also carries the small host values (losses, config digests) and tells of a peer's death.
 *
 * Ordering with ONNX Runtime: a session run returns after ORT has synchronised its stream (Lathe
 * never sets disable_synchronize_execution_providers on training runs), so when a collective is
 * enqueued on NCCL's own stream the tensors it reads are complete; each collective then waits for
 * that stream before returning, so the next ORT run (the optimizer's apply) reads the reduced
 * values. Both waits are at host level, so no event is needed between the two streams.
 */
import * as koffi from 'koffi';
import type { DType } from '@lathe/onnx';
import { namedKoffiType, type DeviceTensor } from '@lathe/runtime';
import { checkRank, DistributedError, type Collectives, type ReduceOp } from './collectives';
import { cudartCandidates, loadFirst, NCCL_FIX, ncclCandidates, type Library } from './nccl-library';

type Fn = (...args: unknown[]) => unknown;

/** NCCL's data types (ncclDataType_t). */
const NCCL_TYPES: Partial<Record<DType, number>> = { int8: 0, uint8: 1, bool: 1, int32: 2, int64: 4, float16: 6, float32: 7, float64: 8, bfloat16: 9 };
/** NCCL's reduction ops (ncclRedOp_t): sum 0, avg 4 (NCCL ≥ 2.10). */
const NCCL_OPS: Record<ReduceOp, number> = { sum: 0, avg: 4 };
const NCCL_IN_PROGRESS = 7;
const CUDA_NOT_READY = 600;

/** The NCCL and CUDA runtime functions Lathe calls, loaded once per process. */
export class NcclApi {
  private static instance: NcclApi | undefined;
  readonly ncclPath: string;
  readonly cudartPath: string;
  /** NCCL's version, e.g. 22704 for 2.27.4 (ncclGetVersion). */
  readonly version: number;
  private readonly libs: Library[];
  readonly fn: Record<string, Fn>;

  private constructor() {
    const nccl = loadFirst('NCCL (libnccl.so.2)', ncclCandidates(), 'ncclGetVersion', NCCL_FIX);
    const cudart = loadFirst('the CUDA runtime (libcudart)', cudartCandidates(), 'cudaSetDevice', 'Install the CUDA runtime of the driver\'s CUDA version (the toolkit, or pip package nvidia-cuda-runtime-cu13), or point LATHE_CUDART_LIBRARY at libcudart.so.N.');
    this.libs = [nccl.lib, cudart.lib];
    this.ncclPath = nccl.path;
    this.cudartPath = cudart.path;
    const id = namedKoffiType('LatheNcclUniqueId', () => koffi.struct('LatheNcclUniqueId', { internal: koffi.array('uint8_t', 128) }));
    void id;
    const n = nccl.lib;
    const c = cudart.lib;
    this.fn = {
      ncclGetVersion: n.func('int ncclGetVersion(_Out_ int* version)'),
      ncclGetUniqueId: n.func('int ncclGetUniqueId(void* uniqueId)'),
      ncclCommInitRank: n.func('int ncclCommInitRank(_Out_ void** comm, int nranks, LatheNcclUniqueId commId, int rank)'),
      ncclCommAbort: n.func('int ncclCommAbort(void* comm)'),
      ncclCommDestroy: n.func('int ncclCommDestroy(void* comm)'),
      ncclCommGetAsyncError: n.func('int ncclCommGetAsyncError(void* comm, _Out_ int* asyncError)'),
      ncclGetErrorString: n.func('const char* ncclGetErrorString(int result)'),
      ncclGetLastError: n.func('const char* ncclGetLastError(void* comm)'),
      ncclAllReduce: n.func('int ncclAllReduce(void* sendbuff, void* recvbuff, size_t count, int datatype, int op, void* comm, void* stream)'),
      ncclReduceScatter: n.func('int ncclReduceScatter(void* sendbuff, void* recvbuff, size_t recvcount, int datatype, int op, void* comm, void* stream)'),
      ncclAllGather: n.func('int ncclAllGather(void* sendbuff, void* recvbuff, size_t sendcount, int datatype, void* comm, void* stream)'),
      ncclBroadcast: n.func('int ncclBroadcast(void* sendbuff, void* recvbuff, size_t count, int datatype, int root, void* comm, void* stream)'),
      ncclGroupStart: n.func('int ncclGroupStart()'),
      ncclGroupEnd: n.func('int ncclGroupEnd()'),
      cudaSetDevice: c.func('int cudaSetDevice(int device)'),
      cudaStreamCreateWithFlags: c.func('int cudaStreamCreateWithFlags(_Out_ void** stream, unsigned int flags)'),
      cudaStreamCreateWithPriority: c.func('int cudaStreamCreateWithPriority(_Out_ void** stream, unsigned int flags, int priority)'),
      cudaDeviceGetStreamPriorityRange: c.func('int cudaDeviceGetStreamPriorityRange(_Out_ int* least, _Out_ int* greatest)'),
      cudaStreamQuery: c.func('int cudaStreamQuery(void* stream)'),
      cudaStreamSynchronize: c.func('int cudaStreamSynchronize(void* stream)'),
      cudaStreamDestroy: c.func('int cudaStreamDestroy(void* stream)'),
      cudaGetErrorString: c.func('const char* cudaGetErrorString(int error)'),
    };
    const v = [0];
    this.checkNccl('ncclGetVersion', this.fn.ncclGetVersion(v));
    this.version = v[0];
  }

  /** The process's NCCL (loaded on first use; an `NcclLibraryError` with the fix when missing). */
  static get(): NcclApi {
    return (NcclApi.instance ??= new NcclApi());
  }

  /** "2.27.4" from NCCL's version code. */
  get versionString(): string {
    const v = this.version;
    return v >= 10000 ? `${Math.floor(v / 10000)}.${Math.floor((v % 10000) / 100)}.${v % 100}` : `${Math.floor(v / 1000)}.${Math.floor((v % 1000) / 100)}.${v % 100}`;
  }

  /** Throws for a non-zero ncclResult_t, with NCCL's message (and its last error, given a communicator). */
  checkNccl(what: string, result: unknown, comm?: bigint): void {
    const r = Number(result);
    if (r === 0 || r === NCCL_IN_PROGRESS) return;
    const detail = comm ? (this.fn.ncclGetLastError(comm) as string | null) : null;
    throw new DistributedError(`${what}: NCCL error ${r} (${this.fn.ncclGetErrorString(r) as string})${detail ? `: ${detail}` : ''}`);
  }

  /** Throws for a non-zero cudaError_t, with CUDA's message. */
  checkCuda(what: string, result: unknown): void {
    const r = Number(result);
    if (r !== 0) throw new DistributedError(`${what}: CUDA error ${r} (${this.fn.cudaGetErrorString(r) as string})`);
  }
}

/** Options of `NcclCollectives.create`. */
export interface NcclOptions {
  /** The GPU of this rank (its LOCAL_RANK). */
  deviceId: number;
  /**
   * NCCL's stream priority: `high` (the device's greatest) lets the block scheduler place NCCL's
   * blocks before queued compute blocks, so an all-reduce beside the backward is not starved of
   * SMs by back-to-back compute kernels. Default `default`.
   */
  streamPriority?: 'default' | 'high';
}

/** Collectives on GPUs through NCCL; host values through the host group it was made over. */
export class NcclCollectives implements Collectives {
  readonly backend = 'nccl';
  private aborted: Error | undefined;
  /**
   * Return without waiting for NCCL's stream: wrong (the next ORT run may read before NCCL has
   * written), and there only so tools/bench/distributed/nccl-order.ts can show the wait matters.
   */
  unorderedForTest = false;

  private constructor(
    private readonly api: NcclApi,
    private readonly host: Collectives,
    private readonly comm: bigint,
    /** NCCL's stream (non-blocking, so it never waits on the legacy default stream). */
    readonly stream: bigint,
  ) {}

  get rank(): number {
    return this.host.rank;
  }

  get worldSize(): number {
    return this.host.worldSize;
  }

  get failure(): Error | undefined {
    return this.aborted ?? this.host.failure;
  }

  /** @internal The `ncclComm_t`, for collectives enqueued from inside a session run (overlap-nccl.ts). */
  get communicator(): bigint {
    return this.comm;
  }

  /** Forms the NCCL communicator over `host` (every rank calls it): rank 0's unique id is shared through the host group. */
  static async create(host: Collectives, opts: NcclOptions): Promise<NcclCollectives> {
    if (opts.streamPriority !== undefined && opts.streamPriority !== 'default' && opts.streamPriority !== 'high') throw new Error(`NcclCollectives.create: streamPriority '${String(opts.streamPriority)}': 'default' or 'high'`);
    const api = NcclApi.get();
    api.checkCuda(`cudaSetDevice(${opts.deviceId})`, api.fn.cudaSetDevice(opts.deviceId));
    const id = new Uint8Array(128);
    if (host.rank === 0) api.checkNccl('ncclGetUniqueId', api.fn.ncclGetUniqueId(id));
    const ids = await host.allGatherBytes(host.rank === 0 ? id : new Uint8Array(0));
    const s: (bigint | null)[] = [null];
    if (opts.streamPriority === 'high') {
      const least = [0];
      const greatest = [0];
      api.checkCuda('cudaDeviceGetStreamPriorityRange', api.fn.cudaDeviceGetStreamPriorityRange(least, greatest));
      api.checkCuda('cudaStreamCreateWithPriority', api.fn.cudaStreamCreateWithPriority(s, 1 /* cudaStreamNonBlocking */, greatest[0]));
    } else {
      api.checkCuda('cudaStreamCreateWithFlags', api.fn.cudaStreamCreateWithFlags(s, 1 /* cudaStreamNonBlocking */));
    }
    const comm: (bigint | null)[] = [null];
    // blocks until every rank has called it: the ranks are separate processes, so this is fine
    api.checkNccl(`ncclCommInitRank(rank ${host.rank} of ${host.worldSize}, GPU ${opts.deviceId})`, api.fn.ncclCommInitRank(comm, host.worldSize, { internal: Array.from(ids[0]) }, host.rank));
    return new NcclCollectives(api, host, comm[0]!, s[0]!);
  }

  private ptr(t: DeviceTensor): bigint {
    if (t.device.kind !== 'cuda') throw new Error(`NCCL: ${t.describe()} is not on a GPU`);
    return t.devicePointer();
  }

  private dtype(t: DeviceTensor): number {
    const d = NCCL_TYPES[t.dtype];
    if (d === undefined) throw new Error(`NCCL: no NCCL type for ${t.describe()}`);
    return d;
  }

  /** Enqueues `calls` as one NCCL group, then waits for NCCL's stream (failing if the group ends meanwhile). */
  private async run(what: string, calls: () => void): Promise<void> {
    if (this.failure) throw this.failure;
    const { api } = this;
    api.checkNccl('ncclGroupStart', api.fn.ncclGroupStart());
    try {
      calls();
    } finally {
      api.checkNccl(`${what} (ncclGroupEnd)`, api.fn.ncclGroupEnd(), this.comm);
    }
    if (this.unorderedForTest) return;
    // poll rather than block, so that a peer's death (seen by the host group) can abort NCCL's kernels
    for (;;) {
      const r = Number(api.fn.cudaStreamQuery(this.stream));
      if (r === 0) return;
      if (r !== CUDA_NOT_READY) api.checkCuda(`${what}: cudaStreamQuery`, r);
      const e = [0];
      api.fn.ncclCommGetAsyncError(this.comm, e);
      if (e[0] !== 0 && e[0] !== NCCL_IN_PROGRESS) {
        this.abort(`${what} failed`);
        api.checkNccl(what, e[0]);
      }
      if (this.host.failure) {
        api.fn.ncclCommAbort(this.comm);
        this.aborted = this.host.failure;
        throw this.host.failure;
      }
      await new Promise((r) => setImmediate(r));
    }
  }

  async allReduce(tensors: readonly DeviceTensor[], op: ReduceOp = 'sum'): Promise<void> {
    await this.run('allReduce', () => {
      for (const t of tensors) this.api.checkNccl('ncclAllReduce', this.api.fn.ncclAllReduce(this.ptr(t), this.ptr(t), t.size, this.dtype(t), NCCL_OPS[op], this.comm, this.stream), this.comm);
    });
  }

  async reduceScatter(input: DeviceTensor, output: DeviceTensor, op: ReduceOp = 'sum'): Promise<void> {
    if (input.dtype !== output.dtype || input.size !== output.size * this.worldSize) throw new Error(`reduceScatter: ${input.describe()} must hold worldSize (${this.worldSize}) × ${output.describe()}'s elements`);
    await this.run('reduceScatter', () => this.api.checkNccl('ncclReduceScatter', this.api.fn.ncclReduceScatter(this.ptr(input), this.ptr(output), output.size, this.dtype(output), NCCL_OPS[op], this.comm, this.stream), this.comm));
  }

  async reduceScatterMany(pairs: readonly (readonly [DeviceTensor, DeviceTensor])[], op: ReduceOp = 'sum'): Promise<void> {
    for (const [input, output] of pairs) if (input.dtype !== output.dtype || input.size !== output.size * this.worldSize) throw new Error(`reduceScatter: ${input.describe()} must hold worldSize (${this.worldSize}) × ${output.describe()}'s elements`);
    // one group: NCCL launches the reduce-scatters together, and the host waits once instead of once per tensor
    for (const chunk of groups(pairs)) await this.run('reduceScatter', () => {
      for (const [input, output] of chunk) this.api.checkNccl('ncclReduceScatter', this.api.fn.ncclReduceScatter(this.ptr(input), this.ptr(output), output.size, this.dtype(output), NCCL_OPS[op], this.comm, this.stream), this.comm);
    });
  }

  async allGatherMany(pairs: readonly (readonly [DeviceTensor, DeviceTensor])[]): Promise<void> {
    for (const [input, output] of pairs) if (input.dtype !== output.dtype || output.size !== input.size * this.worldSize) throw new Error(`allGather: ${output.describe()} must hold worldSize (${this.worldSize}) × ${input.describe()}'s elements`);
    for (const chunk of groups(pairs)) await this.run('allGather', () => {
      for (const [input, output] of chunk) this.api.checkNccl('ncclAllGather', this.api.fn.ncclAllGather(this.ptr(input), this.ptr(output), input.size, this.dtype(input), this.comm, this.stream), this.comm);
    });
  }

  async allGather(input: DeviceTensor, output: DeviceTensor): Promise<void> {
    if (input.dtype !== output.dtype || output.size !== input.size * this.worldSize) throw new Error(`allGather: ${output.describe()} must hold worldSize (${this.worldSize}) × ${input.describe()}'s elements`);
    await this.run('allGather', () => this.api.checkNccl('ncclAllGather', this.api.fn.ncclAllGather(this.ptr(input), this.ptr(output), input.size, this.dtype(input), this.comm, this.stream), this.comm));
  }

  async broadcast(tensors: readonly DeviceTensor[], root = 0): Promise<void> {
    checkRank('broadcast root', root, this.worldSize);
    await this.run('broadcast', () => {
      for (const t of tensors) this.api.checkNccl('ncclBroadcast', this.api.fn.ncclBroadcast(this.ptr(t), this.ptr(t), t.size, this.dtype(t), root, this.comm, this.stream), this.comm);
    });
  }

  allReduceHost(values: Float64Array, op?: ReduceOp): Promise<void> {
    return this.host.allReduceHost(values, op);
  }

  allGatherBytes(data: Uint8Array): Promise<Uint8Array[]> {
    return this.host.allGatherBytes(data);
  }

  barrier(): Promise<void> {
    return this.host.barrier();
  }

  abort(reason: string): void {
    if (!this.aborted) {
      this.api.fn.ncclCommAbort(this.comm);
      this.aborted = new DistributedError(`rank ${this.rank} aborted: ${reason}`, this.rank);
    }
    this.host.abort(reason);
  }

  async close(): Promise<void> {
    if (!this.aborted) {
      this.api.checkCuda('cudaStreamSynchronize', this.api.fn.cudaStreamSynchronize(this.stream));
      this.api.fn.ncclCommDestroy(this.comm);
      this.aborted = new DistributedError('the NCCL communicator was closed');
    }
    this.api.fn.cudaStreamDestroy(this.stream);
    await this.host.close();
  }
}

/** NCCL takes at most 2048 operations between ncclGroupStart and ncclGroupEnd: longer lists go as several groups. */
function groups<T>(items: readonly T[], max = 1024): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += max) out.push(items.slice(i, i + max));
  return out;
}

/** NCCL's version and file when it loads, or the reason it does not (for `lathe doctor`). */
export function ncclStatus(): { ok: true; version: string; path: string; cudart: string } | { ok: false; error: string } {
  try {
    const api = NcclApi.get();
    return { ok: true, version: api.versionString, path: api.ncclPath, cudart: api.cudartPath };
  } catch (e) {
    return { ok: false, error: (e as Error).message };
  }
}

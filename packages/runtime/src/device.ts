/**
 * Devices: where tensors live and sessions run. `Device.cpu()` is host memory; `Device.cuda()` is a
 * GPU through ONNX Runtime's CUDA execution provider. A device allocates tensors, copies them to and
 * from the host, fills and copies them on the device, compiles sessions, and counts its memory.
 *
 * Asking for CUDA where the provider cannot load is an error (never a silent CPU fallback).
 */
import * as L from '@lathe/onnx';
import { onnxTypeCode, type DType, type Graph } from '@lathe/onnx';
import { OrtError, type Ptr } from './capi';
import { cpuAllocator, cpuMemoryInfo, OrtAllocatorType, OrtMemType, ortEnv } from './env';
import { toBfloat16Bits, toFloat16Bits } from './half';
import { hostArrayType, type HostArray, type HostTensor } from './host';
import { Session, type SessionOptions } from './session';
import { DeviceTensor } from './tensor';

/** Kinds of device. */
export type DeviceKind = 'cpu' | 'cuda';

/** Options of a CUDA device. */
export interface CudaDeviceOptions {
  /** GPU index (default 0). */
  id?: number;
  /**
   * TensorFloat-32 for float32 MatMul/Conv (ORT's `use_tf32`; default true). Turn it off for
   * float32 parity checks against a reference computed without TF32.
   */
  tf32?: boolean;
  /**
   * One memory arena for every session and tensor of this device (ORT's environment allocator),
   * instead of an arena per session (default false): memory a session frees is reusable by the
   * next. Sessions replayed as CUDA graphs keep their own arena (see `sessionConfig`).
   */
  sharedArena?: boolean;
  /** Cap on the arena's size in bytes (ORT's `gpu_mem_limit`; default: no cap). */
  memoryLimitBytes?: number;
  /**
   * A CUDA stream (a `CUstream` address) that every session of this device runs on, ORT's
   * `user_compute_stream`: work Lathe queues on the same stream (its own kernels, `@lathe/kernels`)
   * then runs in order with the sessions' runs. Default: ORT's own stream per session.
   */
  computeStream?: bigint;
}

/** Device memory as counted by Lathe (tensors it allocated) and, where available, ORT's arena. */
export interface MemoryReport {
  /** Live tensors that own memory (views not counted). */
  tensors: number;
  /** Bytes held by live tensors. */
  bytes: number;
  /** Most bytes held at once. */
  peakBytes: number;
  /** Tensors freed by the garbage collector instead of `dispose()` (a leak in the caller). */
  leaked: number;
  /**
   * ORT's statistics (e.g. InUse, MaxInUse, TotalAllocated) of the arena tensors are allocated from.
   * With per-session arenas (the default) this excludes the sessions' own working memory
   * (activations); with `sharedArena` it covers every session on the device.
   */
  arena?: Record<string, string>;
}

/** Size of the pinned host buffer that uploads and downloads go through. */
const STAGING_BYTES = 64 * 1024 * 1024;
/** Device-to-device copies run in pieces of at most this many bytes (kernels index with 32 bits). */
const DEVICE_COPY_CHUNK = 1024 * 1024 * 1024;

let leakWarned = false;
const cudaDevices = new Map<number, Device>();
let cpuDevice: Device | undefined;

/** A place where tensors live and sessions run. */
export class Device {
  private tensors = 0;
  private bytes = 0;
  private peak = 0;
  private leaks = 0;
  private readonly utility = new Map<string, Session>();
  private arenaShared = false;
  private allocatorHandle: Ptr | undefined;
  private staging: { info: Ptr; at: Ptr; bytes: number; value: Ptr } | undefined;
  /** Whether transfers go through page-locked memory (known after the first transfer). */
  pinned: boolean | undefined;

  private constructor(
    readonly kind: DeviceKind,
    readonly id: number,
    /** @internal ORT memory info of this device's memory. */
    readonly memoryInfo: Ptr,
    private readonly cuda: Required<Omit<CudaDeviceOptions, 'memoryLimitBytes' | 'computeStream'>> & { memoryLimitBytes?: number; computeStream?: bigint },
  ) {}

  /** Host memory and ORT's CPU execution provider. */
  static cpu(): Device {
    if (!cpuDevice) {
      cpuDevice = new Device('cpu', 0, cpuMemoryInfo(), { id: 0, tf32: false, sharedArena: false });
      cpuDevice.allocatorHandle = cpuAllocator();
    }
    return cpuDevice;
  }

  /**
   * A CUDA GPU. Opening it loads ORT's CUDA execution provider (it must sit beside
   * libonnxruntime.so.1; see `lathe doctor`). The same id returns the same device; options apply
   * when it is first opened.
   */
  static cuda(opts: CudaDeviceOptions = {}): Device {
    const id = opts.id ?? 0;
    const existing = cudaDevices.get(id);
    if (existing) return existing;
    const { api, env } = ortEnv();
    const memoryInfo = api.out('CreateMemoryInfo', 'Cuda', OrtAllocatorType.device, id, OrtMemType.default);
    const d = new Device('cuda', id, memoryInfo, { id, tf32: opts.tf32 ?? true, sharedArena: opts.sharedArena ?? false, memoryLimitBytes: opts.memoryLimitBytes, computeStream: opts.computeStream });
    // Probe the provider first: registering an allocator for a provider that cannot load aborts the
    // process inside ORT (a C++ exception across the C API), while appending it returns a status.
    const probe = api.out('CreateSessionOptions');
    try {
      d.appendProvider(probe, { cudaGraph: false });
    } catch (e) {
      api.fn('ReleaseMemoryInfo')(memoryInfo);
      throw cudaUnavailable(e);
    } finally {
      api.fn('ReleaseSessionOptions')(probe);
    }
    if (d.cuda.sharedArena) {
      const arenaInfo = api.out('CreateMemoryInfo', 'Cuda', OrtAllocatorType.arena, id, OrtMemType.default);
      try {
        const keys = ['device_id', ...(opts.memoryLimitBytes ? ['gpu_mem_limit'] : [])];
        const values = [String(id), ...(opts.memoryLimitBytes ? [String(opts.memoryLimitBytes)] : [])];
        // an explicit arena config (ORT 1.29 crashed here when given none)
        const arenaCfg = api.out('CreateArenaCfgV2', ['arena_extend_strategy'], BigUint64Array.from([1n]) /* kSameAsRequested */, 1);
        try {
          api.call('CreateAndRegisterAllocatorV2', env, 'CUDAExecutionProvider', arenaInfo, arenaCfg, keys, values, keys.length);
        } finally {
          api.fn('ReleaseArenaCfg')(arenaCfg);
        }
        d.arenaShared = true;
      } catch (e) {
        throw cudaUnavailable(e);
      } finally {
        api.fn('ReleaseMemoryInfo')(arenaInfo);
      }
    }
    try {
      // The float32 copy session anchors the device: its allocator allocates every tensor.
      const anchor = d.utilitySession('uint8', 'copy');
      d.allocatorHandle = api.out('CreateAllocator', anchor.handle, memoryInfo);
    } catch (e) {
      throw cudaUnavailable(e);
    }
    cudaDevices.set(id, d);
    return d;
  }

  /** Whether `Device.cuda({ id })` was opened already (its options then are fixed). */
  static isOpen(kind: DeviceKind, id = 0): boolean {
    return kind === 'cpu' ? cpuDevice !== undefined : cudaDevices.has(id);
  }

  /** The user compute stream every session of this device runs on, if it was opened with one. */
  get computeStream(): bigint | undefined {
    return this.cuda.computeStream;
  }

  /** `Device.cpu()` or `Device.cuda(opts)` by kind. */
  static open(kind: DeviceKind, opts: CudaDeviceOptions = {}): Device {
    return kind === 'cpu' ? Device.cpu() : Device.cuda(opts);
  }

  /** "cpu" or "cuda:0". */
  get name(): string {
    return this.kind === 'cpu' ? 'cpu' : `${this.kind}:${this.id}`;
  }

  /** @internal The host device (for outputs placed on the host). */
  hostDevice(): Device {
    return Device.cpu();
  }

  /** @internal The allocator tensors of this device come from. */
  get allocator(): Ptr {
    if (this.allocatorHandle === undefined) throw new Error(`${this.name}: no allocator`);
    return this.allocatorHandle;
  }

  /**
   * @internal Session config entries a session on this device gets. A session replayed as a CUDA
   * graph keeps an arena of its own even when the device shares one: its graph holds the addresses
   * of the working memory it was captured with, which a shared arena would hand to other sessions
   * and tensors once the run returns it (seen as generation log-probs that no longer matched
   * re-scoring once a reward model's session allocated between GRPO's phases).
   */
  sessionConfig(opts: { cudaGraph: boolean }): Record<string, string> {
    return this.arenaShared && !opts.cudaGraph ? { 'session.use_env_allocators': '1' } : {};
  }

  /** @internal Adds this device's execution provider to session options. */
  appendProvider(so: Ptr, opts: { cudaGraph: boolean }): void {
    if (this.kind === 'cpu') {
      if (opts.cudaGraph) throw new Error('cudaGraph: CUDA graphs need a CUDA device');
      return;
    }
    const { api } = ortEnv();
    const cudaOptions = api.out('CreateCUDAProviderOptions');
    try {
      const o: Record<string, string> = {
        device_id: String(this.id),
        use_tf32: this.cuda.tf32 ? '1' : '0',
        enable_cuda_graph: opts.cudaGraph ? '1' : '0',
        do_copy_in_default_stream: '1',
        arena_extend_strategy: 'kSameAsRequested',
      };
      if (this.cuda.memoryLimitBytes) o.gpu_mem_limit = String(this.cuda.memoryLimitBytes);
      // ORT parses the stream's address from a decimal string
      if (this.cuda.computeStream !== undefined) {
        o.has_user_compute_stream = '1';
        o.user_compute_stream = this.cuda.computeStream.toString();
      }
      const keys = Object.keys(o);
      api.call('UpdateCUDAProviderOptions', cudaOptions, keys, keys.map((k) => o[k]), keys.length);
      api.call('SessionOptionsAppendExecutionProvider_CUDA_V2', so, cudaOptions);
    } finally {
      api.fn('ReleaseCUDAProviderOptions')(cudaOptions);
    }
  }

  /** Compiles a graph, ONNX bytes or an .onnx file for this device. */
  compile(model: Graph | Uint8Array | { path: string }, opts: SessionOptions = {}): Session {
    return Session.create(this, model, opts);
  }

  /** An uninitialised tensor. */
  empty(dtype: DType, dims: readonly number[]): DeviceTensor {
    const { api } = ortEnv();
    for (const d of dims) if (!Number.isInteger(d) || d < 0) throw new Error(`${this.name}: invalid dims [${dims.join(', ')}]`);
    let handle: Ptr;
    try {
      handle = api.out('CreateTensorAsOrtValue', this.allocator, BigInt64Array.from(dims.map(BigInt)), dims.length, onnxTypeCode(dtype));
    } catch (e) {
      if (e instanceof OrtError) throw new OrtError(e.fn, e.code, `allocating ${dtype}[${dims.join(', ')}] on ${this.name} (${this.bytes} bytes in use by Lathe tensors): ${e.message.slice(e.fn.length + 2)}`);
      throw e;
    }
    return new DeviceTensor(this, handle, dtype, [...dims]);
  }

  /** A tensor of zeros. */
  zeros(dtype: DType, dims: readonly number[]): DeviceTensor {
    return this.full(dtype, dims, 0);
  }

  /** A tensor with every element `value`. */
  full(dtype: DType, dims: readonly number[], value: number | bigint): DeviceTensor {
    const t = this.empty(dtype, dims);
    t.fill(value);
    return t;
  }

  /** A copy of a host tensor on this device; `dtype` says how to read the array (default: float32 for Float32Array, …). */
  upload(src: HostTensor, dtype: DType = defaultDtype(src.data)): DeviceTensor {
    const t = this.empty(dtype, src.dims);
    try {
      t.upload(src);
    } catch (e) {
      t.dispose();
      throw e;
    }
    return t;
  }

  /** Lathe's count of this device's memory, with ORT's arena statistics when available. */
  memory(): MemoryReport {
    const report: MemoryReport = { tensors: this.tensors, bytes: this.bytes, peakBytes: this.peak, leaked: this.leaks };
    if (this.kind !== 'cpu' && this.allocatorHandle !== undefined) {
      const { api } = ortEnv();
      try {
        const kvps = api.out('AllocatorGetStats', this.allocatorHandle);
        const keys: (Ptr | null)[] = [null];
        const values: (Ptr | null)[] = [null];
        const n: number[] = [0];
        api.fn('GetKeyValuePairs')(kvps, keys, values, n);
        const ks = api.strings(keys[0]!, Number(n[0]));
        const vs = api.strings(values[0]!, Number(n[0]));
        report.arena = Object.fromEntries(ks.map((k, i) => [k, vs[i]]));
        api.fn('ReleaseKeyValuePairs')(kvps);
      } catch {
        // not every allocator keeps statistics
      }
    }
    return report;
  }

  /** @internal */
  noteAllocated(bytes: number, owned: boolean): void {
    if (!owned) return;
    this.tensors++;
    this.bytes += bytes;
    this.peak = Math.max(this.peak, this.bytes);
  }

  /** @internal */
  noteFreed(bytes: number, owned: boolean, leaked: boolean): void {
    if (owned) {
      this.tensors--;
      this.bytes -= bytes;
    }
    if (leaked && owned) {
      this.leaks++;
      if (!leakWarned) {
        leakWarned = true;
        process.emitWarning(`a ${bytes}-byte tensor on ${this.name} was garbage-collected without dispose(); dispose device tensors when done (Device.memory().leaked counts them)`, 'LatheLeakWarning');
      }
    }
  }

  // ---- copies and fills ----------------------------------------------------------------------
  // On the CPU the tensor's memory is host memory and is read and written directly. On CUDA, tiny
  // sessions (Identity for copies, Expand for fills) run with the tensors bound by address; ORT's
  // IoBinding moves host data across.

  /** A cached one-node session over flat tensors: `copy` (y = x) or `fill` (y = expand(value, shape)). */
  private utilitySession(dtype: DType, kind: 'copy' | 'fill'): Session {
    // the copy session moves bytes (every dtype copies as uint8); fills are per dtype
    const key = `${kind}:${dtype}`;
    let s = this.utility.get(key);
    if (!s) {
      const g = new L.Graph(`lathe_${kind}_${dtype}`);
      if (kind === 'copy') {
        const x = g.input('x', dtype, ['n']);
        g.output(L.applyOp(L.identityOp, [x], {})[0], 'y');
      } else {
        const value = g.input('value', dtype, []);
        const shape = g.input('shape', 'int64', [1]);
        g.output(L.applyOp(L.expandOp, [value, shape], { shape: ['n'] })[0], 'y');
      }
      s = Session.create(this, g, { optimization: 'disabled', name: key });
      this.utility.set(key, s);
    }
    return s;
  }

  /**
   * Runs the uint8 copy session over raw byte ranges: `src` and `dst` are (memory info, address)
   * pairs. Every dtype copies as bytes, so one session serves all.
   */
  private copyBytes(src: { info: Ptr; at: Ptr }, dst: { info: Ptr; at: Ptr }, bytes: number): void {
    const { api } = ortEnv();
    const view = (x: { info: Ptr; at: Ptr }) => api.out('CreateTensorWithDataAsOrtValue', x.info, x.at, bytes, BigInt64Array.from([BigInt(bytes)]), 1, onnxTypeCode('uint8'));
    const a = view(src);
    const c = view(dst);
    const b = this.utilitySession('uint8', 'copy').binding();
    try {
      b.bindRaw('x', a, 'input').bindRaw('y', c, 'output').runSync();
    } finally {
      b.dispose();
      api.fn('ReleaseValue')(a);
      api.fn('ReleaseValue')(c);
    }
  }

  /**
   * A page-locked host buffer for transfers, allocated once per device by the CUDA provider's pinned
   * allocator: data moves JS array → pinned buffer (memcpy) → GPU (DMA), in chunks of its size.
   */
  private pinnedStaging(): { info: Ptr; at: Ptr; bytes: number } {
    if (!this.staging) {
      const { api } = ortEnv();
      const bytes = STAGING_BYTES;
      const shape = BigInt64Array.from([BigInt(bytes)]);
      let info: Ptr;
      let value: Ptr;
      try {
        // Page-locked staging is opt-in: with ORT 1.29 a pinned input to the copy session fails
        // GPUDataTransfer's `dst_data != src_data` check.
        if (!process.env.LATHE_PINNED_STAGING) throw new Error('pinned staging not enabled');
        info = api.out('CreateMemoryInfo', 'CudaPinned', OrtAllocatorType.device, 0, -1 /* OrtMemTypeCPUOutput */);
        const allocator = api.out('CreateAllocator', this.utilitySession('uint8', 'copy').handle, info);
        value = api.out('CreateTensorAsOrtValue', allocator, shape, 1, onnxTypeCode('uint8'));
        this.pinned = true;
      } catch {
        // no pinned allocator: a persistent pageable buffer still avoids re-faulting fresh pages per transfer
        info = cpuMemoryInfo();
        value = api.out('CreateTensorAsOrtValue', cpuAllocator(), shape, 1, onnxTypeCode('uint8'));
        this.pinned = false;
      }
      this.staging = { info, at: api.out('GetTensorMutableData', value), bytes, value };
    }
    return this.staging;
  }

  /** @internal */
  writeFromHost(dst: DeviceTensor, data: HostArray): void {
    this.transfer(dst, data, 'to-device');
  }

  /** @internal */
  readToHost(src: DeviceTensor, out: HostArray): void {
    this.transfer(src, out, 'to-host');
  }

  /**
   * Copies between a tensor and a host array of its size: directly on the CPU, elsewhere through
   * the staging buffer, a buffer-full at a time, so a transfer of any size needs no new host memory.
   */
  private transfer(tensor: DeviceTensor, host: HostArray, direction: 'to-device' | 'to-host'): void {
    if (tensor.size === 0) return;
    const { api } = ortEnv();
    if (this.kind === 'cpu') {
      if (direction === 'to-device') api.copyIn(tensor.dataPointer(), host);
      else api.copyOut(host, tensor.dataPointer());
      return;
    }
    const stage = this.pinnedStaging();
    const base = tensor.dataPointer();
    const bytes = new Uint8Array(host.buffer, host.byteOffset, host.byteLength);
    for (let off = 0; off < bytes.length; off += stage.bytes) {
      const n = Math.min(stage.bytes, bytes.length - off);
      const device = { info: this.memoryInfo, at: base + BigInt(off) };
      if (direction === 'to-device') {
        api.copyIn(stage.at, bytes.subarray(off, off + n));
        this.copyBytes(stage, device, n);
      } else {
        this.copyBytes(device, stage, n);
        api.copyOut(bytes.subarray(off, off + n), stage.at);
      }
    }
  }

  /** @internal */
  fillTensor(dst: DeviceTensor, value: number | bigint): void {
    if (dst.size === 0) return;
    const Type = hostArrayType(dst.dtype);
    const one = new Type(1);
    (one as unknown as (number | bigint)[])[0] = dst.dtype === 'int64' ? BigInt(value) : encodeScalar(dst.dtype, Number(value));
    if (this.kind === 'cpu') {
      if (Object.is(one[0], 0) || one[0] === 0n) {
        // all-zero bits (+0 in every dtype): no host array needed
        ortEnv().api.zero(dst.dataPointer(), dst.byteLength);
        return;
      }
      const all = new Type(dst.size);
      (all as unknown as { fill(v: number | bigint): void }).fill(one[0]);
      ortEnv().api.copyIn(dst.dataPointer(), all);
      return;
    }
    const flat = dst.reshape([dst.size]);
    const b = this.utilitySession(dst.dtype, 'fill').binding();
    try {
      b.input('value', { data: one, dims: [] })
        .input('shape', { data: BigInt64Array.from([BigInt(dst.size)]), dims: [1] })
        .output('y', flat)
        .runSync();
    } finally {
      b.dispose();
      flat.dispose();
    }
  }

  /** @internal */
  copyTensor(src: DeviceTensor, dst: DeviceTensor): void {
    if (src.size === 0) return;
    if (src.device !== this) throw new Error(`copyFrom: ${src.describe()} into ${dst.describe()}: copies between devices go through the host (download + upload)`);
    if (this.kind === 'cpu') {
      ortEnv().api.copy(dst.dataPointer(), src.dataPointer(), src.byteLength);
      return;
    }
    const a = src.dataPointer();
    const c = dst.dataPointer();
    for (let off = 0; off < src.byteLength; off += DEVICE_COPY_CHUNK) {
      const n = Math.min(DEVICE_COPY_CHUNK, src.byteLength - off);
      this.copyBytes({ info: this.memoryInfo, at: a + BigInt(off) }, { info: this.memoryInfo, at: c + BigInt(off) }, n);
    }
  }
}

/** The dtype a typed array holds by default. */
function defaultDtype(a: HostArray): DType {
  if (a instanceof Float32Array) return 'float32';
  if (a instanceof Float64Array) return 'float64';
  if (a instanceof Int32Array) return 'int32';
  if (a instanceof BigInt64Array) return 'int64';
  if (a instanceof Uint8Array) return 'uint8';
  if (a instanceof Int8Array) return 'int8';
  if (a instanceof Uint32Array) return 'uint32';
  throw new Error('upload: a Uint16Array holds float16 or bfloat16 bits: pass the dtype');
}

/** A scalar's element as stored (half-precision bit patterns for float16/bfloat16). */
function encodeScalar(dtype: DType, v: number): number {
  if (dtype === 'float16') return toF16(v);
  if (dtype === 'bfloat16') return toBf16(v);
  return v;
}

const toF16 = (v: number) => toFloat16Bits([v])[0];
const toBf16 = (v: number) => toBfloat16Bits([v])[0];

/** Turns a failure to bring up CUDA into an error that says what to do. */
function cudaUnavailable(e: unknown): Error {
  const msg = e instanceof Error ? e.message : String(e);
  return new Error(
    `CUDA was requested but ONNX Runtime's CUDA execution provider could not start: ${msg}\n` +
      'Install the provider that matches onnxruntime-node with `node tools/install-cuda-provider.mjs` (docs/runtime.md), then check `lathe doctor`.',
  );
}

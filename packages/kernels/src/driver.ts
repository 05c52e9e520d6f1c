/**
 * The CUDA driver API through koffi: the device's primary context (the one ONNX Runtime's CUDA
 * provider uses, so pointers from its tensors are valid here), modules, kernel launches, streams,
 * events, stream capture and a few copies for checks. Handles are koffi pointers (BigInts).
 */
import { loadLibrary, type Library } from './library';

/** A native pointer or CUDA handle. */
export type Handle = bigint;

/** A failed driver call, with CUDA's error name and message. */
export class CudaError extends Error {
  constructor(
    /** The driver function that failed. */
    readonly fn: string,
    /** The `CUresult` code. */
    readonly code: number,
    /** CUDA's name of the code, e.g. `CUDA_ERROR_INVALID_VALUE`. */
    readonly codeName: string,
    message: string,
  ) {
    super(message);
    this.name = 'CudaError';
  }
}

/** `CUdevice_attribute` values Lathe reads. */
const ATTR_CC_MAJOR = 75;
const ATTR_CC_MINOR = 76;
const ATTR_SM_COUNT = 16;
/** `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`. */
const FUNC_ATTR_MAX_DYNAMIC_SHARED = 8;

/** `CUstreamCaptureMode`. */
export const captureModes = { global: 0, threadLocal: 1, relaxed: 2 } as const;

type Fn = (...args: unknown[]) => number;

/** Grid and block sizes and the stream of a launch. */
export interface LaunchConfig {
  grid: number | [number, number?, number?];
  block: number | [number, number?, number?];
  /** Dynamic shared memory bytes (default 0). */
  sharedBytes?: number;
  /** The stream to launch on (default: the legacy default stream, 0). */
  stream?: Handle;
}

/** The loaded CUDA driver library with the calling thread's context set to a device's primary context. */
export class CudaDriver {
  private readonly f: Record<string, Fn>;
  private readonly errName: Fn;
  private readonly errString: Fn;
  /** The driver's CUDA version, e.g. [13, 0]. */
  readonly version: [number, number];
  private readonly contexts = new Map<number, Handle>();

  constructor(
    private readonly lib: Library,
    /** The library file loaded. */
    readonly path: string,
  ) {
    const decl = (sig: string) => this.lib.func(sig) as Fn;
    // some entry points carry a _v2 suffix in the library since CUDA 4/12.8; the macro names in cuda.h point at them
    const either = (...sigs: string[]) => {
      for (const s of sigs) {
        try {
          return decl(s);
        } catch {
          // try the next spelling
        }
      }
      throw new Error(`the CUDA driver library ${path} exports none of ${sigs.map((s) => s.split('(')[0].split(' ').pop()).join(', ')}`);
    };
    this.f = {
      init: decl('int cuInit(unsigned int flags)'),
      driverVersion: decl('int cuDriverGetVersion(_Out_ int* v)'),
      deviceGet: decl('int cuDeviceGet(_Out_ int* dev, int ordinal)'),
      attribute: decl('int cuDeviceGetAttribute(_Out_ int* value, int attrib, int dev)'),
      retain: decl('int cuDevicePrimaryCtxRetain(_Out_ void** ctx, int dev)'),
      setCurrent: decl('int cuCtxSetCurrent(void* ctx)'),
      moduleLoad: decl('int cuModuleLoadData(_Out_ void** module, const void* image)'),
      moduleUnload: decl('int cuModuleUnload(void* module)'),
      getFunction: decl('int cuModuleGetFunction(_Out_ void** fn, void* module, const char* name)'),
      funcSetAttribute: decl('int cuFuncSetAttribute(void* fn, int attrib, int value)'),
      launch: decl('int cuLaunchKernel(void* f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared, void* stream, void* params, void* extra)'),
      streamCreate: decl('int cuStreamCreate(_Out_ void** stream, unsigned int flags)'),
      streamDestroy: either('int cuStreamDestroy_v2(void* stream)', 'int cuStreamDestroy(void* stream)'),
      streamSync: decl('int cuStreamSynchronize(void* stream)'),
      eventCreate: decl('int cuEventCreate(_Out_ void** event, unsigned int flags)'),
      eventRecord: decl('int cuEventRecord(void* event, void* stream)'),
      eventSync: decl('int cuEventSynchronize(void* event)'),
      streamWaitEvent: decl('int cuStreamWaitEvent(void* stream, void* event, unsigned int flags)'),
      eventElapsed: either('int cuEventElapsedTime_v2(_Out_ float* ms, void* start, void* end)', 'int cuEventElapsedTime(_Out_ float* ms, void* start, void* end)'),
      eventDestroy: either('int cuEventDestroy_v2(void* event)', 'int cuEventDestroy(void* event)'),
      memcpyHtoD: either('int cuMemcpyHtoDAsync_v2(uint64_t dst, const void* src, size_t n, void* stream)', 'int cuMemcpyHtoDAsync(uint64_t dst, const void* src, size_t n, void* stream)'),
      memcpyDtoH: either('int cuMemcpyDtoHAsync_v2(void* dst, uint64_t src, size_t n, void* stream)', 'int cuMemcpyDtoHAsync(void* dst, uint64_t src, size_t n, void* stream)'),
      beginCapture: either('int cuStreamBeginCapture_v2(void* stream, int mode)', 'int cuStreamBeginCapture(void* stream, int mode)'),
      endCapture: decl('int cuStreamEndCapture(void* stream, _Out_ void** graph)'),
      instantiate: decl('int cuGraphInstantiateWithFlags(_Out_ void** exec, void* graph, unsigned long long flags)'),
      graphLaunch: decl('int cuGraphLaunch(void* exec, void* stream)'),
      graphExecDestroy: decl('int cuGraphExecDestroy(void* exec)'),
      graphDestroy: decl('int cuGraphDestroy(void* graph)'),
      memAlloc: either('int cuMemAlloc_v2(_Out_ uint64_t* dptr, size_t n)', 'int cuMemAlloc(_Out_ uint64_t* dptr, size_t n)'),
      memFree: either('int cuMemFree_v2(uint64_t dptr)', 'int cuMemFree(uint64_t dptr)'),
      memsetD32: decl('int cuMemsetD32Async(uint64_t dst, unsigned int value, size_t n, void* stream)'),
      memsetD8: decl('int cuMemsetD8Async(uint64_t dst, unsigned char value, size_t n, void* stream)'),
      isCapturing: decl('int cuStreamIsCapturing(void* stream, _Out_ int* status)'),
    };
    this.errName = decl('int cuGetErrorName(int code, _Out_ const char** name)');
    this.errString = decl('int cuGetErrorString(int code, _Out_ const char** text)');
    this.check('cuInit', this.f.init(0));
    const v = [0];
    this.check('cuDriverGetVersion', this.f.driverVersion(v));
    this.version = [Math.floor(v[0] / 1000), (v[0] % 1000) / 10];
  }

  private static instance: CudaDriver | undefined;

  /** The process's driver (loaded and initialised on first use), or a `KernelLibraryError`. */
  static get(candidates?: string[]): CudaDriver {
    if (!CudaDriver.instance) {
      const { lib, path } = loadLibrary('cuda-driver', candidates);
      CudaDriver.instance = new CudaDriver(lib, path);
    }
    return CudaDriver.instance;
  }

  /** Throws a `CudaError` for a non-zero `CUresult`. */
  check(fn: string, code: number): void {
    if (code === 0) return;
    const name: (string | null)[] = [null];
    const text: (string | null)[] = [null];
    this.errName(code, name);
    this.errString(code, text);
    throw new CudaError(fn, code, name[0] ?? `CUresult ${code}`, `${fn}: ${name[0] ?? `CUresult ${code}`}: ${text[0] ?? 'unknown error'}`);
  }

  /**
   * Makes device `id`'s primary context current on the calling thread (retained once per device).
   * ONNX Runtime's CUDA provider works in the same context, so device pointers pass between them.
   */
  useDevice(id: number): Handle {
    let ctx = this.contexts.get(id);
    if (ctx === undefined) {
      const dev = [0];
      this.check('cuDeviceGet', this.f.deviceGet(dev, id));
      const out: (Handle | null)[] = [null];
      this.check('cuDevicePrimaryCtxRetain', this.f.retain(out, dev[0]));
      ctx = out[0]!;
      this.contexts.set(id, ctx);
    }
    this.check('cuCtxSetCurrent', this.f.setCurrent(ctx));
    return ctx;
  }

  /** Compute capability as one number (9.0 → 90) and the SM count of device `id`. */
  deviceInfo(id: number): { arch: number; smCount: number } {
    const dev = [0];
    this.check('cuDeviceGet', this.f.deviceGet(dev, id));
    const read = (attr: number) => {
      const v = [0];
      this.check('cuDeviceGetAttribute', this.f.attribute(v, attr, dev[0]));
      return v[0];
    };
    return { arch: read(ATTR_CC_MAJOR) * 10 + read(ATTR_CC_MINOR), smCount: read(ATTR_SM_COUNT) };
  }

  /** Loads a cubin or NUL-terminated PTX image into the current context. */
  loadModule(image: Uint8Array): Handle {
    const out: (Handle | null)[] = [null];
    this.check('cuModuleLoadData', this.f.moduleLoad(out, image));
    return out[0]!;
  }

  /** Unloads a module. */
  unloadModule(module: Handle): void {
    this.check('cuModuleUnload', this.f.moduleUnload(module));
  }

  /** A kernel of a loaded module by its (extern "C") name. */
  getFunction(module: Handle, name: string): Handle {
    const out: (Handle | null)[] = [null];
    this.check(`cuModuleGetFunction('${name}')`, this.f.getFunction(out, module, name));
    return out[0]!;
  }

  /**
   * Lets `fn` launch with up to `bytes` of dynamic shared memory: over 48 KB a kernel must opt in
   * (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`), up to 227 KB on sm_90.
   */
  setMaxDynamicSharedBytes(fn: Handle, bytes: number): void {
    this.check('cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)', this.f.funcSetAttribute(fn, FUNC_ATTR_MAX_DYNAMIC_SHARED, bytes));
  }

  /** Launches `fn` with a packed parameter array (see `packKernelArgs`). */
  launch(fn: Handle, cfg: LaunchConfig, params: BigUint64Array): void {
    const [gx, gy, gz] = dims3(cfg.grid);
    const [bx, by, bz] = dims3(cfg.block);
    this.check('cuLaunchKernel', this.f.launch(fn, gx, gy, gz, bx, by, bz, cfg.sharedBytes ?? 0, cfg.stream ?? 0n, params, null));
  }

  /**
   * A new stream. Blocking (flags 0) by default, so work ONNX Runtime puts on the legacy default
   * stream (its copies with `do_copy_in_default_stream`) stays ordered with it.
   */
  createStream(flags = 0): Handle {
    const out: (Handle | null)[] = [null];
    this.check('cuStreamCreate', this.f.streamCreate(out, flags));
    return out[0]!;
  }

  /** Destroys a stream. */
  destroyStream(stream: Handle): void {
    this.check('cuStreamDestroy', this.f.streamDestroy(stream));
  }

  /** Waits for everything queued on `stream`. */
  synchronize(stream: Handle): void {
    this.check('cuStreamSynchronize', this.f.streamSync(stream));
  }

  /** A new event (timing enabled; `timing: false` makes `CU_EVENT_DISABLE_TIMING` events, cheaper to record and wait on). */
  createEvent(timing = true): Handle {
    const out: (Handle | null)[] = [null];
    this.check('cuEventCreate', this.f.eventCreate(out, timing ? 0 : 2));
    return out[0]!;
  }

  /** Makes the work queued on `stream` after this call wait for `event`'s last record (a fork or join between streams; legal in a capture). */
  waitEvent(stream: Handle, event: Handle): void {
    this.check('cuStreamWaitEvent', this.f.streamWaitEvent(stream, event, 0));
  }

  /** Records `event` on `stream`. */
  record(event: Handle, stream: Handle): void {
    this.check('cuEventRecord', this.f.eventRecord(event, stream));
  }

  /** Milliseconds between two recorded events (waits for `end`). */
  elapsedMs(start: Handle, end: Handle): number {
    this.check('cuEventSynchronize', this.f.eventSync(end));
    const ms = [0];
    this.check('cuEventElapsedTime', this.f.eventElapsed(ms, start, end));
    return ms[0];
  }

  /** Destroys an event. */
  destroyEvent(event: Handle): void {
    this.check('cuEventDestroy', this.f.eventDestroy(event));
  }

  /** Copies host bytes to a device address, in order on `stream` (the host array must live until it runs: call `synchronize`). */
  copyToDevice(dst: Handle, src: ArrayBufferView, stream: Handle): void {
    if (src.byteLength > 0) this.check('cuMemcpyHtoDAsync', this.f.memcpyHtoD(dst, src, src.byteLength, stream));
  }

  /** Copies device bytes into a host array after the work queued on `stream` (waits for it). */
  copyToHost(dst: ArrayBufferView, src: Handle, stream: Handle): void {
    if (dst.byteLength === 0) return;
    this.check('cuMemcpyDtoHAsync', this.f.memcpyDtoH(dst, src, dst.byteLength, stream));
    this.synchronize(stream);
  }

  /** Allocates `bytes` of device memory in the current context (not allowed while a stream captures in global mode). */
  alloc(bytes: number): Handle {
    const out: (number | bigint)[] = [0];
    this.check('cuMemAlloc', this.f.memAlloc(out, bytes));
    return BigInt(out[0]);
  }

  /** Frees memory from {@link alloc}. */
  free(ptr: Handle): void {
    this.check('cuMemFree', this.f.memFree(ptr));
  }

  /** Queues setting `count` 32-bit words at `dst` to `value` on `stream`. */
  memsetD32(dst: Handle, value: number, count: number, stream: Handle): void {
    if (count > 0) this.check('cuMemsetD32Async', this.f.memsetD32(dst, value >>> 0, count, stream));
  }

  /** Queues setting `count` bytes at `dst` to `value` on `stream`. */
  memsetD8(dst: Handle, value: number, count: number, stream: Handle): void {
    if (count > 0) this.check('cuMemsetD8Async', this.f.memsetD8(dst, value & 0xff, count, stream));
  }

  /** Whether `stream` is being captured into a CUDA graph (an invalidated capture counts). */
  isCapturing(stream: Handle): boolean {
    const status = [0];
    this.check('cuStreamIsCapturing', this.f.isCapturing(stream, status));
    return status[0] !== 0;
  }

  /**
   * Records everything `fn` queues on `stream` (ONNX Runtime runs with synchronization disabled,
   * kernel launches) as a CUDA graph and returns it instantiated: `replay` launches it on a stream.
   */
  capture(stream: Handle, fn: () => void, mode: keyof typeof captureModes = 'relaxed'): CapturedGraph {
    this.check('cuStreamBeginCapture', this.f.beginCapture(stream, captureModes[mode]));
    let failure: unknown;
    try {
      fn();
    } catch (e) {
      failure = e;
    }
    const graph: (Handle | null)[] = [null];
    const ended = this.f.endCapture(stream, graph);
    if (failure) throw failure;
    this.check('cuStreamEndCapture', ended);
    const exec: (Handle | null)[] = [null];
    try {
      this.check('cuGraphInstantiateWithFlags', this.f.instantiate(exec, graph[0], 0));
    } finally {
      this.f.graphDestroy(graph[0]);
    }
    return {
      replay: (s: Handle) => this.check('cuGraphLaunch', this.f.graphLaunch(exec[0], s)),
      dispose: () => this.check('cuGraphExecDestroy', this.f.graphExecDestroy(exec[0])),
    };
  }
}

/** A captured, instantiated CUDA graph. */
export interface CapturedGraph {
  replay(stream: Handle): void;
  dispose(): void;
}

function dims3(d: number | [number, number?, number?]): [number, number, number] {
  const [x, y = 1, z = 1] = typeof d === 'number' ? [d] : d;
  for (const v of [x, y, z]) if (!Number.isInteger(v) || v < 1) throw new Error(`launch: grid and block sizes must be positive integers, got [${[x, y, z].join(', ')}]`);
  return [x, y, z];
}

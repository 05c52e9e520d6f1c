/**
 * `Kernels`: Lathe's own CUDA kernels beside ONNX Runtime's, on one stream. NVRTC compiles CUDA C++
 * for the device's architecture (cached on disk), the driver loads it into the primary context ORT
 * also works in, and `Kernel.launch` queues it on the stream ORT's sessions run on, so kernel
 * launches and bound session runs execute in the order they are issued, with no host sync between.
 */
import { Device, type CudaDeviceOptions } from '@lathe/runtime';
import { packKernelArgs, type ArgType, type ArgValues } from './args';
import { KernelCache, type CompileKey } from './cache';
import { CudaDriver, type Handle, type LaunchConfig } from './driver';
import { KernelLibraryError, libraryFixes } from './library';
import { Nvrtc, type CompiledImage } from './nvrtc';

/** Options of `Kernels.open`. */
export interface KernelsOptions {
  /** GPU index (default 0). */
  deviceId?: number;
  /** Compile cache folder, or false for none (default: `defaultCacheDir()`). */
  cache?: string | false;
  /** The stream launches go on by default (default: a new blocking stream). */
  stream?: Handle;
  /** Preloaded libraries (tests, or libraries found elsewhere). */
  nvrtc?: Nvrtc;
  driver?: CudaDriver;
}

/** Options of a compilation. */
export interface CompileOptions {
  /** The program's name in messages and the cache key (default `kernel`). */
  name?: string;
  /** Extra NVRTC options (the target architecture is added). */
  options?: string[];
  /** The target instead of the device's (e.g. `sm_90a` for code using sm_90's architecture-specific instructions). */
  target?: string;
}

/**
 * The NVRTC target for a device architecture: a cubin for `sm_<arch>` where NVRTC supports the
 * arch; otherwise PTX for the newest supported arch below it, which the driver compiles at load
 * (`fallback` says so); an arch older than every supported one has no build.
 */
export function chooseTarget(deviceArch: number, supported: readonly number[]): { target: string; fallback?: string } {
  if (supported.includes(deviceArch)) return { target: `sm_${deviceArch}` };
  const below = supported.filter((a) => a < deviceArch);
  if (below.length === 0) throw new Error(`this NVRTC has no build for sm_${deviceArch} (it supports sm_${supported.join(', sm_')}); use NVRTC of an older CUDA, or leave the kernel options off`);
  const best = Math.max(...below);
  return { target: `compute_${best}`, fallback: `NVRTC cannot build sm_${deviceArch}; kernels are compiled to compute_${best} PTX, which the driver compiles when loading` };
}

/**
 * Refuses an NVRTC newer than the driver: its output needs a driver of at least its CUDA major
 * version (the driver reports CUDA_ERROR_UNSUPPORTED_PTX_VERSION or refuses the cubin otherwise).
 */
export function checkVersions(nvrtc: { version: [number, number]; path: string }, driver: { version: [number, number] }): void {
  if (nvrtc.version[0] > driver.version[0]) {
    throw new KernelLibraryError(
      'nvrtc',
      [nvrtc.path],
      `NVRTC ${nvrtc.version.join('.')} (${nvrtc.path}) is newer than the driver's CUDA ${driver.version.join('.')}: its code would not load. ` +
        `Use NVRTC ${driver.version[0]}.x (LATHE_NVRTC_LIB=…/libnvrtc.so.${driver.version[0]}) or update the NVIDIA driver. ${libraryFixes.nvrtc}`,
    );
  }
}

let fallbackNamed = false;

/** A device's kernel toolchain: compiler, cache, context and default stream. */
export class Kernels {
  /** The device's compute capability (9.0 → 90). */
  readonly arch: number;
  /** The NVRTC target kernels are built for (`sm_90`, or `compute_XY` PTX as a fallback). */
  readonly target: string;
  /** Streaming multiprocessors on the device (for sizing grids). */
  readonly smCount: number;
  /** The stream launches go on unless a launch names another. */
  readonly stream: Handle;
  private readonly cache: KernelCache | undefined;
  private readonly modules: Handle[] = [];
  /** Compilations done (cache misses) and cache hits, for reports. */
  readonly counts = { compiled: 0, cached: 0 };

  private constructor(
    readonly deviceId: number,
    readonly nvrtc: Nvrtc,
    readonly driver: CudaDriver,
    opts: KernelsOptions,
  ) {
    driver.useDevice(deviceId);
    const info = driver.deviceInfo(deviceId);
    this.arch = info.arch;
    this.smCount = info.smCount;
    const t = chooseTarget(info.arch, nvrtc.supportedArchs());
    this.target = t.target;
    if (t.fallback && !fallbackNamed) {
      fallbackNamed = true;
      process.emitWarning(t.fallback, 'LatheKernelWarning');
    }
    this.stream = opts.stream ?? driver.createStream();
    this.cache = opts.cache === false ? undefined : new KernelCache(opts.cache);
  }

  /** Loads NVRTC and the driver for device `deviceId` (a `KernelLibraryError`, with the fix, if either is missing). */
  static open(opts: KernelsOptions = {}): Kernels {
    const driver = opts.driver ?? CudaDriver.get();
    const nvrtc = opts.nvrtc ?? Nvrtc.load();
    checkVersions(nvrtc, driver);
    return new Kernels(opts.deviceId ?? 0, nvrtc, driver, opts);
  }

  /**
   * Kernels and a CUDA device whose sessions all run on the kernels' stream (ORT's
   * `user_compute_stream`), so launches and runs are ordered. The device must not be open yet.
   */
  static withDevice(opts: KernelsOptions & { device?: Omit<CudaDeviceOptions, 'id' | 'computeStream'> } = {}): { kernels: Kernels; device: Device } {
    const id = opts.deviceId ?? 0;
    if (Device.isOpen('cuda', id)) throw new Error(`Kernels.withDevice: cuda:${id} is already open, and its sessions run on a stream of ONNX Runtime's own; open it through Kernels.withDevice before anything else uses it`);
    const kernels = Kernels.open(opts);
    const device = Device.cuda({ ...opts.device, id, computeStream: kernels.stream });
    return { kernels, device };
  }

  /** Compiles (or finds in the cache) and loads `source`. A compile error carries NVRTC's log. */
  compile(source: string, opts: CompileOptions = {}): KernelModule {
    const key: CompileKey = { source, name: opts.name ?? 'kernel', target: opts.target ?? this.target, options: opts.options ?? [], compiler: this.nvrtc.version.join('.') };
    this.driver.useDevice(this.deviceId);
    const cached = this.cache?.get(key);
    if (cached) {
      try {
        return this.load(cached, key.name);
      } catch {
        // a stale or damaged file: compile afresh
        this.cache!.drop(key);
      }
    }
    const image: CompiledImage = this.nvrtc.compile(source, key.name, [`--gpu-architecture=${key.target}`, ...key.options]);
    this.counts.compiled++;
    this.cache?.put(key, image);
    return this.load(image, key.name, false);
  }

  private load(image: CompiledImage, name: string, fromCache = true): KernelModule {
    const m = this.driver.loadModule(image.kind === 'ptx' && image.image[image.image.length - 1] !== 0 ? Uint8Array.from([...image.image, 0]) : image.image);
    if (fromCache) this.counts.cached++;
    this.modules.push(m);
    return new KernelModule(this, m, name);
  }

  /** Waits for everything queued on the kernels' stream. */
  synchronize(): void {
    this.driver.synchronize(this.stream);
  }

  /** Milliseconds of device time `fn` queues on the stream (events around it; waits for the end). */
  time(fn: () => void): number {
    const [a, b] = [this.driver.createEvent(), this.driver.createEvent()];
    try {
      this.driver.record(a, this.stream);
      fn();
      this.driver.record(b, this.stream);
      return this.driver.elapsedMs(a, b);
    } finally {
      this.driver.destroyEvent(a);
      this.driver.destroyEvent(b);
    }
  }

  /**
   * Device milliseconds per launch of `call(i)` (i = 0, 1, …): 20 warm-up calls, then `iters` calls recorded
   * once as a CUDA graph and replayed between events, so the host's launch rate is not what is timed.
   */
  timeLaunches(call: (i: number) => void, iters = 200): number {
    for (let i = 0; i < 20; i++) call(i);
    const graph = this.driver.capture(this.stream, () => {
      for (let i = 0; i < iters; i++) call(i);
    });
    try {
      graph.replay(this.stream);
      return this.time(() => graph.replay(this.stream)) / iters;
    } finally {
      graph.dispose();
    }
  }

  /** Unloads the modules (the stream stays: ORT sessions may still use it). */
  dispose(): void {
    for (const m of this.modules.splice(0)) this.driver.unloadModule(m);
  }
}

/** A loaded module: its kernels by name. */
export class KernelModule {
  /** @internal Use `Kernels.compile`. */
  constructor(
    private readonly kernels: Kernels,
    /** The driver's module handle. */
    readonly handle: Handle,
    readonly name: string,
  ) {}

  /** The `extern "C"` kernel `name`, launched with arguments of `signature`. */
  kernel<const S extends readonly ArgType[]>(name: string, signature: S): Kernel<S> {
    return new Kernel(this.kernels, this.kernels.driver.getFunction(this.handle, name), name, signature);
  }
}

/** A kernel with a typed argument list. */
export class Kernel<S extends readonly ArgType[]> {
  /** @internal Use `KernelModule.kernel`. */
  constructor(
    private readonly kernels: Kernels,
    readonly handle: Handle,
    readonly name: string,
    readonly signature: S,
  ) {}

  /** Queues one launch on `cfg.stream` (default: the kernels' stream). Returns at once. */
  launch(cfg: LaunchConfig, ...args: ArgValues<S>): void {
    const packed = packKernelArgs(this.name, this.signature, args);
    this.kernels.driver.launch(this.handle, { ...cfg, stream: cfg.stream ?? this.kernels.stream }, packed.params);
    void packed.slots;
  }
}

/** Whether Lathe's kernels can run here: the libraries found and their versions, or why not (with the fix). */
export interface KernelProbe {
  ok: boolean;
  nvrtc?: { path: string; version: string };
  driver?: { path: string; cuda: string };
  /** Why not, naming the library and the fix (a `KernelLibraryError`'s message). */
  reason?: string;
}

/**
 * Looks for NVRTC and the CUDA driver without touching a device: what `lathe doctor` reports and
 * what a caller checks before turning a kernel option on (the ONNX Runtime path needs neither).
 */
export function probeKernels(opts: { nvrtc?: string[]; driver?: string[] } = {}): KernelProbe {
  try {
    const driver = CudaDriver.get(opts.driver);
    const nvrtc = Nvrtc.load(opts.nvrtc);
    checkVersions(nvrtc, driver);
    return { ok: true, nvrtc: { path: nvrtc.path, version: nvrtc.version.join('.') }, driver: { path: driver.path, cuda: driver.version.join('.') } };
  } catch (e) {
    return { ok: false, reason: e instanceof Error ? e.message : String(e) };
  }
}

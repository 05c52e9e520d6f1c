/**
 * Sessions and IoBinding runs through ORT's C API. A `Session` is a compiled model on a device; a
 * `Binding` attaches device tensors (or host tensors, copied at bind time) to its inputs and outputs
 * and runs it. Bindings persist: rebinding one input leaves the others bound, so a loop that swaps
 * two sets of state buffers rebinds only what changed, and nothing crosses the host boundary that
 * the caller did not ask for.
 */
import { writeFileSync } from 'node:fs';
import { dtypeFromOnnxCode, Graph, hostTableNodes, onnxTypeCode, toModelBytes, type DType } from '@lathe/onnx';
import { OrtError, type Ptr } from './capi';
import { cpuAllocator, cpuMemoryInfo, graphOptimizationLevels, ortEnv, trace, type LogLevel } from './env';
import { checkHostTensor, sizeOf, type HostTensor } from './host';
import { DeviceTensor, tensorTypeOf } from './tensor';
import type { Device } from './device';

/** Options of a session. */
export interface SessionOptions {
  /** ORT graph optimizations (default `all`). */
  optimization?: keyof typeof graphOptimizationLevels;
  /** Threads of the intra-op pool (CPU kernels); 0 = ORT's default. */
  intraOpThreads?: number;
  /** Threads of the inter-op pool; 0 = ORT's default. */
  interOpThreads?: number;
  /** ORT's CPU memory arena (default on). */
  cpuArena?: boolean;
  /** ORT's memory-pattern planning for repeated shapes (default on). */
  memoryPattern?: boolean;
  /**
   * Allow nodes without a kernel on the session's device to run on the CPU, with copies around them.
   * Default false on CUDA: such a node then fails session creation, naming the op.
   */
  allowCpuFallback?: boolean;
  /** Write an ORT profile (Chrome trace JSON) with this file prefix; `endProfiling()` returns its path. */
  profilePrefix?: string;
  /** Session log severity (0 verbose … 4 fatal; 1 lists node placements). */
  logLevel?: LogLevel;
  /** Extra session config entries (`session.*`, `ep.*`, …). */
  config?: Record<string, string>;
  /**
   * Environment variables set while the session is created and restored after: ONNX Runtime reads
   * some kernel switches (e.g. ORT_FPA_INTB_GEMM) from the environment when it builds the kernels.
   */
  env?: Record<string, string>;
  /** Capture the run as a CUDA graph and replay it (CUDA only; fixed shapes and bound device addresses). */
  cudaGraph?: boolean;
  /**
   * Save the model to this path and load it from the file: needed when the graph has external
   * initializers, whose locations are relative to the model file.
   */
  modelPath?: string;
  /** A name for errors and profiles (default: the graph's name). */
  name?: string;
  /**
   * Custom-op domains (`OrtCustomOpDomain` handles) whose ops the model may use: how Lathe's own
   * kernels become nodes of a session (@lathe/kernels `CustomOpDomain`). The caller keeps them alive.
   */
  customOpDomains?: Ptr[];
}

/** A session input or output: name, dtype and dims (numbers, symbolic names, or null for unknown). */
export interface TensorInfo {
  name: string;
  dtype: DType;
  dims: (number | string | null)[];
}

/** Where an output should land when it is not bound to a preallocated tensor. */
export type OutputPlacement = 'device' | 'host';

/** Options of a run. */
export interface RunOptions {
  /**
   * Wait for the device to finish before returning (default true). With false, call
   * `binding.synchronize()` before reading outputs.
   */
  synchronize?: boolean;
  /** Abort a long run (ORT's run termination flag; the run then throws). */
  signal?: AbortSignal;
}

/** A compiled model on a device. */
export class Session {
  private released = false;
  private readonly bindings = new Set<Binding>();

  private constructor(
    readonly device: Device,
    /** @internal */ readonly handle: Ptr,
    private readonly options: Ptr,
    readonly name: string,
    readonly inputs: TensorInfo[],
    readonly outputs: TensorInfo[],
    private readonly profiling: boolean,
  ) {}

  /** Compiles a DSL graph, ONNX bytes, or an .onnx file (`{ path }`) for a device. */
  static create(device: Device, model: Graph | Uint8Array | { path: string }, opts: SessionOptions = {}): Session {
    const { api, env } = ortEnv();
    const name = opts.name ?? (model instanceof Uint8Array ? 'model' : 'path' in model ? model.path : model.name);
    if (opts.cudaGraph && model instanceof Graph) refuseHostTables(model, name);
    const so = api.out('CreateSessionOptions');
    let handle: Ptr | undefined;
    const restoreEnv = setEnv(opts.env);
    try {
      api.call('SetSessionGraphOptimizationLevel', so, graphOptimizationLevels[opts.optimization ?? 'all']);
      if (opts.intraOpThreads) api.call('SetIntraOpNumThreads', so, opts.intraOpThreads);
      if (opts.interOpThreads) api.call('SetInterOpNumThreads', so, opts.interOpThreads);
      if (opts.cpuArena === false) api.call('DisableCpuMemArena', so);
      if (opts.memoryPattern === false) api.call('DisableMemPattern', so);
      if (opts.logLevel !== undefined) api.call('SetSessionLogSeverityLevel', so, opts.logLevel);
      if (opts.profilePrefix) api.call('EnableProfiling', so, opts.profilePrefix);
      const config: Record<string, string> = { ...device.sessionConfig({ cudaGraph: opts.cudaGraph ?? false }), ...(opts.config ?? {}) };
      if (device.kind !== 'cpu' && !opts.allowCpuFallback) config['session.disable_cpu_ep_fallback'] = '1';
      for (const [k, v] of Object.entries(config)) api.call('AddSessionConfigEntry', so, k, v);
      device.appendProvider(so, { cudaGraph: opts.cudaGraph ?? false });
      for (const d of opts.customOpDomains ?? []) api.call('AddCustomOpDomain', so, d);
      if (model instanceof Uint8Array) {
        handle = api.out('CreateSessionFromArray', env, model, model.byteLength, so);
      } else if ('path' in model) {
        handle = api.out('CreateSession', env, model.path, so);
      } else if (opts.modelPath) {
        writeFileSync(opts.modelPath, toModelBytes(model));
        handle = api.out('CreateSession', env, opts.modelPath, so);
      } else {
        const bytes = toModelBytes(model);
        handle = api.out('CreateSessionFromArray', env, bytes, bytes.byteLength, so);
      }
    } catch (e) {
      api.fn('ReleaseSessionOptions')(so);
      if (e instanceof OrtError) throw new OrtError(e.fn, e.code, `could not create a ${device.name} session for '${name}': ${e.message.slice(e.fn.length + 2)}`);
      throw e;
    } finally {
      restoreEnv();
    }
    const io = (count: 'SessionGetInputCount' | 'SessionGetOutputCount') => {
      const n = api.outNumber(count, handle);
      const isInput = count === 'SessionGetInputCount';
      const infos: TensorInfo[] = [];
      for (let i = 0; i < n; i++) {
        const namePtr = api.out(isInput ? 'SessionGetInputName' : 'SessionGetOutputName', handle, i, cpuAllocator());
        const ioName = api.string(namePtr);
        api.call('AllocatorFree', cpuAllocator(), namePtr);
        const typeInfo = api.out(isInput ? 'SessionGetInputTypeInfo' : 'SessionGetOutputTypeInfo', handle, i);
        try {
          const t = api.out('CastTypeInfoToTensorInfo', typeInfo);
          const code = api.outNumber('GetTensorElementType', t);
          const rank = api.outNumber('GetDimensionsCount', t);
          const dims = new BigInt64Array(Math.max(rank, 1));
          const symbols = new BigUint64Array(Math.max(rank, 1));
          if (rank > 0) {
            api.call('GetDimensions', t, dims, rank);
            api.call('GetSymbolicDimensions', t, symbols, rank);
          }
          const out: (number | string | null)[] = [];
          for (let d = 0; d < rank; d++) {
            const v = Number(dims[d]);
            const sym = symbols[d] ? api.string(symbols[d]) : '';
            out.push(v >= 0 ? v : sym || null);
          }
          infos.push({ name: ioName, dtype: dtypeFromOnnxCode(code), dims: out });
        } finally {
          api.fn('ReleaseTypeInfo')(typeInfo);
        }
      }
      return infos;
    };
    return new Session(device, handle, so, name, io('SessionGetInputCount'), io('SessionGetOutputCount'), Boolean(opts.profilePrefix));
  }

  /** @internal Throws if the session was disposed. */
  live(): Ptr {
    if (this.released) throw new Error(`session '${this.name}' was disposed`);
    return this.handle;
  }

  /** The input named `name` (throws, listing the inputs, if there is none). */
  input(name: string): TensorInfo {
    const t = this.inputs.find((i) => i.name === name);
    if (!t) throw new Error(`session '${this.name}' has no input '${name}' (inputs: ${this.inputs.map((i) => i.name).join(', ')})`);
    return t;
  }

  /** The output named `name` (throws, listing the outputs, if there is none). */
  output(name: string): TensorInfo {
    const t = this.outputs.find((i) => i.name === name);
    if (!t) throw new Error(`session '${this.name}' has no output '${name}' (outputs: ${this.outputs.map((i) => i.name).join(', ')})`);
    return t;
  }

  /** A new, empty binding for repeated runs. */
  binding(): Binding {
    const b = new Binding(this);
    this.bindings.add(b);
    return b;
  }

  /** @internal */
  forget(b: Binding): void {
    this.bindings.delete(b);
  }

  /**
   * One run: binds `feeds` (device or host tensors), runs, and returns the requested outputs
   * (default: all) on the host, or as device tensors with `to: 'device'` (the caller disposes them).
   */
  async run(feeds: Record<string, DeviceTensor | HostTensor>, opts: { outputs?: string[]; to: 'device' } & RunOptions): Promise<Record<string, DeviceTensor>>;
  async run(feeds: Record<string, DeviceTensor | HostTensor>, opts?: { outputs?: string[]; to?: 'host' } & RunOptions): Promise<Record<string, HostTensor>>;
  async run(feeds: Record<string, DeviceTensor | HostTensor>, opts: { outputs?: string[]; to?: OutputPlacement } & RunOptions = {}): Promise<Record<string, DeviceTensor | HostTensor>> {
    const b = this.binding();
    try {
      for (const i of this.inputs) {
        const f = feeds[i.name];
        if (!f) throw new Error(`session '${this.name}': missing input '${i.name}' (${i.dtype} [${i.dims.join(', ')}])`);
        b.input(i.name, f);
      }
      for (const k of Object.keys(feeds)) this.input(k);
      const names = opts.outputs ?? this.outputs.map((o) => o.name);
      const to = opts.to ?? 'host';
      for (const n of names) b.output(n, to);
      await b.run(opts);
      const result: Record<string, DeviceTensor | HostTensor> = {};
      for (const n of names) result[n] = to === 'host' ? b.fetch(n) : b.take(n);
      return result;
    } finally {
      b.dispose();
    }
  }

  /** Ends profiling and returns the profile file's path. */
  endProfiling(): string {
    if (!this.profiling) throw new Error(`session '${this.name}' was not created with profilePrefix`);
    const { api } = ortEnv();
    const p = api.out('SessionEndProfiling', this.live(), cpuAllocator());
    const path = api.string(p);
    api.call('AllocatorFree', cpuAllocator(), p);
    return path;
  }

  /** Releases the session and its bindings. Tensors bound to it are not freed. */
  dispose(): void {
    if (this.released) return;
    for (const b of [...this.bindings]) b.dispose();
    this.released = true;
    const { api } = ortEnv();
    api.fn('ReleaseSession')(this.handle);
    api.fn('ReleaseSessionOptions')(this.options);
  }
}

/** What is bound to one output. */
type OutputSlot = { kind: 'tensor'; tensor: DeviceTensor } | { kind: 'device' } | { kind: 'host' } | { kind: 'raw' };

/**
 * An IoBinding: inputs and outputs attached to a session, run as often as needed. A host tensor
 * bound to an input is copied to the session's device at bind time (ORT's IoBinding does the copy);
 * device tensors are bound by address, with no copy.
 */
export class Binding {
  private readonly handle: Ptr;
  private released = false;
  private readonly runOptions: Ptr;
  private readonly asyncRunOptions: Ptr;
  /** Bound device tensors (kept referenced so they outlive the binding's use of them). */
  private readonly inputTensors = new Map<string, DeviceTensor>();
  /** Host inputs staged in ORT-allocated CPU values (released on rebind or dispose). */
  private readonly stagedInputs = new Map<string, Ptr>();
  private readonly outputSlots = new Map<string, OutputSlot>();
  /** Run config entries set with `runConfig` (applied to every run). */
  private readonly runConfigEntries = new Map<string, string>();
  /** Inputs bound to raw values by the runtime itself. */
  private readonly rawInputs = new Set<string>();
  /** Outputs of the last run that ORT allocated, by name (owned until `take` hands them over). */
  private produced = new Map<string, DeviceTensor>();

  /** @internal Use `session.binding()`. */
  constructor(readonly session: Session) {
    const { api } = ortEnv();
    this.handle = api.out('CreateIoBinding', session.live());
    this.runOptions = api.out('CreateRunOptions');
    this.asyncRunOptions = api.out('CreateRunOptions');
    api.call('AddRunConfigEntry', this.asyncRunOptions, 'disable_synchronize_execution_providers', '1');
  }

  private live(): Ptr {
    if (this.released) throw new Error(`a binding of session '${this.session.name}' was disposed`);
    this.session.live();
    return this.handle;
  }

  private checkType(what: string, info: TensorInfo, dtype: DType, dims: readonly number[]): void {
    const where = `session '${this.session.name}' ${what} '${info.name}'`;
    if (dtype !== info.dtype) throw new Error(`${where} is ${info.dtype}, got ${dtype}[${dims.join(', ')}]`);
    if (dims.length !== info.dims.length) throw new Error(`${where} has rank ${info.dims.length} ([${info.dims.join(', ')}]), got ${dtype}[${dims.join(', ')}]`);
    info.dims.forEach((d, i) => {
      if (typeof d === 'number' && d !== dims[i]) throw new Error(`${where} has dims [${info.dims.join(', ')}], got [${dims.join(', ')}] (axis ${i})`);
    });
  }

  /**
   * Sets a run config entry for every run of this binding — e.g. `gpu_graph_id`: with CUDA graph
   * capture on, each binding whose tensors sit at other addresses needs its own graph id.
   */
  runConfig(key: string, value: string): this {
    const { api } = ortEnv();
    this.live();
    for (const ro of [this.runOptions, this.asyncRunOptions]) api.call('AddRunConfigEntry', ro, key, value);
    this.runConfigEntries.set(key, value);
    return this;
  }

  /** Binds an input to a device tensor (by address) or a host tensor (copied now). */
  input(name: string, t: DeviceTensor | HostTensor): this {
    const { api } = ortEnv();
    const b = this.live();
    const info = this.session.input(name);
    this.releaseStaged(name);
    this.rawInputs.delete(name);
    if (t instanceof DeviceTensor) {
      this.checkType('input', info, t.dtype, t.dims);
      api.call('BindInput', b, name, t.live(`input '${name}'`));
      this.inputTensors.set(name, t);
    } else {
      checkHostTensor(`session '${this.session.name}' input '${name}'`, info.dtype, t);
      this.checkType('input', info, info.dtype, t.dims);
      const staged = stageOnHost(info.dtype, t);
      try {
        api.call('BindInput', b, name, staged);
      } catch (e) {
        api.fn('ReleaseValue')(staged);
        throw e;
      }
      this.stagedInputs.set(name, staged);
      this.inputTensors.delete(name);
    }
    return this;
  }

  /**
   * @internal Binds a raw OrtValue the caller owns and keeps alive until the binding is done with it
   * (the runtime's own byte copies use this).
   */
  bindRaw(name: string, value: Ptr, as: 'input' | 'output'): this {
    const { api } = ortEnv();
    const b = this.live();
    if (as === 'input') {
      this.session.input(name);
      this.releaseStaged(name);
      api.call('BindInput', b, name, value);
      this.rawInputs.add(name);
    } else {
      this.session.output(name);
      api.call('BindOutput', b, name, value);
      this.outputSlots.set(name, { kind: 'raw' });
    }
    return this;
  }

  /**
   * Binds an output: to a preallocated device tensor (written in place), or to memory ORT allocates
   * on the session's device (`'device'`, the default) or on the host (`'host'`).
   */
  output(name: string, where: DeviceTensor | OutputPlacement = 'device'): this {
    const { api } = ortEnv();
    const b = this.live();
    const info = this.session.output(name);
    if (where instanceof DeviceTensor) {
      this.checkType('output', info, where.dtype, where.dims);
      api.call('BindOutput', b, name, where.live(`output '${name}'`));
      this.outputSlots.set(name, { kind: 'tensor', tensor: where });
    } else {
      api.call('BindOutputToDevice', b, name, where === 'host' ? cpuMemoryInfo() : this.session.device.memoryInfo);
      this.outputSlots.set(name, { kind: where });
    }
    return this;
  }

  private prepareRun(): void {
    this.live();
    const missing = this.session.inputs.filter((i) => !this.inputTensors.has(i.name) && !this.stagedInputs.has(i.name) && !this.rawInputs.has(i.name));
    if (missing.length) throw new Error(`session '${this.session.name}': unbound inputs ${missing.map((i) => `'${i.name}'`).join(', ')}`);
    for (const [name, t] of this.inputTensors) t.live(`input '${name}'`);
    for (const [name, s] of this.outputSlots) if (s.kind === 'tensor') s.tensor.live(`output '${name}'`);
    this.disposeProduced();
    // ORT keeps the values it allocated in the last run bound as if preallocated: bind allocated
    // outputs afresh so a run with other input shapes gets outputs of its own shapes.
    const { api } = ortEnv();
    for (const [name, s] of this.outputSlots) {
      if (s.kind === 'device' || s.kind === 'host') api.call('BindOutputToDevice', this.handle, name, s.kind === 'host' ? cpuMemoryInfo() : this.session.device.memoryInfo);
    }
  }

  /** Runs synchronously (blocks the event loop; the lowest overhead for short runs). */
  runSync(opts: Omit<RunOptions, 'signal'> = {}): void {
    const { api } = ortEnv();
    this.prepareRun();
    trace(`sync ${this.session.name}`);
    api.call('RunWithBinding', this.session.handle, opts.synchronize === false ? this.asyncRunOptions : this.runOptions, this.live());
    trace(`done ${this.session.name}`);
    this.collect();
  }

  /**
   * Runs on a worker thread, so the event loop (progress, signals) keeps going during long runs —
   * on the CPU. On CUDA the run is synchronous: runs issued from libuv's pool threads (several
   * threads per process) crash ONNX Runtime's CUDA provider with a segmentation fault, and runs on
   * one thread do not (docs/runtime.md).
   */
  async run(opts: RunOptions = {}): Promise<void> {
    if (this.session.device.kind !== 'cpu') {
      if (opts.signal?.aborted) throw new Error(`session '${this.session.name}': run aborted before it started`);
      this.runSync(opts);
      return;
    }
    const { api } = ortEnv();
    this.prepareRun();
    // a fresh RunOptions per async run, so terminating it cannot leak into later runs
    const ro = api.out('CreateRunOptions');
    if (opts.synchronize === false) api.call('AddRunConfigEntry', ro, 'disable_synchronize_execution_providers', '1');
    for (const [k, v] of this.runConfigEntries) api.call('AddRunConfigEntry', ro, k, v);
    const abort = () => api.call('RunOptionsSetTerminate', ro);
    if (opts.signal?.aborted) abort();
    opts.signal?.addEventListener('abort', abort);
    try {
      trace(`async ${this.session.name}`);
      await api.callAsync('RunWithBinding', this.session.handle, ro, this.live());
      trace(`done ${this.session.name}`);
    } finally {
      opts.signal?.removeEventListener('abort', abort);
      api.fn('ReleaseRunOptions')(ro);
    }
    this.collect();
  }

  /** Waits for the device work of the last run (after `run({ synchronize: false })`). */
  synchronize(): void {
    ortEnv().api.call('SynchronizeBoundOutputs', this.live());
  }

  /** Wraps the outputs ORT allocated in the last run. */
  private collect(): void {
    const allocated = [...this.outputSlots].filter(([, s]) => s.kind === 'device' || s.kind === 'host');
    if (allocated.length === 0) return;
    const { api } = ortEnv();
    const alloc = cpuAllocator();
    const namesOut: (Ptr | null)[] = [null];
    const lengthsOut: (Ptr | null)[] = [null];
    const countOut: number[] = [0];
    api.check('GetBoundOutputNames', api.fn('GetBoundOutputNames')(this.handle, alloc, namesOut, lengthsOut, countOut));
    const count = Number(countOut[0]);
    const lengths = api.sizes(lengthsOut[0]!, count);
    const buffer = api.bytes(namesOut[0]!, lengths.reduce((a, b) => a + b, 0));
    const names: string[] = [];
    let at = 0;
    for (const n of lengths) {
      names.push(Buffer.from(buffer.subarray(at, at + n)).toString('utf8'));
      at += n;
    }
    api.call('AllocatorFree', alloc, namesOut[0]);
    api.call('AllocatorFree', alloc, lengthsOut[0]);
    const valuesOut: (Ptr | null)[] = [null];
    const valueCount: number[] = [0];
    api.check('GetBoundOutputValues', api.fn('GetBoundOutputValues')(this.handle, alloc, valuesOut, valueCount));
    const values = api.pointers(valuesOut[0]!, Number(valueCount[0]));
    api.call('AllocatorFree', alloc, valuesOut[0]);
    names.forEach((name, i) => {
      const slot = this.outputSlots.get(name);
      if (!slot || (slot.kind !== 'device' && slot.kind !== 'host')) {
        api.fn('ReleaseValue')(values[i]);
        return;
      }
      const { dtype, dims } = tensorTypeOf(values[i]);
      const device = slot.kind === 'host' ? this.session.device.hostDevice() : this.session.device;
      this.produced.set(name, new DeviceTensor(device, values[i], dtype, dims));
    });
  }

  /**
   * The output `name` of the last run as a device tensor. For outputs bound to a preallocated tensor
   * this is that tensor; for allocated outputs the binding keeps ownership (valid until the next
   * run or `dispose`; use `take` to keep it).
   */
  get(name: string): DeviceTensor {
    const slot = this.outputSlots.get(name);
    if (!slot) throw new Error(`session '${this.session.name}': output '${name}' is not bound`);
    if (slot.kind === 'tensor') return slot.tensor;
    if (slot.kind === 'raw') throw new Error(`session '${this.session.name}': output '${name}' is bound to a raw value`);
    const t = this.produced.get(name);
    if (!t) throw new Error(`session '${this.session.name}': output '${name}' has no value (run first)`);
    return t;
  }

  /** Like `get`, but hands an allocated output over to the caller (who must dispose it). */
  take(name: string): DeviceTensor {
    const t = this.get(name);
    this.produced.delete(name);
    return t;
  }

  /** The output `name` of the last run, copied to the host. */
  fetch(name: string): HostTensor {
    return this.get(name).download();
  }

  /** The first element of a scalar-like output as a number (a small download). */
  scalar(name: string): number {
    const d = this.fetch(name).data;
    return Number(d[0]);
  }

  private releaseStaged(name: string): void {
    const s = this.stagedInputs.get(name);
    if (s !== undefined) {
      ortEnv().api.fn('ReleaseValue')(s);
      this.stagedInputs.delete(name);
    }
  }

  private disposeProduced(): void {
    for (const t of this.produced.values()) t.dispose();
    this.produced = new Map();
  }

  /** Releases the binding, its staged host inputs and the outputs it still owns. */
  dispose(): void {
    if (this.released) return;
    this.released = true;
    const { api } = ortEnv();
    for (const name of [...this.stagedInputs.keys()]) this.releaseStaged(name);
    this.disposeProduced();
    this.inputTensors.clear();
    this.outputSlots.clear();
    api.fn('ReleaseIoBinding')(this.handle);
    api.fn('ReleaseRunOptions')(this.runOptions);
    api.fn('ReleaseRunOptions')(this.asyncRunOptions);
    this.session.forget(this);
  }
}

/** Copies a host tensor into a new ORT-allocated CPU value (the caller releases it). */
export function stageOnHost(dtype: DType, t: HostTensor): Ptr {
  const { api } = ortEnv();
  const value = api.out('CreateTensorAsOrtValue', cpuAllocator(), BigInt64Array.from(t.dims.map(BigInt)), t.dims.length, onnxTypeCode(dtype));
  if (sizeOf(t.dims) > 0) api.copyIn(api.out('GetTensorMutableData', value), t.data);
  return value;
}

/**
 * CUDA-graph replay re-runs a captured host-to-device copy from host memory ONNX Runtime freed
 * after capture, so a kernel that copies per-run tables from the host (see `hostTableNodes`) can
 * read stale addresses on replay: such a graph is refused, naming the nodes.
 */
/** Sets `vars` in the process environment; the returned function puts back what was there. */
function setEnv(vars: Record<string, string> | undefined): () => void {
  if (!vars) return () => {};
  const before = Object.keys(vars).map((k) => [k, process.env[k]] as const);
  for (const [k, v] of Object.entries(vars)) process.env[k] = v;
  return () => {
    for (const [k, v] of before) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  };
}

function refuseHostTables(graph: Graph, name: string): void {
  const nodes = hostTableNodes(graph);
  if (nodes.length === 0) return;
  const list = nodes.slice(0, 5).map((n) => `${n.name} (${n.op.name} of ${n.op.name === 'Concat' ? n.inputs.length : n.outputs.length} parts)`);
  throw new Error(
    `cudaGraph: '${name}' has ${nodes.length} Concat/Split node(s) whose CUDA kernels copy index tables from the host on every run, which CUDA-graph replay would read stale: ` +
      `${list.join(', ')}${nodes.length > 5 ? ', …' : ''}. Give their parts equal static sizes along the axis, at most 32 of them, or run without cudaGraph.`,
  );
}

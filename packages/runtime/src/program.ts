/**
 * `Program`: a compiled graph with typed, named inputs and outputs, on one of two paths —
 * - `binding` (default): ORT's C API with IoBinding; inputs may be device tensors (bound by address)
 *   or host tensors; state stays on the device between runs;
 * - `plain`: onnxruntime-node's JavaScript API; host tensors in and out on every run.
 * Both give the same results for the same graph (tested); the binding path is the one that keeps
 * weights and optimizer state on the GPU.
 */
import type { DType, Graph } from '@lathe/onnx';
import { Device, type DeviceKind } from './device';
import type { HostTensor } from './host';
import { PlainSession } from './plain';
import { type Binding, type RunOptions, Session, type SessionOptions } from './session';
import { DeviceTensor } from './tensor';

/** Which ONNX Runtime API a program runs through. */
export type ProgramBackend = 'binding' | 'plain';

/** Options of `Program.compile`. */
export interface ProgramOptions extends SessionOptions {
  /** Where it runs (default: the CPU). */
  device?: Device | DeviceKind;
  /** Which API (default `binding`). */
  backend?: ProgramBackend;
}

/** A graph's input or output as declared in the DSL. */
export interface ProgramIO {
  name: string;
  dtype: DType;
  dims: readonly (number | string)[];
}

/** A compiled graph, runnable with host or device tensors. */
export class Program {
  private constructor(
    readonly graph: Graph,
    readonly backend: ProgramBackend,
    readonly device: Device,
    private readonly session: Session | undefined,
    private readonly plain: PlainSession | undefined,
  ) {}

  /** Compiles a DSL graph. */
  static async compile(graph: Graph, opts: ProgramOptions = {}): Promise<Program> {
    const device = opts.device instanceof Device ? opts.device : Device.open(opts.device ?? 'cpu');
    const backend = opts.backend ?? 'binding';
    if (backend === 'binding') return new Program(graph, backend, device, device.compile(graph, opts), undefined);
    if (device.kind !== 'cpu' && device.kind !== 'cuda') throw new Error(`plain backend: unsupported device ${device.name}`);
    const plain = await PlainSession.create(graph, { device: device.kind, modelPath: opts.modelPath, allowCpuFallback: opts.allowCpuFallback, logLevel: opts.logLevel });
    return new Program(graph, backend, device, undefined, plain);
  }

  /** The graph's inputs. */
  get inputs(): ProgramIO[] {
    return this.graph.inputs.map((t) => ({ name: t.name, dtype: t.dtype, dims: t.shape.map((d) => (typeof d === 'number' ? d : String(d))) }));
  }

  /** The graph's outputs. */
  get outputs(): ProgramIO[] {
    return this.graph.outputs.map((t) => ({ name: t.name, dtype: t.dtype, dims: t.shape.map((d) => (typeof d === 'number' ? d : String(d))) }));
  }

  /** Checks feeds against the graph's inputs: every input present, dtype and static dims right. */
  private check(feeds: Record<string, HostTensor | DeviceTensor>): void {
    for (const i of this.inputs) {
      const f = feeds[i.name];
      if (!f) throw new Error(`program '${this.graph.name}': missing input '${i.name}' (${i.dtype} [${i.dims.join(', ')}])`);
      const dims = f.dims;
      const bad = dims.length !== i.dims.length || i.dims.some((d, k) => typeof d === 'number' && d !== dims[k]);
      if (bad) throw new Error(`program '${this.graph.name}': input '${i.name}' wants [${i.dims.join(', ')}], got [${dims.join(', ')}]`);
      if (f instanceof DeviceTensor && f.dtype !== i.dtype) throw new Error(`program '${this.graph.name}': input '${i.name}' is ${i.dtype}, got ${f.describe()}`);
    }
    const known = new Set(this.graph.inputs.map((t) => t.name));
    for (const k of Object.keys(feeds)) if (!known.has(k)) throw new Error(`program '${this.graph.name}': unknown input '${k}' (inputs: ${[...known].join(', ')})`);
  }

  /** Runs once and returns the requested outputs (default: all) on the host. */
  async run(feeds: Record<string, HostTensor | DeviceTensor>, opts: { outputs?: string[] } & RunOptions = {}): Promise<Record<string, HostTensor>> {
    this.check(feeds);
    if (this.session) return this.session.run(feeds, opts);
    const host: Record<string, HostTensor> = {};
    for (const [k, v] of Object.entries(feeds)) host[k] = v instanceof DeviceTensor ? v.download() : v;
    return this.plain!.run(host, opts.outputs);
  }

  /** A persistent IoBinding (binding backend only) for repeated runs over device tensors. */
  binding(): Binding {
    if (!this.session) throw new Error(`program '${this.graph.name}' uses the plain backend, which has no IoBinding; compile with backend: 'binding'`);
    return this.session.binding();
  }

  /** The C API session (binding backend only). */
  get nativeSession(): Session {
    if (!this.session) throw new Error(`program '${this.graph.name}' uses the plain backend`);
    return this.session;
  }

  /** Releases the session. */
  async dispose(): Promise<void> {
    this.session?.dispose();
    await this.plain?.dispose();
  }
}

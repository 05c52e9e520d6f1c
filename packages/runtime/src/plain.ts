/**
 * Running a DSL graph with host tensors through onnxruntime-node's plain JavaScript API. Every
 * input and output crosses the host boundary on each run (slow on CUDA: docs/runtime.md, "Why a C
 * API path"): fine on the CPU provider and for simple inference; state that should stay on the GPU
 * goes through `Device` + `Session` (the C API path) instead.
 */
import { writeFileSync } from 'node:fs';
import * as ort from 'onnxruntime-node';
import { toModelBytes, type DType, type Graph } from '@lathe/onnx';
import type { HostTensor } from './host';

/** Where a session runs. */
export type SessionDevice = 'cpu' | 'cuda';

const ortTypes: Partial<Record<DType, ort.Tensor.Type>> = {
  float32: 'float32',
  float16: 'float16',
  float64: 'float64',
  int8: 'int8',
  int32: 'int32',
  int64: 'int64',
  bool: 'bool',
  uint8: 'uint8',
  uint32: 'uint32',
};

/** A compiled graph and its ONNX Runtime session. */
export class PlainSession {
  private constructor(
    private readonly graph: Graph,
    private readonly session: ort.InferenceSession,
  ) {}

  /**
   * Compiles `graph` for `device`. Graphs with external initializers must be written next to their
   * data: pass `modelPath` and the model is saved there and loaded from the file. CUDA never falls
   * back to the CPU silently: a missing provider is an error.
   */
  static async create(graph: Graph, opts: { device?: SessionDevice; modelPath?: string; allowCpuFallback?: boolean; logLevel?: 0 | 1 | 2 | 3 | 4 } = {}): Promise<PlainSession> {
    const device = opts.device ?? 'cpu';
    const options: ort.InferenceSession.SessionOptions = {
      executionProviders: [device === 'cuda' ? { name: 'cuda', deviceId: 0 } : 'cpu'],
      graphOptimizationLevel: 'all',
      // CPU fallback is an explicit, diagnostic choice (logLevel 1 makes ORT list node placements).
      ...(device === 'cuda' && !opts.allowCpuFallback ? { extra: { session: { disable_cpu_ep_fallback: '1' } } } : {}),
      ...(opts.logLevel !== undefined ? { logSeverityLevel: opts.logLevel } : {}),
    };
    const bytes = toModelBytes(graph);
    let session: ort.InferenceSession;
    try {
      if (opts.modelPath) {
        writeFileSync(opts.modelPath, bytes);
        session = await ort.InferenceSession.create(opts.modelPath, options);
      } else session = await ort.InferenceSession.create(bytes, options);
    } catch (e) {
      const hint = device === 'cuda' ? ' (is the CUDA provider installed? run `lathe doctor`)' : '';
      throw new Error(`could not create a ${device} session for graph '${graph.name}'${hint}: ${(e as Error).message}`);
    }
    return new PlainSession(graph, session);
  }

  /** Names of the graph's inputs. */
  get inputNames(): string[] {
    return this.graph.inputs.map((t) => t.name);
  }

  /** Runs with host feeds (every graph input by name) and returns the requested (default: all) outputs. */
  async run(feeds: Record<string, HostTensor>, outputs?: string[]): Promise<Record<string, HostTensor>> {
    const inputs: Record<string, ort.Tensor> = {};
    for (const t of this.graph.inputs) {
      const f = feeds[t.name];
      if (!f) throw new Error(`graph '${this.graph.name}': missing input '${t.name}' (${t.dtype} [${t.shape.join(', ')}])`);
      const type = ortTypes[t.dtype];
      if (!type) throw new Error(`graph '${this.graph.name}': input '${t.name}' has dtype ${t.dtype}, which host sessions do not feed`);
      inputs[t.name] = new ort.Tensor(type, f.data as never, f.dims);
    }
    const out = outputs ? await this.session.run(inputs, outputs) : await this.session.run(inputs);
    const result: Record<string, HostTensor> = {};
    for (const [k, v] of Object.entries(out)) result[k] = { data: v.data as HostTensor['data'], dims: [...v.dims] };
    return result;
  }

  /** Releases the native session. */
  async dispose(): Promise<void> {
    await this.session.release();
  }
}

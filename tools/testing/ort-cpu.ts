/** Test helper: run a DSL graph on onnxruntime-node's CPU provider. */
import * as ort from 'onnxruntime-node';
import { toModelBytes, type Graph, type DType } from '@lathe/onnx';

/** A host tensor for tests. */
export interface HostTensor {
  data: Float64Array | Float32Array | Int32Array | BigInt64Array | Uint8Array;
  dims: number[];
}

const ortType: Partial<Record<DType, ort.Tensor.Type>> = {
  float32: 'float32',
  float64: 'float64',
  int32: 'int32',
  int64: 'int64',
  bool: 'bool',
  uint8: 'uint8',
};

/** A compiled CPU session for a graph; `run` feeds inputs by name and returns every output. */
export async function compile(graph: Graph, path?: string): Promise<(feeds: Record<string, HostTensor>) => Promise<Record<string, HostTensor>>> {
  const options: ort.InferenceSession.SessionOptions = { executionProviders: ['cpu'], graphOptimizationLevel: 'all' };
  // A model with external initializers is loaded from its file so ORT can resolve their paths.
  const session = path ? await ort.InferenceSession.create(path, options) : await ort.InferenceSession.create(toModelBytes(graph), options);
  return async (feeds) => {
    const inputs: Record<string, ort.Tensor> = {};
    for (const t of graph.inputs) {
      const f = feeds[t.name];
      if (!f) throw new Error(`missing feed ${t.name}`);
      inputs[t.name] = new ort.Tensor(ortType[t.dtype]!, f.data as never, f.dims);
    }
    const out = await session.run(inputs);
    const result: Record<string, HostTensor> = {};
    for (const [k, v] of Object.entries(out)) result[k] = { data: v.data as HostTensor['data'], dims: [...v.dims] };
    return result;
  };
}

/** Deterministic pseudo-random numbers (mulberry32). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A CPU-side prediction of the nodes ONNX Runtime's CUDA provider hands to the CPU, so a graph
 * meant for a CUDA session with CPU fallback off (Lathe's default) can be checked without a GPU.
 *
 * The rule is ONNX Runtime's `GetCpuPreferredNodes` (onnxruntime/core/framework/
 * fallback_cpu_capability.cc, as in the 1.2x line up to 1.29, the version package-lock pins),
 * which the CUDA provider's `GetCapability` applies to the nodes it has kernels for:
 * 1. Seeds: every consumer of an output the provider's kernel declares in CPU memory (Shape's and
 *    Size's output).
 * 2. Candidates are popped in topological order. A candidate with no CUDA kernel runs on the CPU
 *    anyway: its outputs become CPU tensors and its consumers candidates. A candidate with a
 *    kernel goes to the CPU when, for every input: the type is not float16/bfloat16/float8, and
 *    the input is a small initializer (≤ 100 elements), a graph input (whatever its size), or a
 *    CPU tensor that the CUDA kernel does not itself declare as a CPU input (Reshape's shape,
 *    Expand's shape, Slice's starts/ends/axes/steps, …). Its outputs then become CPU tensors and
 *    its consumers candidates.
 * 3. With ORT_AGGRESSIVE_CPU_FALLBACK=1 (off by default; `aggressive` here) every node upstream of
 *    a shape input of Expand/Reshape/Unsqueeze/ConstantOfShape/Slice, up to Shape/Size nodes, too.
 *
 * The provider sees the graph after ONNX Runtime's level-1 optimizations, of which three are
 * modelled because they change what the rule sees: Constant nodes become initializers, constant
 * folding (a node whose inputs are all non-overridable initializers becomes an initializer, and a
 * Shape whose selected dims are all static becomes one), and the transpose optimizer's rewrite of
 * Shape(Transpose(x)) — also through Slice/Squeeze/Unsqueeze, which it pushes transposes through,
 * and Reshape, which it pushes them through when the Reshape only moves size-1 dims (taken here as
 * always, to be safe) — into Gather(Shape(x), perm), a Gather of a CPU tensor and a small
 * initializer that the rule puts on the CPU. Other fusions are not modelled. Nodes inside Loop/If bodies are checked per body, with
 * values from outside treated as device tensors (as the rule does: they are neither graph inputs
 * of the body nor CPU outputs in it).
 */
import { dtypeFromOnnxCode } from './dtype';
import { AttributeType, OnnxDataType, type GraphProto, type ModelProto, type NodeProto, type TensorProto } from './proto';

/**
 * Inputs that ONNX Runtime's CUDA kernels read from CPU memory (`InputMemoryType(OrtMemTypeCPUInput, i)`
 * in onnxruntime/core/providers/cuda/**), by op type, at the opset-21 versions Lathe emits. A CPU
 * tensor feeding one of these keeps its consumer on the GPU.
 */
export const CUDA_CPU_INPUTS: Readonly<Record<string, readonly number[]>> = {
  Reshape: [1], // tensor/reshape.cc
  Expand: [1], // tensor/expand.cc
  Slice: [1, 2, 3, 4], // tensor/slice.cc
  Squeeze: [1], // tensor/squeeze.cc
  Unsqueeze: [1], // tensor/unsqueeze.cc
  Tile: [1], // tensor/tile.cc
  Pad: [1, 2, 3], // tensor/pad.cc
  Split: [1], // tensor/split.cc
  OneHot: [1], // tensor/onehot.cc (depth)
  Trilu: [1], // tensor/trilu.cc
  Resize: [1, 2, 3], // tensor/resize.cc
  Upsample: [1], // tensor/upsample.cc
  ConstantOfShape: [0], // generator/constant_of_shape.cc
  Range: [0, 1, 2], // generator/range.cc
  TopK: [1], // math/topk.cc
  CumSum: [1], // math/cumsum.cc
  Clip: [1, 2], // math/clip.cc
  Dropout: [1, 2], // nn/dropout.cc
  ReduceSum: [1], // reduction/reduction_ops.cc: axes, for every Reduce op
  ReduceMax: [1],
  ReduceMin: [1],
  ReduceMean: [1],
  ReduceProd: [1],
  ReduceL1: [1],
  ReduceL2: [1],
  ReduceLogSum: [1],
  ReduceLogSumExp: [1],
  ReduceSumSquare: [1],
  NonMaxSuppression: [2, 3, 4], // object_detection/non_max_suppression.cc
  If: [0], // controlflow/if.cc (cond)
  Loop: [0, 1], // controlflow/loop.cc (trip count, cond)
  GroupQueryAttention: [6], // contrib_ops/cuda/bert/group_query_attention.cc (total_sequence_length)
};

/**
 * (op, dtype) pairs ONNX Runtime 1.29's CUDA provider has no kernel for: a session with CPU
 * fallback off refuses a graph holding one, and with fallback on the node runs on the CPU with
 * copies around it. Keyed by the node's first output dtype. Found on the H100:
 * - Pad, bfloat16: the KV prefill extends caches by a Slice of a zero buffer instead.
 * - ReduceMax, bfloat16: maxima over logits run in float32.
 * - Reciprocal, bfloat16: `rsqrt` divides instead.
 * - Multinomial (any dtype): GPU sampling draws by inverse CDF from host-made uniforms.
 * From the provider's kernel registrations (not yet seen failing on the H100):
 * - MaxPool, bfloat16 (`windowMax`, `lastAxisMax`): registered for float32, float64, float16 and
 *   8-bit integers only; the loss takes its maxima over float32 logits.
 */
export const NO_CUDA_KERNEL: Readonly<Record<string, readonly string[] | 'any'>> = {
  Pad: ['bfloat16'],
  ReduceMax: ['bfloat16'],
  Reciprocal: ['bfloat16'],
  Multinomial: 'any',
  MaxPool: ['bfloat16'],
};

/** Outputs that ONNX Runtime's CUDA kernels write to CPU memory (`OutputMemoryType(OrtMemTypeCPUOutput, i)`): the seeds of the rule. */
export const CUDA_CPU_OUTPUTS: Readonly<Record<string, readonly number[]>> = {
  Shape: [0], // tensor/shape_op.cc
  Size: [0], // tensor/size.cc
};

/** ONNX Runtime's `kSmallInitializerThreshold`: initializers of at most this many elements may feed a CPU-placed node. */
export const SMALL_INITIALIZER_ELEMENTS = 100;

/** Why a node is predicted to run on the CPU. */
export type CpuPlacementReason =
  /** GetCpuPreferredNodes: every input is a CPU tensor, a graph input or a small initializer. */
  | 'shape computation'
  /** The CUDA provider has no kernel for the op at this dtype (see NO_CUDA_KERNEL). */
  | 'no CUDA kernel'
  /** A Shape that the transpose optimizer rewrites into a CPU-placed Gather over Shape(x). */
  | 'Shape of a Transpose'
  /** Upstream of a shape input with ORT_AGGRESSIVE_CPU_FALLBACK=1. */
  | 'aggressive fallback';

/** A node predicted to run on the CPU. */
export interface CpuPlacedNode {
  /** The node's name (Lathe's names carry scopes such as `grad/…`). */
  name: string;
  opType: string;
  reason: CpuPlacementReason;
  /** Names of the nodes whose CPU outputs it reads ('' for none: it reads only graph inputs and small initializers). */
  from: string[];
  /** Names of the Loop/If bodies it sits in, outermost first (empty for the main graph). */
  subgraph: string[];
}

/** Options of {@link cpuPlacedNodes}. */
export interface CpuPlacementOptions {
  /** Also apply the ORT_AGGRESSIVE_CPU_FALLBACK=1 rule (off by default, as in ONNX Runtime). */
  aggressive?: boolean;
}

const HALF_TYPES: ReadonlySet<number> = new Set([OnnxDataType.FLOAT16, OnnxDataType.BFLOAT16, 17, 18, 19, 20]);
/** Ops constant folding leaves alone: random draws (their values change per run). */
const NOT_FOLDED: ReadonlySet<string> = new Set(['RandomNormal', 'RandomUniform', 'RandomNormalLike', 'RandomUniformLike', 'Multinomial', 'Bernoulli', 'Shape', 'Size']);
/** Ops the transpose optimizer pushes a Transpose through on its way to a Shape. */
const TRANSPOSE_TRANSPARENT: ReadonlySet<string> = new Set(['Slice', 'Squeeze', 'Unsqueeze', 'Reshape']);
/** ORT_AGGRESSIVE_CPU_FALLBACK's shape inputs (GetShapeRelatedNodes), at opset 21. */
const SHAPE_RELATED_INPUTS: Readonly<Record<string, readonly number[]>> = { Expand: [1], Reshape: [1], Unsqueeze: [1], ConstantOfShape: [0], Slice: [1, 2, 3, 4] };

interface ValueType {
  elemType?: number;
  dims?: (number | string)[];
}

function hasCudaKernel(node: NodeProto, types: Map<string, ValueType>): boolean {
  const gap = NO_CUDA_KERNEL[node.opType];
  if (gap === undefined) return true;
  if (gap === 'any') return false;
  const code = types.get(node.output[0] ?? '')?.elemType;
  if (code === undefined) return true;
  try {
    return !gap.includes(dtypeFromOnnxCode(code));
  } catch {
    return true;
  }
}

function intAttr(node: NodeProto, name: string): number | undefined {
  const a = node.attribute?.find((x) => x.name === name);
  return a?.i === undefined ? undefined : Number(a.i);
}

/** The selected dims of a Shape node (its start/end attributes, negative counting from the end). */
function shapeDims(node: NodeProto, dims: (number | string)[]): (number | string)[] {
  const rank = dims.length;
  const clamp = (v: number) => Math.min(Math.max(v < 0 ? v + rank : v, 0), rank);
  return dims.slice(clamp(intAttr(node, 'start') ?? 0), clamp(intAttr(node, 'end') ?? rank));
}

function check(graph: GraphProto, outerInitializers: Map<string, number>, path: string[], opts: CpuPlacementOptions, found: CpuPlacedNode[]): void {
  const types = new Map<string, ValueType>();
  for (const v of [...graph.input, ...(graph.valueInfo ?? []), ...graph.output]) {
    const tt = v.type?.tensorType;
    types.set(v.name, { elemType: tt?.elemType, dims: tt?.shape?.dim.map((d) => (d.dimValue !== undefined && d.dimValue !== null ? Number(d.dimValue) : (d.dimParam ?? '?'))) });
  }
  const graphInputs = new Set(graph.input.map((v) => v.name));
  // initializers visible here (name → element count), and which of them are constants (not overridable inputs)
  const initializers = new Map(outerInitializers);
  const constants = new Set<string>();
  const addInitializer = (t: TensorProto | { name: string; dims: number[]; dataType: number }) => {
    const name = t.name ?? '';
    initializers.set(name, (t.dims ?? []).map(Number).reduce((a, b) => a * b, 1));
    if (!graphInputs.has(name)) constants.add(name);
    if (!types.has(name)) types.set(name, { elemType: t.dataType, dims: (t.dims ?? []).map(Number) });
  };
  (graph.initializer ?? []).forEach(addInitializer);

  // level-1 rewrites: Constant nodes and folded nodes become initializers; Shape(Transpose) is noted
  const producer = new Map<string, NodeProto>();
  graph.node.forEach((n) => n.output.forEach((o) => producer.set(o, n)));
  const nodes: NodeProto[] = [];
  const shapeOfTranspose = new Set<NodeProto>();
  for (const n of graph.node) {
    if (n.opType === 'Constant' && (n.domain ?? '') === '') {
      const t = n.attribute?.find((a) => a.name === 'value')?.t;
      addInitializer({ name: n.output[0], dims: t?.dims?.map(Number) ?? [], dataType: t?.dataType ?? 0 });
      continue;
    }
    if (n.opType === 'Shape' && (n.domain ?? '') === '') {
      const dims = types.get(n.input[0])?.dims;
      const selected = dims && shapeDims(n, dims);
      if (selected && selected.every((d) => typeof d === 'number')) {
        addInitializer({ name: n.output[0], dims: [selected.length], dataType: OnnxDataType.INT64 });
        continue;
      }
      let p = producer.get(n.input[0]);
      while (p && TRANSPOSE_TRANSPARENT.has(p.opType)) p = producer.get(p.input[0]);
      if (p?.opType === 'Transpose') shapeOfTranspose.add(n);
    }
    const ins = n.input.filter((i) => i !== '');
    const foldable = ins.length > 0 && ins.every((i) => constants.has(i)) && !NOT_FOLDED.has(n.opType) && ['', 'com.microsoft'].includes(n.domain ?? '') && !n.attribute?.some((a) => a.type === AttributeType.GRAPH);
    if (foldable) {
      for (const o of n.output) addInitializer({ name: o, dims: (types.get(o)?.dims ?? []).map((d) => (typeof d === 'number' ? d : SMALL_INITIALIZER_ELEMENTS + 1)), dataType: types.get(o)?.elemType ?? 0 });
      continue;
    }
    nodes.push(n);
  }

  const order = new Map(nodes.map((n, i) => [n, i]));
  const consumers = new Map<string, NodeProto[]>();
  for (const n of nodes) for (const i of n.input) if (i !== '') consumers.set(i, [...(consumers.get(i) ?? []), n]);
  const liveProducer = new Map<string, NodeProto>();
  nodes.forEach((n) => n.output.forEach((o) => liveProducer.set(o, n)));
  const provider = new Set(nodes.filter((n) => hasCudaKernel(n, types)));

  // GetCpuPreferredNodes
  const cpuArgs = new Set<string>();
  const queue: NodeProto[] = [];
  const push = (arg: string) => queue.push(...(consumers.get(arg) ?? []));
  for (const n of provider) {
    for (const i of CUDA_CPU_OUTPUTS[n.opType] ?? []) {
      const o = n.output[i];
      if (o === undefined || o === '') continue;
      cpuArgs.add(o);
      push(o);
    }
  }
  const visited = new Set<NodeProto>();
  const cpuNodes = new Map<NodeProto, CpuPlacementReason>();
  while (queue.length > 0) {
    queue.sort((a, b) => order.get(b)! - order.get(a)!); // pop the earliest in topological order
    const cur = queue.pop()!;
    if (visited.has(cur)) continue;
    visited.add(cur);
    if (!provider.has(cur)) {
      cpuNodes.set(cur, 'no CUDA kernel');
      cur.output.forEach((o) => {
        cpuArgs.add(o);
        push(o);
      });
      continue;
    }
    const cpuInputs = CUDA_CPU_INPUTS[cur.opType] ?? [];
    const placeOnCpu = cur.input.every((input, i) => {
      const t = types.get(input);
      if (t?.elemType !== undefined && HALF_TYPES.has(t.elemType)) return false;
      if (input !== '' && (((initializers.get(input) ?? Infinity) <= SMALL_INITIALIZER_ELEMENTS) || graphInputs.has(input))) return true;
      if (!cpuArgs.has(input)) return false;
      return !cpuInputs.includes(i);
    });
    if (placeOnCpu) {
      cpuNodes.set(cur, 'shape computation');
      cur.output.forEach((o) => {
        cpuArgs.add(o);
        push(o);
      });
    }
  }
  // nodes without a CUDA kernel that nothing on the CPU reaches are assigned to the CPU all the same
  for (const n of nodes) if (!provider.has(n) && !cpuNodes.has(n)) cpuNodes.set(n, 'no CUDA kernel');
  for (const n of shapeOfTranspose) if (!cpuNodes.has(n)) cpuNodes.set(n, 'Shape of a Transpose');

  if (opts.aggressive) {
    const stop = (n: NodeProto) => n.opType === 'Shape' || n.opType === 'Size';
    for (const n of nodes) {
      for (const i of SHAPE_RELATED_INPUTS[n.opType] ?? []) {
        const start = liveProducer.get(n.input[i] ?? '');
        if (!start || stop(start)) continue;
        const stack = [start];
        const seen = new Set<NodeProto>();
        while (stack.length > 0) {
          const m = stack.pop()!;
          if (seen.has(m)) continue;
          seen.add(m);
          if (!cpuNodes.has(m)) cpuNodes.set(m, 'aggressive fallback');
          for (const inp of m.input) {
            const p = liveProducer.get(inp);
            if (p && !stop(p)) stack.push(p);
          }
        }
      }
    }
  }

  for (const n of nodes) {
    const reason = cpuNodes.get(n);
    if (reason) {
      const from = [...new Set(n.input.filter((i) => cpuArgs.has(i)).map((i) => liveProducer.get(i)?.name ?? ''))].filter((s) => s !== '');
      found.push({ name: n.name ?? '', opType: n.opType, reason, from, subgraph: path });
    }
    for (const a of n.attribute ?? []) if (a.g) check(a.g, initializers, [...path, `${n.name ?? n.opType}.${a.name}`], opts, found);
  }
}

/**
 * The nodes of an ONNX model that ONNX Runtime's CUDA provider would place on the CPU (see the
 * module comment for the rule and what of ORT's graph optimizations is modelled), in topological
 * order. A CUDA session with CPU fallback disabled refuses a model with any; build the model with
 * `toModelProto(graph)`.
 */
export function cpuPlacedNodes(model: ModelProto, opts: CpuPlacementOptions = {}): CpuPlacedNode[] {
  const found: CpuPlacedNode[] = [];
  check(model.graph, new Map(), [], opts, found);
  return found;
}

/** One line per node of {@link cpuPlacedNodes}' result, for test failures and logs. */
export function describeCpuPlacement(nodes: readonly CpuPlacedNode[]): string {
  return nodes.map((n) => `${[...n.subgraph, n.name].join(' / ')} (${n.opType}): ${n.reason}${n.from.length ? ` ← ${n.from.join(', ')}` : ''}`).join('\n');
}

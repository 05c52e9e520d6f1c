/**
 * The graph: symbolic tensors, the nodes that produce them, graph inputs/outputs and initializers.
 * Nodes are appended as ops are called, so the node list is always in topological order.
 */
import { dtypeBytes, type DType } from './dtype';
import { canonicalDim, dimSymbols, dimCoefficient, formatShape, isStaticDim, type Dim, type Shape } from './dim';
import type { OpDef, TensorType } from './op';

/** Where a graph's weight lives when it is an initializer. */
export type InitializerData =
  | { kind: 'inline'; bytes: Uint8Array }
  /** Bytes at (file, offset, length): e.g. a tensor inside a safetensors file. */
  | { kind: 'external'; location: string; offset: number; length: number };

/** One op application. */
export interface Node {
  op: OpDef<object>;
  inputs: (Tensor | null)[];
  outputs: Tensor[];
  attrs: object;
  /** Unique node name, prefixed by the scope it was built in (shows in ORT errors and profiles). */
  name: string;
}

/** A symbolic tensor: a value in a graph, with static dtype and (possibly symbolic) shape. */
export class Tensor {
  /** Unique value name in the ONNX model. */
  name: string;
  constructor(
    /** The graph that defines this value. */
    readonly graph: Graph,
    name: string,
    /** Element type. */
    readonly dtype: DType,
    /** Shape; strings are symbolic dims. */
    readonly shape: Dim[],
    /** The node that produces it (undefined for graph inputs and initializers). */
    readonly node?: Node,
  ) {
    this.name = name;
  }
  /** Number of dimensions. */
  get rank(): number {
    return this.shape.length;
  }
  /** `float32[B, T, 64]`, for messages. */
  toString(): string {
    return `${this.dtype}${formatShape(this.shape)}`;
  }
}

/** A shape/dtype error, raised while the graph is built. Names the op, shapes and caller line. */
export class GraphError extends Error {
  override name = 'GraphError';
}

/** A value the DSL accepts where a tensor is expected: a tensor or a JS number (a scalar). */
export type TensorLike = Tensor | number;

interface Counter {
  next: number;
  names: Set<string>;
}

const building: Graph[] = [];

/**
 * A computation graph. The root graph becomes an ONNX model; child graphs are Loop/If bodies and
 * may read any value of their ancestors (ONNX outer-scope references).
 */
export class Graph {
  /** Nodes in topological (creation) order. */
  readonly nodes: Node[] = [];
  /** Graph inputs, in order. */
  readonly inputs: Tensor[] = [];
  /** Graph outputs, in order. */
  readonly outputs: Tensor[] = [];
  /** Initializer data by tensor name. */
  readonly initializers = new Map<string, { tensor: Tensor; data: InitializerData }>();
  /** Where each symbolic dim can be read at run time: a tensor and an axis. */
  private readonly dimSources = new Map<string, { tensor: Tensor; axis: number }>();
  private readonly dimCache = new Map<string, Tensor>();
  private readonly constCache = new Map<string, Tensor>();
  private readonly counter: Counter;
  private readonly scopes: string[] = [];

  constructor(
    /** Graph name in the ONNX model. */
    readonly name = 'lathe',
    /** Enclosing graph for Loop/If bodies. */
    readonly parent?: Graph,
  ) {
    this.counter = parent ? parent.counter : { next: 0, names: new Set() };
  }

  /** The root graph (the model). */
  get root(): Graph {
    return this.parent ? this.parent.root : this;
  }

  /** Whether `g` is this graph or one of its ancestors. */
  sees(g: Graph): boolean {
    for (const cur of this.lineage()) if (cur === g) return true;
    return false;
  }

  /** This graph, then its ancestors up to the root. */
  private *lineage(): Generator<Graph> {
    yield this;
    if (this.parent) yield* this.parent.lineage();
  }

  /** A fresh unique name with the given prefix. */
  uniqueName(prefix: string): string {
    const name = this.freshName(prefix);
    this.counter.names.add(name);
    return name;
  }

  /** A name with the given prefix that is not used yet (not reserved: pass it to `input`). */
  freshName(prefix: string): string {
    let name = `${prefix}${this.counter.next++}`;
    while (this.counter.names.has(name)) name = `${prefix}${this.counter.next++}`;
    return name;
  }

  private claimName(name: string): void {
    if (this.counter.names.has(name)) throw new GraphError(`the name '${name}' is already used in this graph`);
    this.counter.names.add(name);
  }

  /** Declares a graph input. Symbolic dims in `shape` can then be used anywhere in the graph. */
  input(name: string, dtype: DType, shape: Shape): Tensor {
    this.claimName(name);
    const t = new Tensor(this, name, dtype, shape.map(canonicalDim));
    this.inputs.push(t);
    this.registerDims(t);
    return t;
  }

  /** Marks a tensor as a graph output, optionally under a new name. */
  output(t: Tensor, name?: string): Tensor {
    const renamable = t.node !== undefined && t.graph === this && !this.outputs.includes(t);
    if (!renamable) {
      // Inputs, initializers, outer values and tensors output twice go through an Identity.
      t = applyOp(identityOp(), [t], {}, this)[0];
    }
    if (name !== undefined && name !== t.name) {
      this.claimName(name);
      this.counter.names.delete(t.name);
      t.name = name;
    }
    this.outputs.push(t);
    return t;
  }

  /** Adds a weight stored in the model (inline bytes or an external file range). */
  initializer(name: string, dtype: DType, shape: number[], data: InitializerData): Tensor {
    if (this.parent) return this.root.initializer(name, dtype, shape, data);
    this.claimName(name);
    return this.addInitializer(name, dtype, shape, data);
  }

  private addInitializer(name: string, dtype: DType, shape: number[], data: InitializerData): Tensor {
    const expected = shape.reduce((a, b) => a * b, 1) * dtypeBytes(dtype);
    const got = data.kind === 'inline' ? data.bytes.byteLength : data.length;
    if (got !== expected) {
      throw new GraphError(`initializer '${name}': ${dtype}${formatShape(shape)} needs ${expected} bytes, got ${got}`);
    }
    const t = new Tensor(this, name, dtype, shape);
    this.initializers.set(name, { tensor: t, data });
    return t;
  }

  /** A constant tensor from JS values (deduplicated for small constants). */
  constant(values: ArrayLike<number> | number, dtype: DType, shape?: number[]): Tensor {
    if (this.parent) return this.root.constant(values, dtype, shape);
    const arr = typeof values === 'number' ? [values] : Array.from(values);
    const dims = shape ?? (typeof values === 'number' ? [] : [arr.length]);
    const n = dims.reduce((a, b) => a * b, 1);
    if (n !== arr.length) throw new GraphError(`constant of shape ${formatShape(dims)} needs ${n} values, got ${arr.length}`);
    const key = arr.length <= 64 ? `${dtype}|${dims.join(',')}|${arr.join(',')}` : undefined;
    const cached = key === undefined ? undefined : this.constCache.get(key);
    if (cached) return cached;
    let t: Tensor;
    if (dtype === 'float16' || dtype === 'bfloat16') {
      // Stored as float32 and cast: ORT folds the Cast when the session is created.
      const f32 = this.constant(arr, 'float32', dims);
      t = applyOp(castOp(), [f32], { to: dtype }, this)[0];
    } else {
      t = this.addInitializer(this.uniqueName('const'), dtype, dims, { kind: 'inline', bytes: encodeValues(arr, dtype) });
    }
    if (key !== undefined) this.constCache.set(key, t);
    return t;
  }

  /** Runs `fn` with node names prefixed by `name/` (shows in ORT profiles and errors). */
  scope<T>(name: string, fn: () => T): T {
    this.scopes.push(name);
    try {
      return fn();
    } finally {
      this.scopes.pop();
    }
  }

  /** The current scope prefix for node names. */
  scopePrefix(): string {
    const all: string[] = [];
    for (const g of this.lineage()) all.unshift(...g.scopes);
    return all.length ? `${all.join('/')}/` : '';
  }

  /** Records that `t`'s symbolic dims can be read from its shape at run time. */
  registerDims(t: Tensor): void {
    t.shape.forEach((d, axis) => {
      if (typeof d !== 'string') return;
      if (dimSymbols(d).length === 1 && dimCoefficient(d) === 1 && !this.findDimSource(d)) {
        this.dimSources.set(d, { tensor: t, axis });
      }
    });
  }

  private findDimSource(symbol: string): { tensor: Tensor; axis: number } | undefined {
    for (const g of this.lineage()) {
      const s = g.dimSources.get(symbol);
      if (s) return s;
    }
    return undefined;
  }

  /** The run-time value of a dim as an int64 tensor of shape [1]. */
  dimTensor(d: Dim): Tensor {
    const c = canonicalDim(d);
    if (isStaticDim(c)) return this.constant([c], 'int64', [1]);
    const cached = this.dimCache.get(c);
    if (cached) return cached;
    let result: Tensor | undefined;
    for (const symbol of symbolFactors(c)) {
      const source = this.findDimSource(symbol);
      if (!source) throw new GraphError(`symbolic dim '${symbol}' has no graph input or op output to read it from`);
      const part = source.tensor.graph.symbolTensor(symbol, source);
      result = result ? applyOp(mulOp(), [result, part], {}, this)[0] : part;
    }
    const coef = dimCoefficient(c);
    if (coef !== 1) result = applyOp(mulOp(), [result!, this.constant([coef], 'int64', [1])], {}, this)[0];
    this.dimCache.set(c, result!);
    return result!;
  }

  private symbolTensor(symbol: string, source: { tensor: Tensor; axis: number }): Tensor {
    const cached = this.dimCache.get(symbol);
    if (cached) return cached;
    const t = applyOp(shapeOp(), [source.tensor], { start: source.axis, end: source.axis + 1 }, this)[0];
    this.dimCache.set(symbol, t);
    return t;
  }

  /** A 1-D int64 tensor holding a shape (constant when every dim is static; -1 stays -1). */
  shapeTensor(dims: Shape): Tensor {
    if (dims.every(isStaticDim)) return this.constant(dims as number[], 'int64', [dims.length]);
    const parts = dims.map((d) => this.dimTensor(d));
    return applyOp(concatOp(), parts, { axis: 0 }, this)[0];
  }

  /** The graph new nodes go to: the innermost graph under construction, else this one. */
  static active(): Graph | undefined {
    return building[building.length - 1];
  }

  /** Builds a child graph (a Loop/If body) with `fn`, during which new nodes go to it. */
  static build<T>(g: Graph, fn: () => T): T {
    building.push(g);
    try {
      return fn();
    } finally {
      building.pop();
    }
  }
}

function symbolFactors(d: string): string[] {
  return d
    .split('*')
    .map((s) => s.trim())
    .filter((s) => !/^\d+$/.test(s));
}

/** Raw little-endian bytes of JS values in a dtype (not for float16/bfloat16). */
export function encodeValues(values: ArrayLike<number>, dtype: DType): Uint8Array {
  const n = values.length;
  switch (dtype) {
    case 'float32':
      return new Uint8Array(Float32Array.from(values).buffer);
    case 'float64':
      return new Uint8Array(Float64Array.from(values).buffer);
    case 'int32':
      return new Uint8Array(Int32Array.from(values).buffer);
    case 'uint32':
      return new Uint8Array(Uint32Array.from(values).buffer);
    case 'int64': {
      const a = new BigInt64Array(n);
      for (let i = 0; i < n; i++) a[i] = BigInt(Math.trunc(values[i]));
      return new Uint8Array(a.buffer);
    }
    case 'int8':
      return new Uint8Array(Int8Array.from(values).buffer);
    case 'uint8':
      return Uint8Array.from(values);
    case 'bool':
      return Uint8Array.from(values, (v) => (v ? 1 : 0));
    default:
      throw new GraphError(`cannot encode JS numbers as ${dtype}`);
  }
}

// The ops the graph itself needs (Identity, Cast, Mul, Shape, Concat) are looked up lazily to avoid
// an import cycle with the op modules.
let coreOps: { identity: OpDef<object>; cast: OpDef<object>; mul: OpDef<object>; shape: OpDef<object>; concat: OpDef<object> } | undefined;
/** Called once by the op modules to hand the graph the ops it builds with. */
export function setCoreOps(ops: NonNullable<typeof coreOps>): void {
  coreOps = ops;
}
const identityOp = () => coreOps!.identity;
const castOp = () => coreOps!.cast;
const mulOp = () => coreOps!.mul;
const shapeOp = () => coreOps!.shape;
const concatOp = () => coreOps!.concat;

/** Where the DSL user called from: the first stack frame outside this package. */
export function callerLocation(): string {
  const stack = new Error().stack?.split('\n').slice(1) ?? [];
  for (const line of stack) {
    if (line.includes('/packages/onnx/src/') || line.includes('node:internal') || line.includes('node_modules')) continue;
    return line.trim().replace(/^at /, '');
  }
  return 'unknown location';
}

/** Chooses the graph a node with these inputs goes to. */
function targetGraph(inputs: (Tensor | null)[], explicit?: Graph): Graph {
  if (explicit) return explicit;
  const active = Graph.active();
  const graphs = inputs.filter((t): t is Tensor => t !== null).map((t) => t.graph);
  if (active && graphs.every((g) => active.sees(g))) return active;
  if (graphs.length === 0) throw new GraphError('an op needs at least one tensor input to know its graph');
  // The deepest graph: every other input's graph must be one of its ancestors.
  let deepest = graphs[0];
  for (const g of graphs) if (g.sees(deepest)) deepest = g;
  for (const g of graphs) {
    if (!deepest.sees(g)) throw new GraphError('inputs come from unrelated graphs');
  }
  return deepest;
}

/**
 * Applies a primitive op: checks and infers output types, appends the node, returns its outputs.
 * Shape/dtype errors name the op, the input types and the caller's source line.
 */
export function applyOp<A extends object>(op: OpDef<A>, inputs: (Tensor | null)[], attrs: A, graph?: Graph): Tensor[] {
  const g = targetGraph(inputs, graph);
  for (const t of inputs) {
    if (t && !g.sees(t.graph)) throw new GraphError(`${op.name}: input ${t.name} belongs to another graph`);
  }
  let types: TensorType[];
  try {
    types = op.infer(
      inputs.map((t) => (t ? { dtype: t.dtype, shape: t.shape } : null)),
      attrs,
    );
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    const shapes = inputs.map((t) => (t ? t.toString() : 'none')).join(', ');
    throw new GraphError(`${op.name}: ${msg}\n  inputs: ${shapes}\n  at ${callerLocation()}`);
  }
  const node: Node = { op: op as OpDef<object>, inputs, outputs: [], attrs, name: g.uniqueName(`${g.scopePrefix()}${op.name}_`) };
  node.outputs = types.map((ty) => new Tensor(g, g.uniqueName('t'), ty.dtype, ty.shape.map(canonicalDim), node));
  for (const out of node.outputs) {
    if (out.shape.some((d) => typeof d === 'string' && d.includes('?'))) g.registerDims(out);
  }
  g.nodes.push(node);
  return node.outputs;
}

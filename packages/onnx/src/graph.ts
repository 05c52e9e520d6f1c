/**
 * The graph: symbolic tensors, the nodes that produce them, graph inputs/outputs and initializers,
 * and the op definition type nodes apply (Tensor, Node and OpDef refer to each other, so they share
 * this module). Nodes are appended as ops are called, so the node list is always in topological
 * order. This module builds no nodes of its own: Graph's methods that add nodes (`constant`,
 * `output`, `dimTensor`, `shapeTensor`) are attached in tensor-methods.ts over ops/core.ts.
 */
import { dtypeBytes, type DType } from './dtype';
import { canonicalDim, dimSymbols, dimCoefficient, formatShape, type Dim, type Shape } from './dim';

/** Static type of a value: what shape inference works on. */
export interface TensorType {
  dtype: DType;
  shape: Dim[];
}

/** An ONNX attribute value, tagged with its ONNX attribute type. */
export type AttrValue =
  | { kind: 'int'; value: number }
  | { kind: 'float'; value: number }
  | { kind: 'string'; value: string }
  | { kind: 'ints'; value: number[] }
  | { kind: 'floats'; value: number[] }
  | { kind: 'tensor'; dtype: DType; shape: number[]; data: ArrayLike<number | bigint> }
  | { kind: 'graph'; value: Graph };

/** What a gradient rule receives. */
export interface GradContext<A> {
  /** The node's inputs (null for omitted optional inputs). */
  inputs: (Tensor | null)[];
  /** The node's outputs. */
  outputs: Tensor[];
  /** The op's attributes, as the DSL gave them. */
  attrs: A;
  /** Gradient of the loss w.r.t. each output (null where the loss does not depend on it). */
  dy: (Tensor | null)[];
}

/**
 * A primitive op (registered with `defineOp`, op.ts). `infer` throws (with a message naming what
 * was expected) on bad input; the graph adds the op name, the input shapes and the caller's source line.
 */
export interface OpDef<A = object> {
  /** Name used in errors and the registry (the ONNX op type unless `onnxOp` says otherwise). */
  name: string;
  /** ONNX op type emitted (defaults to `name`). */
  onnxOp?: string;
  /** ONNX domain ('' = ai.onnx, 'com.microsoft' for contrib ops). */
  domain?: string;
  /** Shape and dtype rule: the types of the outputs. */
  infer(inputs: (TensorType | null)[], attrs: A): TensorType[];
  /** ONNX attributes of the emitted node (default: none). */
  onnxAttrs?(attrs: A): Record<string, AttrValue>;
  /**
   * Gradient rule: d(loss)/d(input) for each input, or null for inputs without a gradient.
   * `'none'` marks ops whose outputs are piecewise constant or integral (comparisons, argmax,
   * sampling): gradients stop there. An op with no `grad` at all is not differentiable yet:
   * asking autodiff to go through it is an error.
   */
  grad?: ((ctx: GradContext<A>) => (Tensor | null)[]) | 'none';
  /** Indices of inputs that are never differentiated (integer indices, shape tensors...). */
  nonDiffInputs?: number[];
}

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
  /** Small constants of the root graph by dtype, shape and values, so each is built once. */
  readonly constants = new Map<string, Tensor>();
  /** Run-time values of dims (and of single symbols) already read in this graph. */
  readonly dimValues = new Map<string, Tensor>();
  /** Where each symbolic dim can be read at run time: a tensor and an axis. */
  private readonly dimSources = new Map<string, { tensor: Tensor; axis: number }>();
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

  /**
   * Appends `t`, a node output of this graph that is not an output yet, to the graph outputs,
   * optionally under a new name. `graph.output(t)` takes any tensor (an Identity first where needed).
   */
  addOutput(t: Tensor, name?: string): Tensor {
    if (t.node === undefined || t.graph !== this || this.outputs.includes(t)) {
      throw new GraphError(`addOutput: ${t.name} is not a new node output of graph '${this.name}'; use graph.output`);
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
      if (dimSymbols(d).length === 1 && dimCoefficient(d) === 1 && !this.dimSource(d)) {
        this.dimSources.set(d, { tensor: t, axis });
      }
    });
  }

  /** Where a symbolic dim can be read at run time, in this graph or an ancestor. */
  dimSource(symbol: string): { tensor: Tensor; axis: number } | undefined {
    for (const g of this.lineage()) {
      const s = g.dimSources.get(symbol);
      if (s) return s;
    }
    return undefined;
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

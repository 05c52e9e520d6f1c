/**
 * The primitives every other op module builds on. Constants, run-time dims, shape vectors and
 * graph outputs are made of Cast, Mul, Shape, Concat and Identity, so their builders (`constant`,
 * `dimTensor`, `shapeTensor`, `output`: Graph's methods of those names call them) live here with
 * those ops; broadcast gradients are summed back with ReduceSum and spread with Expand, Squeeze and
 * Unsqueeze; and Concat's gradient is Split. These ops' gradient rules use only each other, so this
 * module imports no other op module. Each op keeps its shape rule and gradient rule together, and
 * its family module (elementwise, shape-ops, reduce) re-exports it with its function.
 */
import { broadcastShapes, canonicalDim, dimAdd, dimCoefficient, dimEquals, formatShape, isAnonymousDim, isStaticDim, type Dim, type Shape } from '../dim';
import { isFloat, onnxTypeCode, type DType } from '../dtype';
import { applyOp, encodeValues, GraphError, Tensor, type Graph, type TensorLike } from '../graph';
import { wideOf } from '../sparse-grad';
import { attr, defineOp, type OpDef, type TensorType } from '../op';
import { binary, normAxis, sameShape } from './helpers';

// ---- elementwise: Identity, Cast, Mul ---------------------------------------------------------

export const identityOp = defineOp({
  name: 'Identity',
  infer: ([x]) => [{ dtype: x!.dtype, shape: x!.shape }],
  grad: ({ dy: [g] }) => [g],
});

export const castOp = defineOp<{ to: DType }>({
  name: 'Cast',
  infer: ([x], a) => [{ dtype: a.to, shape: x!.shape }],
  onnxAttrs: (a) => ({ to: { kind: 'int', value: onnxTypeCode(a.to) } }),
  // a half-precision gradient summed in float32 (sparse-grad's markWide) widens to float32 without the rounding
  grad: ({ inputs: [x], dy: [g] }) => [!isFloat(x!.dtype) ? null : x!.dtype === 'float32' && wideOf(g!) ? wideOf(g!)! : cast(g!, x!.dtype)],
});

export const mulOp = binary('Mul', ({ inputs: [a, b], dy: [g] }) => binaryGrads([a, b], () => mul(g!, b!), () => mul(g!, a!)));

/** d/da, d/db of a binary op, each reduced back to its input's shape. */
export function binaryGrads(inputs: (Tensor | null)[], da: () => Tensor | null, db: () => Tensor | null): (Tensor | null)[] {
  const [a, b] = inputs as Tensor[];
  const ga = da();
  const gb = db();
  return [ga && unbroadcast(ga, a.shape), gb && unbroadcast(gb, b.shape)];
}

/** A scalar constant with the dtype of `like`, in `like`'s graph. */
export function scalarLike(value: number, like: Tensor): Tensor {
  return constant(like.graph, value, like.dtype, []);
}

/** Turns a JS number into a scalar of the other operand's dtype. */
export function pair(a: TensorLike, b: TensorLike): [Tensor, Tensor] {
  if (a instanceof Tensor && b instanceof Tensor) return [a, b];
  if (a instanceof Tensor) return [a, scalarLike(b as number, a)];
  if (b instanceof Tensor) return [scalarLike(a, b), b];
  throw new Error('at least one operand must be a tensor');
}

/**
 * An operand made by Expand whose input broadcasts against the other operand to the same shape is
 * replaced by that input: the op broadcasts it itself, and the expanded tensor is never written.
 * Reductions' gradient rules expand their [.., 1] gradients to the input's shape, and the rule
 * downstream usually multiplies them straight away (log-sum-exp's backward: an expanded
 * [B, T, 1] times exp's [B, T, V] output — at 8 × 1024 × 16,384 float32, 512 MB written and read
 * again per LM-head chunk for nothing).
 */
function unexpanded(t: Tensor, other: Tensor): Tensor {
  const node = t.node;
  if (node?.op.name !== 'Expand') return t;
  const source = node.inputs[0]!;
  const direct = broadcastShapes(source.shape, other.shape);
  const expanded = broadcastShapes(t.shape, other.shape);
  if (!direct || !expanded || direct.length !== expanded.length || direct.some((d, i) => !dimEquals(d, expanded[i]!))) return t;
  return source;
}

/** The DSL function of a broadcasting binary op: JS numbers become scalars, expanded operands their sources. */
export const binaryFn = (op: OpDef) => (a: TensorLike, b: TensorLike): Tensor => {
  const [x, y] = pair(a, b);
  const x1 = unexpanded(x, y);
  return applyOp(op, [x1, unexpanded(y, x1)], {})[0]; // y against x1: both sources could be too small together
};

/** The DSL function of a unary op. */
export const unaryFn = (op: OpDef) => (x: Tensor): Tensor => applyOp(op, [x], {})[0];

/** a · b (broadcasting). */
export const mul = binaryFn(mulOp);

/** Converts to another dtype (float → int truncates toward zero). */
export function cast(x: Tensor, to: DType): Tensor {
  if (x.dtype === to) return x;
  return applyOp(castOp, [x], { to })[0];
}

// ---- shapes: Shape, Concat, Split, Expand, Squeeze, Unsqueeze ---------------------------------

export const shapeOp: OpDef<{ start?: number; end?: number }> = defineOp<{ start?: number; end?: number }>({
  name: 'Shape',
  infer: ([x], a) => {
    const r = x!.shape.length;
    const s = a.start === undefined ? 0 : a.start < 0 ? a.start + r : a.start;
    const e = a.end === undefined ? r : a.end < 0 ? a.end + r : a.end;
    return [{ dtype: 'int64', shape: [Math.max(0, Math.min(e, r) - Math.max(0, s))] }];
  },
  onnxAttrs: (a) => ({ ...(a.start !== undefined ? { start: attr.int(a.start) } : {}), ...(a.end !== undefined ? { end: attr.int(a.end) } : {}) }),
  grad: 'none',
});

export const concatOp: OpDef<{ axis: number }> = defineOp<{ axis: number }>({
  name: 'Concat',
  infer: (types, { axis }) => {
    const first = types[0]!;
    const ax = normAxis(axis, first.shape.length);
    for (const t of types) {
      if (t!.dtype !== first.dtype) throw new Error(`dtypes differ: ${t!.dtype} vs ${first.dtype}`);
      if (t!.shape.length !== first.shape.length) throw new Error('ranks differ');
      t!.shape.forEach((d, i) => {
        if (i !== ax && !dimEquals(d, first.shape[i]) && !isAnonymousDim(d) && !isAnonymousDim(first.shape[i])) {
          throw new Error(`dim ${i} differs (${d} vs ${first.shape[i]}) outside the concat axis ${ax}`);
        }
      });
    }
    const shape = [...first.shape];
    shape[ax] = dimAdd(types.map((t) => t!.shape[ax]));
    return [{ dtype: first.dtype, shape }];
  },
  onnxAttrs: ({ axis }) => ({ axis: attr.int(axis) }),
  grad: ({ inputs, attrs: { axis }, dy: [g] }) => {
    const ax = normAxis(axis, g!.rank);
    const xs = inputs as Tensor[];
    const dims = xs.map((x) => x.shape[ax]);
    // Static sizes are a constant: sizes read from Shape at run time are shape arithmetic, which
    // ONNX Runtime places on the CPU (a refused session on CUDA with fallback off).
    const sizes = dims.every((d): d is number => typeof d === 'number')
      ? constant(g!.graph, dims, 'int64', [dims.length])
      : applyOp(concatOp, xs.map((x) => shapeOf(x, ax, ax + 1)), { axis: 0 })[0];
    return applyOp(splitOp, [g!, sizes], { axis: ax, sizes: dims });
  },
});

export const splitOp: OpDef<{ axis: number; sizes: Dim[] }> = defineOp<{ axis: number; sizes: Dim[] }>({
  name: 'Split',
  nonDiffInputs: [1],
  infer: ([x], { axis, sizes }) => {
    const ax = normAxis(axis, x!.shape.length);
    const total = dimAdd(sizes);
    const d = x!.shape[ax];
    if (typeof total === 'number' && typeof d === 'number' && total !== d) {
      throw new Error(`split sizes [${sizes}] sum to ${total}, but axis ${ax} has ${d}`);
    }
    return sizes.map((s) => {
      const shape = [...x!.shape];
      shape[ax] = s;
      return { dtype: x!.dtype, shape };
    });
  },
  onnxAttrs: ({ axis }) => ({ axis: attr.int(axis) }),
  grad: ({ outputs, attrs: { axis }, dy }) => {
    const parts = dy.map((g, i) => g ?? zerosOf(outputs[i]));
    return [applyOp(concatOp, parts, { axis })[0], null];
  },
});

export const expandOp: OpDef<{ shape: Dim[] }> = defineOp<{ shape: Dim[] }>({
  name: 'Expand',
  nonDiffInputs: [1],
  infer: ([x], { shape }) => {
    const out = broadcastShapes(x!.shape, shape);
    if (!out) throw new Error(`cannot expand ${formatShape(x!.shape)} to ${formatShape(shape)}`);
    return [{ dtype: x!.dtype, shape: out }];
  },
  grad: ({ inputs: [x], dy: [g] }) => [unbroadcast(g!, x!.shape), null],
});

export const squeezeOp: OpDef<{ axes: number[] }> = defineOp<{ axes: number[] }>({
  name: 'Squeeze',
  nonDiffInputs: [1],
  infer: ([x], { axes }) => {
    const r = x!.shape.length;
    const norm = axes.map((a) => normAxis(a, r));
    for (const a of norm) {
      const d = x!.shape[a];
      if (d !== 1 && !isAnonymousDim(d)) throw new Error(`cannot squeeze axis ${a} of size ${d}`);
    }
    return [{ dtype: x!.dtype, shape: x!.shape.filter((_, i) => !norm.includes(i)) }];
  },
  grad: ({ attrs: { axes }, inputs: [x], dy: [g] }) => [unsqueeze(g!, axes.map((a) => normAxis(a, x!.rank))), null],
});

export const unsqueezeOp: OpDef<{ axes: number[] }> = defineOp<{ axes: number[] }>({
  name: 'Unsqueeze',
  nonDiffInputs: [1],
  infer: ([x], { axes }) => {
    const r = x!.shape.length + axes.length;
    const norm = axes.map((a) => normAxis(a, r)).sort((a, b) => a - b);
    const shape: Dim[] = [];
    let j = 0;
    for (let i = 0; i < r; i++) shape.push(norm.includes(i) ? 1 : x!.shape[j++]);
    return [{ dtype: x!.dtype, shape }];
  },
  grad: ({ attrs: { axes }, outputs: [y], dy: [g] }) => [squeeze(g!, axes.map((a) => normAxis(a, y.rank))), null],
});

/** The run-time shape of x (or dims start..end) as an int64 vector. */
export function shapeOf(x: Tensor, start?: number, end?: number): Tensor {
  return applyOp(shapeOp, [x], { start, end })[0];
}

function zerosOf(t: Tensor): Tensor {
  return expand(constant(t.graph, 0, t.dtype, []), t.shape, t);
}

/**
 * Broadcasts x to `dims`. With `like`, the target shape is read from that tensor at run time
 * (exact even for dims only known at run time).
 */
export function expand(x: Tensor, dims: Shape, like?: Tensor): Tensor {
  const wanted = dims.map(canonicalDim);
  const spec = like ? undefined : constantExpandSpec(x.shape, wanted);
  const target = like ? shapeOf(like) : spec ? constant(x.graph, spec, 'int64', [spec.length]) : shapeTensor(x.graph, wanted);
  return applyOp(expandOp, [x, target], { shape: wanted })[0];
}

/**
 * A constant Expand target: Expand broadcasts both ways, so a dim x already has can be given as 1
 * and only new static dims need values.
 */
function constantExpandSpec(input: Shape, target: Dim[]): number[] | undefined {
  const spec: number[] = [];
  for (let j = 0; j < target.length; j++) {
    const i = j - (target.length - input.length);
    const d = target[j];
    if (i >= 0 && dimEquals(input[i], d)) spec.push(1);
    else if (typeof d === 'number') spec.push(d);
    else return undefined;
  }
  return spec;
}

/** Removes size-1 axes. */
export function squeeze(x: Tensor, axes: number[]): Tensor {
  return applyOp(squeezeOp, [x, constant(x.graph, axes, 'int64', [axes.length])], { axes })[0];
}

/** Inserts size-1 axes at the given output positions. */
export function unsqueeze(x: Tensor, axes: number[]): Tensor {
  return applyOp(unsqueezeOp, [x, constant(x.graph, axes, 'int64', [axes.length])], { axes })[0];
}

// ---- reductions: ReduceSum, and the pieces the other reductions share ------------------------

/** Attributes of a Reduce* op. */
export interface ReduceAttrs {
  axes: number[];
  keepdims: boolean;
}

/** The shape a reduction over `axes` leaves. */
export function reducedShape(t: TensorType, { axes, keepdims }: ReduceAttrs): Dim[] {
  const r = t.shape.length;
  const norm = axes.map((a) => normAxis(a, r));
  if (new Set(norm).size !== norm.length) throw new Error(`repeated axes [${axes}]`);
  const out: Dim[] = [];
  t.shape.forEach((d, i) => {
    if (!norm.includes(i)) out.push(d);
    else if (keepdims) out.push(1);
  });
  return out;
}

/** x with size-1 axes inserted at `axes`, in increasing order. */
export function unsqueezeAxes(x: Tensor, axes: number[]): Tensor {
  return unsqueeze(x, [...axes].sort((a, b) => a - b));
}

/** The gradient of a reduction, broadcast back over the reduced axes of x. */
export function spread(g: Tensor, x: Tensor, attrs: ReduceAttrs): Tensor {
  const kept = attrs.keepdims ? g : unsqueezeAxes(g, attrs.axes.map((a) => normAxis(a, x.rank)));
  return expand(kept, x.shape, x);
}

/** Defines a Reduce* op (axes as an input) with the given gradient rule. */
export function reduceOp(name: string, grad: (ctx: { x: Tensor; y: Tensor; g: Tensor; attrs: ReduceAttrs }) => Tensor): OpDef<ReduceAttrs> {
  return defineOp<ReduceAttrs>({
    name,
    nonDiffInputs: [1],
    infer: ([x], a) => {
      if (x!.dtype === 'bool') throw new Error('cannot reduce bool tensors; cast first');
      return [{ dtype: x!.dtype, shape: reducedShape(x!, a) }];
    },
    onnxAttrs: (a) => ({ keepdims: attr.int(a.keepdims ? 1 : 0) }),
    grad: ({ inputs: [x], outputs: [y], attrs, dy: [g] }) => [grad({ x: x!, y, g: g!, attrs }), null],
  });
}

export const reduceSumOp = reduceOp('ReduceSum', ({ x, g, attrs }) => spread(g, x, attrs));

/** Applies a Reduce* op over axes (all when omitted); no axes at all is x itself. */
export function reduceWith(op: OpDef<ReduceAttrs>, x: Tensor, axes: number | number[] | undefined, keepdims: boolean): Tensor {
  const list = axes === undefined ? [...Array(x.rank).keys()] : (Array.isArray(axes) ? axes : [axes]).map((a) => normAxis(a, x.rank));
  if (list.length === 0) return x;
  return applyOp(op, [x, constant(x.graph, list, 'int64', [list.length])], { axes: list, keepdims })[0];
}

/** Σ over axes (all axes when omitted). */
export function reduceSum(x: Tensor, axes?: number | number[], keepdims = false): Tensor {
  return reduceWith(reduceSumOp, x, axes, keepdims);
}

/**
 * Sums a broadcast gradient back to the shape of the operand it flowed to: leading extra axes are
 * summed away, axes where the operand had size 1 are summed with keepdims.
 */
export function unbroadcast(g: Tensor, target: Shape): Tensor {
  if (sameShape(g.shape, target)) return g;
  const lead = g.rank - target.length;
  let r = g;
  if (lead > 0) r = reduceSum(r, [...Array(lead).keys()], false);
  const axes: number[] = [];
  target.forEach((d, i) => {
    if (d === 1 && r.shape[i] !== 1) axes.push(i);
  });
  if (axes.length) r = reduceSum(r, axes, true);
  return r;
}

// ---- the values a graph is built with --------------------------------------------------------

/** A constant tensor from JS values, deduplicated for small constants (`graph.constant`). */
export function constant(graph: Graph, values: ArrayLike<number> | number, dtype: DType, shape?: number[]): Tensor {
  if (graph.parent) return constant(graph.root, values, dtype, shape);
  const arr = typeof values === 'number' ? [values] : Array.from(values);
  const dims = shape ?? (typeof values === 'number' ? [] : [arr.length]);
  const n = dims.reduce((a, b) => a * b, 1);
  if (n !== arr.length) throw new GraphError(`constant of shape ${formatShape(dims)} needs ${n} values, got ${arr.length}`);
  const key = arr.length <= 64 ? `${dtype}|${dims.join(',')}|${arr.join(',')}` : undefined;
  const cached = key === undefined ? undefined : graph.constants.get(key);
  if (cached) return cached;
  let t: Tensor;
  if (dtype === 'float16' || dtype === 'bfloat16') {
    // Stored as float32 and cast: ORT folds the Cast when the session is created.
    const f32 = constant(graph, arr, 'float32', dims);
    t = applyOp(castOp, [f32], { to: dtype }, graph)[0];
  } else {
    t = graph.initializer(graph.freshName('const'), dtype, dims, { kind: 'inline', bytes: encodeValues(arr, dtype) });
  }
  if (key !== undefined) graph.constants.set(key, t);
  return t;
}

/**
 * Marks a tensor as an output of `graph`, optionally under a new name (`graph.output`). Inputs,
 * initializers, outer values and tensors output twice go through an Identity.
 */
export function output(graph: Graph, t: Tensor, name?: string): Tensor {
  const renamable = t.node !== undefined && t.graph === graph && !graph.outputs.includes(t);
  return graph.addOutput(renamable ? t : applyOp(identityOp, [t], {}, graph)[0], name);
}

/** The run-time value of a dim as an int64 tensor of shape [1] (`graph.dimTensor`). */
export function dimTensor(graph: Graph, d: Dim): Tensor {
  const c = canonicalDim(d);
  if (isStaticDim(c)) return constant(graph, [c], 'int64', [1]);
  const cached = graph.dimValues.get(c);
  if (cached) return cached;
  let result: Tensor | undefined;
  for (const symbol of symbolFactors(c)) {
    const source = graph.dimSource(symbol);
    if (!source) throw new GraphError(`symbolic dim '${symbol}' has no graph input or op output to read it from`);
    const part = symbolTensor(source.tensor.graph, symbol, source);
    result = result ? applyOp(mulOp, [result, part], {}, graph)[0] : part;
  }
  const coef = dimCoefficient(c);
  if (coef !== 1) result = applyOp(mulOp, [result!, constant(graph, [coef], 'int64', [1])], {}, graph)[0];
  graph.dimValues.set(c, result!);
  return result!;
}

/** A symbol's run-time value, read once per graph from the tensor that has it. */
function symbolTensor(graph: Graph, symbol: string, source: { tensor: Tensor; axis: number }): Tensor {
  const cached = graph.dimValues.get(symbol);
  if (cached) return cached;
  const t = applyOp(shapeOp, [source.tensor], { start: source.axis, end: source.axis + 1 }, graph)[0];
  graph.dimValues.set(symbol, t);
  return t;
}

function symbolFactors(d: string): string[] {
  return d
    .split('*')
    .map((s) => s.trim())
    .filter((s) => !/^\d+$/.test(s));
}

/** A 1-D int64 tensor holding a shape (constant when every dim is static; -1 stays -1) (`graph.shapeTensor`). */
export function shapeTensor(graph: Graph, dims: Shape): Tensor {
  if (dims.every(isStaticDim)) return constant(graph, dims as number[], 'int64', [dims.length]);
  const parts = dims.map((d) => dimTensor(graph, d));
  return applyOp(concatOp, parts, { axis: 0 }, graph)[0];
}

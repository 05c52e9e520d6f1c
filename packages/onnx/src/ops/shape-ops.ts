/**
 * Shape primitives: Shape, Reshape, Transpose, Concat, Split, Slice, Pad, Squeeze, Unsqueeze,
 * Expand, Trilu and Range. Ops whose ONNX form takes shape/axes as int64 tensor inputs get them
 * from the DSL's static description, so shape inference can check them at build time. Shape,
 * Concat, Split, Expand, Squeeze and Unsqueeze are defined in core.ts (constants, run-time dims
 * and broadcast gradients are built with them) and re-exported here.
 */
import { anonymousDim, canonicalDim, dimDiv, dimEquals, formatShape, isAnonymousDim, shapeSize, type Dim, type Shape } from '../dim';
import type { DType } from '../dtype';
import { applyOp, type Tensor } from '../graph';
import { attr, defineOp, type OpDef } from '../op';
import { cast, castOp, concatOp, constant, dimTensor, shapeOf, shapeTensor, splitOp, squeeze } from './core';
import { addOp, lessOp, maxOp, minOp, subOp, whereOp } from './elementwise';
import { inversePerm, normAxis } from './helpers';

export { concatOp, expand, expandOp, shapeOf, shapeOp, splitOp, squeeze, squeezeOp, unsqueeze, unsqueezeOp } from './core';

const INT64_MAX = 2 ** 62; // "to the end" for Slice; ORT clamps any larger value

export const reshapeOp: OpDef<{ dims: Dim[] }> = defineOp<{ dims: Dim[] }>({
  name: 'Reshape',
  nonDiffInputs: [1],
  infer: ([x], { dims }) => {
    const free = dims.filter((d) => d === -1).length;
    if (free > 1) throw new Error(`at most one -1 in the target shape ${formatShape(dims)}`);
    const size = shapeSize(x!.shape);
    if (free === 1) {
      const known = shapeSize(dims.filter((d) => d !== -1));
      const inferred = isAnonymousDim(size) || isAnonymousDim(known) ? undefined : dimDiv(size, known);
      if (inferred === undefined && typeof size === 'number' && typeof known === 'number') {
        throw new Error(`cannot reshape ${size} elements into ${formatShape(dims)}`);
      }
      return [{ dtype: x!.dtype, shape: dims.map((d) => (d === -1 ? (inferred ?? anonymousDim()) : d)) }];
    }
    const target = shapeSize(dims);
    if (!isAnonymousDim(size) && !isAnonymousDim(target) && !dimEquals(size, target)) {
      throw new Error(`cannot reshape ${formatShape(x!.shape)} (${size} elements) into ${formatShape(dims)} (${target})`);
    }
    return [{ dtype: x!.dtype, shape: [...dims] }];
  },
  grad: ({ inputs: [x], dy: [g] }) => {
    // A constant spec where one exists: ONNX Runtime's transpose optimizer rewrites Shape(Transpose(x))
    // into a Gather over Shape(x), and places that Gather on the CPU (refused on CUDA with fallback off).
    const spec = constantReshapeSpec(g!.shape, x!.shape);
    const shape = spec ? constant(x!.graph, spec, 'int64', [spec.length]) : shapeOf(x!);
    return [applyOp(reshapeOp, [g!, shape], { dims: x!.shape })[0], null];
  },
});

export const transposeOp: OpDef<{ perm: number[] }> = defineOp<{ perm: number[] }>({
  name: 'Transpose',
  infer: ([x], { perm }) => {
    const r = x!.shape.length;
    if (perm.length !== r || [...perm].sort((a, b) => a - b).some((p, i) => p !== i)) {
      throw new Error(`perm [${perm}] is not a permutation of ${r} axes`);
    }
    return [{ dtype: x!.dtype, shape: perm.map((p) => x!.shape[p]) }];
  },
  onnxAttrs: ({ perm }) => ({ perm: attr.ints(perm) }),
  grad: ({ attrs: { perm }, dy: [g] }) => [transpose(g!, inversePerm(perm))],
});

/** Static description of a slice along some axes. */
export interface SliceSpec {
  starts: Dim[];
  ends: Dim[];
  axes: number[];
  steps: number[];
}

function slicedDim(d: Dim, s: Dim, e: Dim, step: number): Dim {
  if (typeof d === 'number' && typeof s === 'number' && typeof e === 'number') {
    const norm = (v: number, lo: number, hi: number) => Math.max(lo, Math.min(hi, v < 0 ? v + d : v));
    if (step > 0) {
      const a = norm(s, 0, d);
      const b = norm(e, 0, d);
      return Math.max(0, Math.ceil((b - a) / step));
    }
    const a = norm(s, -1, d - 1);
    const b = norm(e, -1, d - 1);
    return Math.max(0, Math.ceil((b - a) / step));
  }
  if (step !== 1) return anonymousDim();
  if (s === 0 && (e === INT64_MAX || dimEquals(e, d))) return d;
  if (s === 0 && typeof e === 'string') return e; // x[:n] with a symbolic n ≤ dim
  if (typeof s === 'number' && s < 0 && e === INT64_MAX) return -s; // last k
  if (typeof s === 'number' && s >= 0 && typeof e === 'number' && e >= s && e < INT64_MAX) return e - s;
  return anonymousDim();
}

export const sliceOp: OpDef<SliceSpec> = defineOp<SliceSpec>({
  name: 'Slice',
  nonDiffInputs: [1, 2, 3, 4],
  infer: ([x], spec) => {
    const shape = [...x!.shape];
    spec.axes.forEach((axis, i) => {
      const ax = normAxis(axis, shape.length);
      if (spec.steps[i] === 0) throw new Error('slice step cannot be 0');
      shape[ax] = slicedDim(shape[ax], canonicalDim(spec.starts[i]), canonicalDim(spec.ends[i]), spec.steps[i]);
    });
    return [{ dtype: x!.dtype, shape }];
  },
  grad: ({ inputs: [x], attrs: spec, dy: [g] }) => {
    if (spec.steps.some((s) => s !== 1)) throw new Error('Slice: gradients need step 1');
    return [padFromSlice(g!, x!, spec), null, null, null, null];
  },
});

/**
 * The Pad amounts [before…, after…] that undo a slice, when the sliced axes' sizes, starts and ends
 * are all static; undefined otherwise. Starts and ends are clamped as Slice clamps them.
 */
function staticSlicePads(shape: readonly Dim[], spec: SliceSpec): number[] | undefined {
  const rank = shape.length;
  const before = new Array<number>(rank).fill(0);
  const after = new Array<number>(rank).fill(0);
  for (let i = 0; i < spec.axes.length; i++) {
    const ax = normAxis(spec.axes[i], rank);
    const [d, start, end] = [shape[ax], spec.starts[i], spec.ends[i]];
    if (typeof d !== 'number' || typeof start !== 'number' || typeof end !== 'number') return undefined;
    const clamp = (v: number) => Math.min(Math.max(v < 0 ? v + d : v, 0), d);
    const s = clamp(start);
    before[ax] = s;
    after[ax] = d - Math.max(clamp(end), s);
  }
  return [...before, ...after];
}

/**
 * Zero-pads a slice's gradient back to the sliced input's shape (pads computed at run time unless
 * static). A bfloat16 gradient is padded in float32: ONNX Runtime's CUDA provider has no bfloat16
 * Pad kernel (a slice of a bfloat16 weight, such as a restricted LM head, would not run).
 */
function padFromSlice(g: Tensor, x: Tensor, spec: SliceSpec): Tensor {
  if (g.dtype === 'bfloat16') return cast(padFromSlice(cast(g, 'float32'), x, spec), 'bfloat16');
  const graph = x.graph;
  const constantPads = staticSlicePads(x.shape, spec);
  // Known at build time: a constant, so no shape arithmetic runs (on the CPU) at run time.
  if (constantPads) {
    const amounts = { before: constantPads.slice(0, x.rank), after: constantPads.slice(x.rank) };
    return applyOp(padOp, [g, constant(graph, constantPads, 'int64', [constantPads.length])], { shape: x.shape, amounts })[0];
  }
  const full = shapeOf(x);
  const i64 = (v: number) => constant(graph, [v], 'int64', [1]);
  const before: Tensor[] = [];
  const after: Tensor[] = [];
  for (let ax = 0; ax < x.rank; ax++) {
    const i = spec.axes.map((a) => normAxis(a, x.rank)).indexOf(ax);
    if (i < 0) {
      before.push(i64(0));
      after.push(i64(0));
      continue;
    }
    const d = shapeOf(x, ax, ax + 1);
    const clampIndex = (v: Tensor) => {
      const pos = applyOp(whereOp, [lessThanZero(v), addI(v, d), v], {})[0];
      return minI(maxI(pos, i64(0)), d);
    };
    const s = clampIndex(dimTensor(graph, spec.starts[i]));
    const e = maxI(clampIndex(dimTensor(graph, spec.ends[i])), s);
    before.push(s);
    after.push(subI(d, e));
  }
  void full;
  const pads = applyOp(concatOp, [...before, ...after], { axis: 0 })[0];
  return applyOp(padOp, [g, pads], { shape: x.shape })[0];
}

/** Pad's attributes: the output shape, and the amounts when they are known at build time. */
interface PadAttrs {
  shape: Dim[];
  /** Static amounts per axis (from `pad`): the gradient then slices with constant bounds. */
  amounts?: { before: number[]; after: number[] };
}

export const padOp: OpDef<PadAttrs> = defineOp<PadAttrs>({
  name: 'Pad',
  nonDiffInputs: [1],
  infer: ([x], { shape }) => {
    if (shape.length !== x!.shape.length) throw new Error(`padded shape ${formatShape(shape)} has the wrong rank`);
    return [{ dtype: x!.dtype, shape: [...shape] }];
  },
  grad: ({ inputs: [x, pads], outputs: [y], dy: [g], attrs: { amounts } }) => {
    if (amounts) {
      // Static amounts: slice each padded axis with constant bounds (a negative end counts from
      // the padded size), so no shape arithmetic runs at run time.
      const axes = amounts.before.map((_, i) => i).filter((i) => amounts.before[i] !== 0 || amounts.after[i] !== 0);
      return [axes.length === 0 ? g! : slice(g!, axes, axes.map((i) => amounts.before[i]), axes.map((i) => (amounts.after[i] > 0 ? -amounts.after[i] : INT64_MAX))), null];
    }
    // Slice the padding back off: starts = pads[:r], ends = starts + x's dims.
    const r = x!.rank;
    const starts = applyOp(sliceOp, [pads!, i64c(x!, 0), i64c(x!, r), i64c(x!, 0), i64c(x!, 1)], {
      starts: [0],
      ends: [r],
      axes: [0],
      steps: [1],
    })[0];
    const ends = addI(starts, shapeOf(x!));
    const axes = constant(x!.graph, [...Array(r).keys()], 'int64', [r]);
    void y;
    return [
      applyOp(sliceOp, [g!, starts, ends, axes], {
        starts: Array(r).fill(anonymousDim()),
        ends: Array(r).fill(anonymousDim()),
        axes: [...Array(r).keys()],
        steps: Array(r).fill(1),
      })[0],
      null,
    ];
  },
});

export const triluOp: OpDef<{ upper: boolean; k: number }> = defineOp<{ upper: boolean; k: number }>({
  name: 'Trilu',
  nonDiffInputs: [1],
  infer: ([x]) => {
    if (x!.shape.length < 2) throw new Error('needs rank ≥ 2');
    return [{ dtype: x!.dtype, shape: x!.shape }];
  },
  onnxAttrs: ({ upper }) => ({ upper: attr.int(upper ? 1 : 0) }),
  grad: ({ attrs, dy: [g] }) => [trilu(g!, attrs.upper, attrs.k), null],
});

export const rangeOp: OpDef<{ length: Dim }> = defineOp<{ length: Dim }>({
  name: 'Range',
  infer: ([start], { length }) => [{ dtype: start!.dtype, shape: [length] }],
  grad: 'none',
});

// ---- functional API --------------------------------------------------------------------------

const i64c = (like: Tensor, v: number) => constant(like.graph, [v], 'int64', [1]);
const addI = (a: Tensor, b: Tensor) => applyOp(addOp, [a, b], {})[0];
const subI = (a: Tensor, b: Tensor) => applyOp(subOp, [a, b], {})[0];
const maxI = (a: Tensor, b: Tensor) => applyOp(maxOp, [a, b], {})[0];
const minI = (a: Tensor, b: Tensor) => applyOp(minOp, [a, b], {})[0];
const lessThanZero = (a: Tensor) => applyOp(lessOp, [a, constant(a.graph, [0], 'int64', [1])], {})[0];

/** Reshapes to `dims` (symbolic dims allowed, one -1 inferred). */
export function reshape(x: Tensor, dims: Shape): Tensor {
  const target = dims.map(canonicalDim);
  if (target.length === x.rank && target.every((d, i) => dimEquals(d, x.shape[i]))) return x;
  const spec = constantReshapeSpec(x.shape, target);
  const shape = spec ? constant(x.graph, spec, 'int64', [spec.length]) : shapeTensor(x.graph, target);
  return applyOp(reshapeOp, [x, shape], { dims: target })[0];
}

/**
 * x reshaped to the shape of `like` (same element count), read from `like` at run time by one
 * Shape node — for targets no constant spec can express (two symbolic dims that are not copies).
 */
export function reshapeLike(x: Tensor, like: Tensor): Tensor {
  return applyOp(reshapeOp, [x, shapeOf(like)], { dims: like.shape.map(canonicalDim) })[0];
}

/**
 * A constant ONNX Reshape spec for a target with symbolic dims, when one exists: 0 copies the
 * input's dim at the same index, -1 stands for the single remaining unknown. Constant shape
 * inputs keep shape arithmetic out of the graph (ONNX Runtime would run it on the CPU).
 */
function constantReshapeSpec(input: Shape, target: Dim[]): number[] | undefined {
  let free = false;
  const spec: number[] = [];
  for (let i = 0; i < target.length; i++) {
    const d = target[i];
    if (typeof d === 'number' && d > 0) spec.push(d);
    else if (d === -1 || typeof d === 'string') {
      if (typeof d === 'string' && i < input.length && dimEquals(input[i], d)) spec.push(0);
      else if (!free) {
        free = true;
        spec.push(-1);
      } else return undefined;
    } else return undefined; // a literal 0 would mean "copy" to ONNX
  }
  return spec;
}

/** Permutes axes (default: reverse them). */
export function transpose(x: Tensor, perm?: number[]): Tensor {
  const p = perm ?? [...Array(x.rank).keys()].reverse();
  return applyOp(transposeOp, [x], { perm: p.map((a) => normAxis(a, x.rank)) })[0];
}

/** Concatenates along an axis. */
export function concat(xs: Tensor[], axis: number): Tensor {
  if (xs.length === 0) throw new Error('concat needs at least one tensor');
  if (xs.length === 1) return xs[0];
  return applyOp(concatOp, xs, { axis: normAxis(axis, xs[0].rank) })[0];
}

/** Splits along an axis into parts of the given sizes. */
export function split(x: Tensor, sizes: Dim[], axis: number): Tensor[] {
  const ax = normAxis(axis, x.rank);
  return applyOp(splitOp, [x, shapeTensor(x.graph, sizes)], { axis: ax, sizes: sizes.map(canonicalDim) });
}

/**
 * x[start:end:step] along each given axis. Negative indices count from the end; `end` may be a
 * symbolic dim; omitted `end` means "to the end".
 */
export function slice(x: Tensor, axes: number[], starts: Dim[], ends?: Dim[], steps?: number[]): Tensor {
  const spec: SliceSpec = {
    axes: axes.map((a) => normAxis(a, x.rank)),
    starts: starts.map(canonicalDim),
    ends: (ends ?? axes.map(() => INT64_MAX)).map(canonicalDim),
    steps: steps ?? axes.map(() => 1),
  };
  const g = x.graph;
  const vec = (ds: Dim[]) => shapeTensor(g, ds);
  return applyOp(sliceOp, [x, vec(spec.starts), vec(spec.ends), constant(g, spec.axes, 'int64', [spec.axes.length]), constant(g, spec.steps, 'int64', [spec.steps.length])], spec)[0];
}

/** Zero-pads each axis by `before[i]` and `after[i]` elements (static amounts). */
export function pad(x: Tensor, before: number[], after: number[]): Tensor {
  if (before.length !== x.rank || after.length !== x.rank) throw new Error(`pad: give ${x.rank} before/after amounts`);
  if ([...before, ...after].some((n) => !Number.isInteger(n) || n < 0)) throw new Error(`pad: amounts must be non-negative integers, got [${before}] / [${after}]`);
  const shape = x.shape.map((d, i) => (before[i] === 0 && after[i] === 0 ? d : typeof d === 'number' ? d + before[i] + after[i] : anonymousDim()));
  return applyOp(padOp, [x, constant(x.graph, [...before, ...after], 'int64', [2 * x.rank])], { shape, amounts: { before: [...before], after: [...after] } })[0];
}

/** Keeps the lower (or upper) triangle of the last two axes, offset by diagonal k. */
export function trilu(x: Tensor, upper: boolean, k = 0): Tensor {
  return applyOp(triluOp, [x, constant(x.graph, k, 'int64', [])], { upper, k })[0];
}

/** [0, 1, …, n−1] of the given dtype; `n` may be symbolic. `like` picks the graph. */
export function arange(n: Dim, dtype: DType, like: Tensor): Tensor {
  const g = like.graph;
  const limit = typeof n === 'number' ? constant(g, n, dtype, []) : castScalar(squeeze(dimTensor(g, n), [0]), dtype);
  return applyOp(rangeOp, [constant(g, 0, dtype, []), limit, constant(g, 1, dtype, [])], { length: canonicalDim(n) })[0];
}

function castScalar(x: Tensor, dtype: DType): Tensor {
  return x.dtype === dtype ? x : applyOp(castOp, [x], { to: dtype })[0];
}

/**
 * Indexing primitives: Gather, GatherElements, GatherND, ScatterElements, ScatterND and OneHot.
 * Gathers differentiate into scatter-adds; scatters into gathers.
 */
import { dimEquals, formatShape, isAnonymousDim, type Dim } from '../dim';
import { isInteger, type DType } from '../dtype';
import { applyOp, type Tensor } from '../graph';
import { attr, defineOp, type TensorType } from '../op';
import { markScatterAdd, markWide, wideOf } from '../sparse-grad';
import { cast, constant, dimTensor, expand, unsqueeze } from './core';
import { zerosLike } from './elementwise';
import { normAxis } from './helpers';
import { transpose } from './shape-ops';

function requireIndices(t: TensorType): void {
  if (t.dtype !== 'int32' && t.dtype !== 'int64') throw new Error(`indices must be int32 or int64, got ${t.dtype}`);
}

export const gatherOp = defineOp<{ axis: number }>({
  name: 'Gather',
  nonDiffInputs: [1],
  infer: ([data, idx], { axis }) => {
    requireIndices(idx!);
    const ax = normAxis(axis, data!.shape.length);
    return [{ dtype: data!.dtype, shape: [...data!.shape.slice(0, ax), ...idx!.shape, ...data!.shape.slice(ax + 1)] }];
  },
  onnxAttrs: ({ axis }) => ({ axis: attr.int(axis) }),
  grad: ({ inputs: [data, idx], attrs: { axis }, dy: [g] }) => [gatherGrad(data!, idx!, g!, axis), null],
});

/**
 * A scatter-add of `updates` into zeros shaped like `like`. Half-precision gradients accumulate in
 * float32 (summing many rows in bfloat16 loses bits, and ONNX Runtime's CUDA ScatterND has no
 * bfloat16 kernel), then are cast back. The result is marked so that `grad`'s accumulation adds
 * the rows into the tensor's other gradient instead (`into`; an embedding tied to the LM head then
 * gets one table-sized buffer, not three), and a half-precision result keeps its float32 sum.
 */
function scatterAddZeros(like: Tensor, scatter: (zeros: Tensor, updates: Tensor) => Tensor, updates: Tensor): Tensor {
  const half = like.dtype === 'bfloat16' || like.dtype === 'float16';
  const wideUpdates = half ? cast(updates, 'float32') : updates;
  const into = (base: Tensor): Tensor => {
    if (!half) return scatter(base, updates);
    const wide = scatter(wideOf(base) ?? cast(base, 'float32'), wideUpdates);
    const out = cast(wide, like.dtype);
    markWide(out, wide);
    return out;
  };
  const zeros = !half ? zerosLike(like) : like.rank === 0 ? constant(like.graph, 0, 'float32', []) : expand(constant(like.graph, 0, 'float32', []), like.shape, like);
  const out = half ? into(zeros) : scatter(zeros, updates);
  markScatterAdd(out, { into });
  return out;
}

/**
 * Scatter-adds the gradient rows back into a zero tensor of data's shape. Gather along axis k is
 * turned into a gather along axis 0 by moving axis k to the front.
 */
function gatherGrad(data: Tensor, idx: Tensor, g: Tensor, axis: number): Tensor {
  const r = data.rank;
  const q = idx.rank;
  const idx64 = unsqueeze(idx, [q]);
  if (axis === 0) return scatterAddZeros(data, (zeros, upd) => scatterND(zeros, idx64, upd, 'add'), g);
  // data' = data moved so axis is first; g' = g with the index dims first.
  const permData = [axis, ...[...Array(r).keys()].filter((i) => i !== axis)];
  const gPerm = [...Array(q).keys()].map((i) => axis + i);
  const rest = [...Array(axis).keys(), ...[...Array(r - axis - 1).keys()].map((i) => axis + q + i)];
  const gMoved = transpose(g, [...gPerm, ...rest]);
  const scattered = scatterAddZeros(transpose(data, permData), (zeros, upd) => scatterND(zeros, idx64, upd, 'add'), gMoved);
  const inv = new Array<number>(r);
  permData.forEach((p, i) => (inv[p] = i));
  return transpose(scattered, inv);
}

export const gatherElementsOp = defineOp<{ axis: number }>({
  name: 'GatherElements',
  nonDiffInputs: [1],
  infer: ([data, idx], { axis }) => {
    requireIndices(idx!);
    if (idx!.shape.length !== data!.shape.length) throw new Error('indices must have the rank of data');
    normAxis(axis, data!.shape.length);
    return [{ dtype: data!.dtype, shape: idx!.shape }];
  },
  onnxAttrs: ({ axis }) => ({ axis: attr.int(axis) }),
  grad: ({ inputs: [data, idx], attrs: { axis }, dy: [g] }) => [scatterAddZeros(data!, (zeros, upd) => scatterElements(zeros, idx!, upd, axis, 'add'), g!), null],
});

export const gatherNDOp = defineOp({
  name: 'GatherND',
  nonDiffInputs: [1],
  infer: ([data, idx]) => {
    requireIndices(idx!);
    if (idx!.dtype !== 'int64') throw new Error('GatherND indices must be int64');
    const k = idx!.shape[idx!.shape.length - 1];
    if (typeof k !== 'number') throw new Error('the last dim of GatherND indices must be static');
    return [{ dtype: data!.dtype, shape: [...idx!.shape.slice(0, -1), ...data!.shape.slice(k)] }];
  },
  grad: ({ inputs: [data, idx], dy: [g] }) => [scatterAddZeros(data!, (zeros, upd) => scatterND(zeros, idx!, upd, 'add'), g!), null],
});

/** How a scatter combines updates with existing values. */
export type ScatterReduction = 'none' | 'add' | 'mul' | 'max' | 'min';

export const scatterElementsOp = defineOp<{ axis: number; reduction: ScatterReduction }>({
  name: 'ScatterElements',
  nonDiffInputs: [1],
  infer: ([data, idx, upd], { axis }) => {
    requireIndices(idx!);
    if (upd!.dtype !== data!.dtype) throw new Error(`updates dtype ${upd!.dtype} differs from data ${data!.dtype}`);
    if (idx!.shape.length !== data!.shape.length) throw new Error('indices must have the rank of data');
    if (!sameDims(idx!.shape, upd!.shape)) throw new Error(`indices ${formatShape(idx!.shape)} and updates ${formatShape(upd!.shape)} differ`);
    normAxis(axis, data!.shape.length);
    return [{ dtype: data!.dtype, shape: data!.shape }];
  },
  onnxAttrs: ({ axis, reduction }) => ({ axis: attr.int(axis), reduction: attr.string(reduction) }),
  grad: ({ inputs: [, idx, upd], attrs: { axis, reduction }, dy: [g] }) => {
    if (reduction !== 'none' && reduction !== 'add') throw new Error(`ScatterElements: no gradient for reduction '${reduction}'`);
    const dData = reduction === 'add' ? g! : scatterElements(g!, idx!, zerosLike(upd!), axis, 'none');
    return [dData, null, gatherElements(g!, idx!, axis)];
  },
});

export const scatterNDOp = defineOp<{ reduction: ScatterReduction }>({
  name: 'ScatterND',
  nonDiffInputs: [1],
  infer: ([data, idx, upd]) => {
    if (idx!.dtype !== 'int64') throw new Error('ScatterND indices must be int64');
    if (upd!.dtype !== data!.dtype) throw new Error(`updates dtype ${upd!.dtype} differs from data ${data!.dtype}`);
    return [{ dtype: data!.dtype, shape: data!.shape }];
  },
  onnxAttrs: ({ reduction }) => ({ reduction: attr.string(reduction) }),
  grad: ({ inputs: [, idx, upd], attrs: { reduction }, dy: [g] }) => {
    if (reduction !== 'none' && reduction !== 'add') throw new Error(`ScatterND: no gradient for reduction '${reduction}'`);
    const dData = reduction === 'add' ? g! : scatterND(g!, idx!, zerosLike(upd!), 'none');
    return [dData, null, applyOp(gatherNDOp, [g!, idx!], {})[0]];
  },
});

export const oneHotOp = defineOp<{ depth: Dim; axis: number; dtype: DType }>({
  name: 'OneHot',
  infer: ([idx], { depth, axis, dtype }) => {
    if (!isInteger(idx!.dtype)) throw new Error(`indices must be integers, got ${idx!.dtype}`);
    const r = idx!.shape.length + 1;
    const ax = normAxis(axis, r);
    const shape = [...idx!.shape];
    shape.splice(ax, 0, depth);
    return [{ dtype, shape }];
  },
  onnxAttrs: ({ axis }) => ({ axis: attr.int(axis) }),
  grad: 'none',
});

function sameDims(a: readonly Dim[], b: readonly Dim[]): boolean {
  return a.length === b.length && a.every((d, i) => dimEquals(d, b[i]) || isAnonymousDim(d) || isAnonymousDim(b[i]));
}

// ---- functional API --------------------------------------------------------------------------

/** data taken at `indices` along `axis` (e.g. embedding lookup: gather(table, ids, 0)). */
export function gather(data: Tensor, indices: Tensor, axis = 0): Tensor {
  return applyOp(gatherOp, [data, indices], { axis: normAxis(axis, data.rank) })[0];
}
/** out[i][j] = data[i][idx[i][j]] (for axis 1), elementwise indexing along an axis. */
export function gatherElements(data: Tensor, indices: Tensor, axis: number): Tensor {
  return applyOp(gatherElementsOp, [data, indices], { axis: normAxis(axis, data.rank) })[0];
}
/** Gathers slices by index tuples in the last axis of `indices` (int64). */
export function gatherND(data: Tensor, indices: Tensor): Tensor {
  return applyOp(gatherNDOp, [data, indices], {})[0];
}
/** Copy of data with `updates` written (or reduced) at `indices` along `axis`. */
export function scatterElements(data: Tensor, indices: Tensor, updates: Tensor, axis: number, reduction: ScatterReduction = 'none'): Tensor {
  return applyOp(scatterElementsOp, [data, indices, updates], { axis: normAxis(axis, data.rank), reduction })[0];
}
/** Copy of data with `updates` written (or reduced) at index tuples `indices` (int64). */
export function scatterND(data: Tensor, indices: Tensor, updates: Tensor, reduction: ScatterReduction = 'none'): Tensor {
  return applyOp(scatterNDOp, [data, indices, updates], { reduction })[0];
}
/** One-hot encoding of integer indices (`depth` classes, inserted at `axis`). */
export function oneHot(indices: Tensor, depth: Dim, dtype: DType = 'float32', axis = -1): Tensor {
  const g = indices.graph;
  const depthT = typeof depth === 'number' ? constant(g, depth, 'int64', []) : dimTensor(g, depth);
  // Half-precision one-hots are built in float32 and cast (the values are exact either way).
  const built = dtype === 'bfloat16' || dtype === 'float16' ? 'float32' : dtype;
  const out = applyOp(oneHotOp, [indices, depthT, constant(g, [0, 1], built, [2])], { depth, axis, dtype: built })[0];
  return cast(out, dtype);
}

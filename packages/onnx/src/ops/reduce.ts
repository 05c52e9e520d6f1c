/**
 * Reductions and ops along one axis: ReduceSum/SumSquare/Max/Min, ArgMax/ArgMin, Softmax, LogSoftmax,
 * CumSum, TopK and windowed max (MaxPool), with their gradient rules. ReduceSum is defined in
 * core.ts (broadcast gradients are summed back with it) and re-exported here.
 */
import { dimDiv, type Dim } from '../dim';
import { isFloat, type DType } from '../dtype';
import { applyOp, type Tensor } from '../graph';
import { attr, defineOp } from '../op';
import { cast, constant, dimTensor, mul, reducedShape, reduceOp, reduceSum, reduceWith, shapeOf, spread, unsqueezeAxes, type ReduceAttrs } from './core';
import { div, equal, exp, sub, zerosLike } from './elementwise';
import { normAxis } from './helpers';
import { scatterElements } from './indexing';

export { reduceSum, reduceSumOp } from './core';

/** Σx² in one pass (no x² tensor written): d/dx = 2·x·g. */
export const reduceSumSquareOp = reduceOp('ReduceSumSquare', ({ x, g, attrs }) => mul(mul(x, spread(g, x, attrs)), 2));

/** Max/min: the gradient is shared equally among the elements that attain the extreme. */
const extremeGrad = ({ x, y, g, attrs }: { x: Tensor; y: Tensor; g: Tensor; attrs: ReduceAttrs }) => {
  const hit = cast(equal(x, spread(y, x, attrs)), x.dtype);
  const count = reduceSum(hit, attrs.axes, true);
  const keptG = attrs.keepdims ? g : unsqueezeAxes(g, attrs.axes.map((a) => normAxis(a, x.rank)));
  return mul(hit, div(keptG, count));
};
export const reduceMaxOp = reduceOp('ReduceMax', extremeGrad);
export const reduceMinOp = reduceOp('ReduceMin', extremeGrad);

function argOp(name: string) {
  return defineOp<{ axis: number; keepdims: boolean }>({
    name,
    infer: ([x], a) => [{ dtype: 'int64', shape: reducedShape(x!, { axes: [a.axis], keepdims: a.keepdims }) }],
    onnxAttrs: (a) => ({ axis: attr.int(a.axis), keepdims: attr.int(a.keepdims ? 1 : 0) }),
    grad: 'none',
  });
}
export const argMaxOp = argOp('ArgMax');
export const argMinOp = argOp('ArgMin');

function softmaxLike(name: string, grad: (y: Tensor, g: Tensor, axis: number) => Tensor) {
  return defineOp<{ axis: number }>({
    name,
    infer: ([x], { axis }) => {
      if (!isFloat(x!.dtype)) throw new Error(`expects a floating-point tensor, got ${x!.dtype}`);
      normAxis(axis, x!.shape.length);
      return [{ dtype: x!.dtype, shape: x!.shape }];
    },
    onnxAttrs: ({ axis }) => ({ axis: attr.int(axis) }),
    grad: ({ outputs: [y], attrs: { axis }, dy: [g] }) => [grad(y, g!, axis)],
  });
}
/** dx = y ⊙ (g − Σ g⊙y). */
export const softmaxOp = softmaxLike('Softmax', (y, g, axis) => mul(y, sub(g, reduceSum(mul(g, y), [axis], true))));
/** dx = g − softmax ⊙ Σ g. */
export const logSoftmaxOp = softmaxLike('LogSoftmax', (y, g, axis) => sub(g, mul(exp(y), reduceSum(g, [axis], true))));

export const cumSumOp = defineOp<{ axis: number; exclusive: boolean; reverse: boolean }>({
  name: 'CumSum',
  nonDiffInputs: [1],
  infer: ([x], { axis }) => {
    normAxis(axis, x!.shape.length);
    return [{ dtype: x!.dtype, shape: x!.shape }];
  },
  onnxAttrs: (a) => ({ exclusive: attr.int(a.exclusive ? 1 : 0), reverse: attr.int(a.reverse ? 1 : 0) }),
  // The adjoint of a prefix sum is a suffix sum (and vice versa), with the same exclusivity.
  grad: ({ attrs, dy: [g] }) => [cumsum(g!, attrs.axis, { exclusive: attrs.exclusive, reverse: !attrs.reverse }), null],
});

export const topKOp = defineOp<{ k: Dim; axis: number; largest: boolean }>({
  name: 'TopK',
  nonDiffInputs: [1],
  infer: ([x], { k, axis }) => {
    const ax = normAxis(axis, x!.shape.length);
    const d = x!.shape[ax];
    if (typeof k === 'number' && typeof d === 'number' && k > d) throw new Error(`k=${k} exceeds axis size ${d}`);
    const shape = [...x!.shape];
    shape[ax] = k;
    return [
      { dtype: x!.dtype, shape },
      { dtype: 'int64', shape },
    ];
  },
  onnxAttrs: (a) => ({ axis: attr.int(a.axis), largest: attr.int(a.largest ? 1 : 0), sorted: attr.int(1) }),
  grad: ({ inputs: [x], outputs: [, idx], attrs, dy: [g] }) => [
    g ? scatterElements(zerosLike(x!), idx, g, attrs.axis, 'add') : null,
    null,
  ],
});

// ---- functional API --------------------------------------------------------------------------

/** Σ x² over axes (all axes when omitted), in one kernel. */
export function reduceSumSquare(x: Tensor, axes?: number | number[], keepdims = false): Tensor {
  return reduceWith(reduceSumSquareOp, x, axes, keepdims);
}
/** max over axes (all when omitted). */
export function reduceMax(x: Tensor, axes?: number | number[], keepdims = false): Tensor {
  return reduceWith(reduceMaxOp, x, axes, keepdims);
}
/** min over axes (all when omitted). */
export function reduceMin(x: Tensor, axes?: number | number[], keepdims = false): Tensor {
  return reduceWith(reduceMinOp, x, axes, keepdims);
}
/** Index of the maximum along an axis (first on ties). */
export function argMax(x: Tensor, axis: number, keepdims = false): Tensor {
  return applyOp(argMaxOp, [x], { axis: normAxis(axis, x.rank), keepdims })[0];
}
/** Index of the minimum along an axis (first on ties). */
export function argMin(x: Tensor, axis: number, keepdims = false): Tensor {
  return applyOp(argMinOp, [x], { axis: normAxis(axis, x.rank), keepdims })[0];
}
/** Softmax along an axis. */
export function softmax(x: Tensor, axis = -1): Tensor {
  return applyOp(softmaxOp, [x], { axis: normAxis(axis, x.rank) })[0];
}
/** log(softmax(x)) along an axis, computed stably. */
export function logSoftmax(x: Tensor, axis = -1): Tensor {
  return applyOp(logSoftmaxOp, [x], { axis: normAxis(axis, x.rank) })[0];
}
/** Running sum along an axis (exclusive: shifted by one; reverse: from the end). */
export function cumsum(x: Tensor, axis: number, opts: { exclusive?: boolean; reverse?: boolean } = {}): Tensor {
  const ax = normAxis(axis, x.rank);
  return applyOp(cumSumOp, [x, constant(x.graph, ax, 'int64', [])], { axis: ax, exclusive: !!opts.exclusive, reverse: !!opts.reverse })[0];
}
/** The k largest (or smallest) values along an axis, sorted, with their int64 indices. */
export function topK(x: Tensor, k: Dim, axis = -1, largest = true): [Tensor, Tensor] {
  const ax = normAxis(axis, x.rank);
  const [v, i] = applyOp(topKOp, [x, dimTensor(x.graph, k)], { k, axis: ax, largest });
  return [v, i];
}

/**
 * MaxPool over the last axis of [N, C, W] (or [N, C, H, W], pooled 1 × k) in non-overlapping
 * windows of k (stride k): the maximum of each window, [N, C, ⌊W/k⌋], and where it is, as ONNX
 * gives it: the index into the flattened input (((n·C + c)·H + h)·W + w) of the window's first
 * maximum. No gradient (sampling and the loss's stabiliser use it).
 *
 * A reduction's equal in value, but ONNX Runtime's CUDA provider runs it as a pooling kernel,
 * several times faster than ReduceMax. Keep the rows out of the channels ([8192, 1, 16384] rather
 * than [8, 1024, 16384]): many channels make it several times slower (docs/benchmarks.md).
 */
export const maxPoolOp = defineOp<{ k: number; indices: boolean; rank: number }>({
  name: 'MaxPool',
  infer: ([x], { k, indices }) => {
    const r = x!.shape.length;
    if (r !== 3 && r !== 4) throw new Error(`MaxPool: expects [N, C, W] or [N, C, H, W], got [${x!.shape}]`);
    if (!isFloat(x!.dtype)) throw new Error(`MaxPool: expects a floating-point tensor, got ${x!.dtype}`);
    const w = x!.shape[r - 1];
    if (typeof w === 'number' && w < k) throw new Error(`MaxPool: window ${k} is wider than the axis (${w})`);
    const pooled = typeof w === 'number' ? Math.floor(w / k) : dimDiv(w, k);
    if (pooled === undefined) throw new Error(`MaxPool: the pooled axis must be static or a multiple of the window ${k}, got [${x!.shape}]`);
    const out = { dtype: x!.dtype, shape: [...x!.shape.slice(0, -1), pooled] };
    return indices ? [out, { dtype: 'int64' as DType, shape: out.shape }] : [out];
  },
  onnxAttrs: ({ k, rank }) => {
    const window = rank === 4 ? [1, k] : [k];
    return { kernel_shape: attr.ints(window), strides: attr.ints(window) };
  },
  grad: 'none',
});

/** Maximum of each k-wide window along the last axis of [N, C, (H,) W], as [N, C, (H,) ⌊W/k⌋] (see {@link maxPoolOp}). */
export function windowMax(x: Tensor, k: number): Tensor {
  return applyOp(maxPoolOp, [x], { k, indices: false, rank: x.rank })[0];
}

/**
 * {@link windowMax} with the flattened input index of each window's first maximum (int64,
 * ((n·C + c)·W + w); see {@link maxPoolOp}).
 */
export function windowMaxWithIndex(x: Tensor, k: number): [Tensor, Tensor] {
  const [v, i] = applyOp(maxPoolOp, [x], { k, indices: true, rank: x.rank });
  return [v, i];
}

/** Number of elements over the given axes, as a scalar of `dtype` (computed at run time if symbolic). */
export function countOver(x: Tensor, axes: number[], dtype: DType): Tensor {
  const dims = axes.map((a) => x.shape[normAxis(a, x.rank)]);
  if (dims.every((d) => typeof d === 'number')) {
    return constant(x.graph, (dims as number[]).reduce((a, b) => a * b, 1), dtype, []);
  }
  const sizes = axes.map((a) => {
    const ax = normAxis(a, x.rank);
    return shapeOf(x, ax, ax + 1);
  });
  let n = sizes[0];
  for (const s of sizes.slice(1)) n = mul(n, s);
  return cast(reduceSum(n, [0], false), dtype);
}


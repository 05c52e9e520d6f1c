/**
 * Composite ops written in the DSL from primitives, so autodiff covers them with no rule of their
 * own: means, log-sum-exp, activations, norms, cross-entropy, masked reductions and masks.
 */
import { GraphError, type Tensor, type TensorLike } from './graph';
import {
  add,
  cast,
  div,
  erf,
  exp,
  log,
  maximum,
  minimum,
  mul,
  neg,
  relu,
  scalarLike,
  sigmoid,
  sqrt,
  stopGradient,
  sub,
  where,
  greaterOrEqual,
  onesLike,
} from './ops/elementwise';
import { normAxis } from './ops/helpers';
import { countOver, cumsum, logSoftmax, reduceMax, reduceSum, softmax, windowMax } from './ops/reduce';
import { expand, reshape, slice, squeeze, unsqueeze } from './ops/shape-ops';
import { gatherElements } from './ops/indexing';
import { customGradient } from './autodiff';

function axesList(x: Tensor, axes?: number | number[]): number[] {
  if (axes === undefined) return [...Array(x.rank).keys()];
  return (Array.isArray(axes) ? axes : [axes]).map((a) => normAxis(a, x.rank));
}

/** Arithmetic mean over axes (all when omitted); the count is read at run time for symbolic dims. */
export function mean(x: Tensor, axes?: number | number[], keepdims = false): Tensor {
  const list = axesList(x, axes);
  return div(reduceSum(x, list, keepdims), countOver(x, list, x.dtype));
}

/**
 * Width of the windows a long axis of D elements is reduced in first: the widest of 256, 128, 64,
 * 32 that splits D into at least two windows, or D itself (one window: no first stage) when none
 * does. 151,936 (Qwen's vocabulary) gives 128; 16,384 gives 256.
 */
export function windowWidth(D: number): number {
  return [256, 128, 64, 32].find((c) => D % c === 0 && D / c >= 2) ?? D;
}

/**
 * max over the last axis, keeping it (size 1). A static axis that splits into windows (see
 * {@link windowWidth}) is reduced in two stages: MaxPool over the windows, then ReduceMax across
 * them. ONNX Runtime's CUDA provider runs Max reductions through cuDNN, slowly on long rows such as
 * an LM-head chunk of the loss (figures in docs/benchmarks.md).
 */
export function lastAxisMax(x: Tensor): Tensor {
  const D = x.shape[x.rank - 1];
  const k = typeof D === 'number' ? windowWidth(D) : 0;
  if (k === 0 || k === D || (x.rank !== 2 && x.rank !== 3)) return reduceMax(x, [x.rank - 1], true);
  const W = D as number;
  if (x.rank === 2) return squeeze(reduceMax(windowMax(unsqueeze(x, [1]), k), [2], true), [1]);
  // [B, T, W] pooled as [B, 1, T·W]: the rows go to MaxPool's N and W, never to its channels (slow,
  // see maxPoolOp); windows never straddle rows (k divides W), and both reshapes are constant
  // specs, so no shape is read or computed at run time.
  const [B, T] = x.shape;
  const windows = windowMax(reshape(x, [B, 1, -1]), k); // [B, 1, T·W/k]
  return reduceMax(reshape(windows, [B, T, W / k]), [2], true); // [B, T, 1]
}

/** log Σ exp(x) over axes, computed stably (the max is subtracted and treated as a constant). */
export function logSumExp(x: Tensor, axes?: number | number[], keepdims = false): Tensor {
  const list = axesList(x, axes);
  const m = stopGradient(list.length === 1 && list[0] === x.rank - 1 ? lastAxisMax(x) : reduceMax(x, list, true));
  const lse = add(m, log(reduceSum(exp(sub(x, m)), list, true)));
  return keepdims ? lse : squeeze(lse, list);
}

/**
 * log Σ exp(x) over the last axis of [rows, n], kept: [rows, 1]. One LogSoftmax pass forward
 * (y = x − lse, its max and sum inside the kernel), and lse = x₀ − y₀ from the first column; the
 * gradient, softmax(x)·dy = exp(y)·dy, by a rule of its own. Passes over x: one forward and two
 * backward (Exp, Mul), where `logSumExp` takes four forward (max, subtract, exp, sum) and one
 * backward, which shows in the train step on the loss's LM-head chunks (docs/benchmarks.md). x must
 * be finite in column 0: a −∞ there makes the result NaN (x₀ − y₀ = −∞ + ∞).
 */
export function rowLogSumExp(x: Tensor): Tensor {
  if (x.rank !== 2) throw new GraphError(`rowLogSumExp: x must be [rows, n], got rank ${x.rank}`);
  return customGradient(
    [x],
    () => {
      const y = logSoftmax(x, -1);
      const first = (t: Tensor) => slice(t, [1], [0], [1]);
      return { output: sub(first(x), first(y)), saved: [y] };
    },
    ({ saved: [y], dy }) => [mul(exp(y), dy)],
  );
}

/** x². */
export function square(x: Tensor): Tensor {
  return mul(x, x);
}
/** 1/√x (Div rather than Reciprocal, which lacks a bf16 CUDA kernel). */
export function rsqrt(x: Tensor): Tensor {
  return div(scalarLike(1, x), sqrt(x));
}
/** x·σ(x) (a.k.a. swish). */
export function silu(x: Tensor): Tensor {
  return mul(x, sigmoid(x));
}
/** Exact GELU: ½x(1 + erf(x/√2)). */
export function gelu(x: Tensor): Tensor {
  return mul(mul(x, scalarLike(0.5, x)), add(erf(mul(x, scalarLike(Math.SQRT1_2, x))), scalarLike(1, x)));
}
/** log(1 + eˣ), stable for large |x|. */
export function softplus(x: Tensor): Tensor {
  // x − 2·relu(x) is −|x| exactly, but unlike Abs (whose gradient at 0 is 0) it keeps σ(0) = ½ as the gradient at x = 0
  const r = relu(x);
  return add(r, log(add(exp(sub(x, mul(r, scalarLike(2, x)))), scalarLike(1, x))));
}
/** log σ(x) = −softplus(−x). */
export function logSigmoid(x: Tensor): Tensor {
  return neg(softplus(neg(x)));
}
/** Clamps into [lo, hi] (built from Max/Min: ONNX Clip has no bf16 CUDA kernel). */
export function clip(x: Tensor, lo: TensorLike, hi: TensorLike): Tensor {
  return minimum(maximum(x, lo), hi);
}

/** RMSNorm over the last axis: x / √(mean(x²) + eps) · weight. */
export function rmsNorm(x: Tensor, weight: Tensor | undefined, eps: number): Tensor {
  const ms = mean(square(x), -1, true);
  const y = mul(x, rsqrt(add(ms, scalarLike(eps, ms))));
  return weight ? mul(y, weight) : y;
}

/** LayerNorm over the last axis. */
export function layerNorm(x: Tensor, weight: Tensor | undefined, bias: Tensor | undefined, eps: number): Tensor {
  const mu = mean(x, -1, true);
  const xc = sub(x, mu);
  const y = mul(xc, rsqrt(add(mean(square(xc), -1, true), scalarLike(eps, mu))));
  const w = weight ? mul(y, weight) : y;
  return bias ? add(w, bias) : w;
}

/** log p(target) under softmax(logits) along the last axis; targets are integer ids. */
export function tokenLogprobs(logits: Tensor, targets: Tensor): Tensor {
  if (targets.rank !== logits.rank - 1) {
    throw new GraphError(`tokenLogprobs: targets ${targets} must have one axis fewer than logits ${logits}`);
  }
  const idx = unsqueeze(cast(targets, 'int64'), [targets.rank]);
  return squeeze(gatherElements(logSoftmax(logits, -1), idx, -1), [targets.rank]);
}

/** −log p(target): per-position cross-entropy. */
export function crossEntropy(logits: Tensor, targets: Tensor): Tensor {
  return neg(tokenLogprobs(logits, targets));
}

/** Entropy of softmax(logits) along the last axis. */
export function entropy(logits: Tensor): Tensor {
  return neg(reduceSum(mul(softmax(logits, -1), logSoftmax(logits, -1)), [-1 + logits.rank]));
}

/** Σ x·mask over axes (all when omitted); mask is cast to x's dtype. */
export function maskedSum(x: Tensor, mask: Tensor, axes?: number | number[], keepdims = false): Tensor {
  return reduceSum(mul(x, cast(mask, x.dtype)), axesList(x, axes), keepdims);
}

/** Σ x·mask / Σ mask over axes (all when omitted); 0 where the mask is empty. */
export function maskedMean(x: Tensor, mask: Tensor, axes?: number | number[], keepdims = false): Tensor {
  const m = cast(mask, x.dtype);
  const list = axesList(x, axes);
  const mb = expand(m, x.shape, x);
  const denom = maximum(reduceSum(mb, list, keepdims), scalarLike(1e-8, x));
  return div(reduceSum(mul(x, m), list, keepdims), denom);
}

/**
 * Lower-triangular bool mask [n, n] (true where key ≤ query): the causal attention mask, for the
 * length n of `like` along `axis`. Built from positions (a running count along one row of `like`),
 * so no shape arithmetic is needed at run time even when n is symbolic.
 */
export function causalMask(like: Tensor, axis = -1): Tensor {
  const ax = normAxis(axis, like.rank);
  let row = like;
  for (let i = 0; i < like.rank; i++) if (i !== ax) row = slice(row, [i], [0], [1]);
  const line = reshape(row, [like.shape[ax]]);
  const pos = cumsum(onesLike(cast(line, 'float32')), 0);
  return greaterOrEqual(unsqueeze(pos, [1]), unsqueeze(pos, [0]));
}

/** Softmax over the last axis with −∞-like scores where `mask` (bool, broadcastable) is false. */
export function maskedSoftmax(scores: Tensor, mask: Tensor): Tensor {
  // fp16 cannot hold 1e9; −6e4 is far below any attention score yet finite.
  const big = scores.dtype === 'float16' ? -6e4 : -1e9;
  return softmax(where(mask, scores, scalarLike(big, scores)), -1);
}

/**
 * Method-style API on Tensor (`x.sub(y).exp().maskedMean(mask)`), delegating to the functional
 * ops. Elementwise `min`/`max` take a second operand; reductions are `sum`, `mean`, `amax`, `amin`.
 * Also Graph's methods that add nodes (`constant`, `output`, `dimTensor`, `shapeTensor`): graph.ts
 * stays below the op modules, so these are attached here over the builders in ops/core.ts.
 */
import type { Dim, Shape } from './dim';
import type { DType } from './dtype';
import { Graph, Tensor, type TensorLike } from './graph';
import * as core from './ops/core';
import * as ew from './ops/elementwise';
import * as red from './ops/reduce';
import * as sh from './ops/shape-ops';
import * as ix from './ops/indexing';
import { matmul } from './ops/linalg';
import * as nn from './nn';

declare module './graph' {
  interface Graph {
    /** A constant tensor from JS values (deduplicated for small constants). */
    constant(values: ArrayLike<number> | number, dtype: DType, shape?: number[]): Tensor;
    /** Marks a tensor as a graph output, optionally under a new name. */
    output(t: Tensor, name?: string): Tensor;
    /** The run-time value of a dim as an int64 tensor of shape [1]. */
    dimTensor(d: Dim): Tensor;
    /** A 1-D int64 tensor holding a shape (constant when every dim is static; -1 stays -1). */
    shapeTensor(dims: Shape): Tensor;
  }
  interface Tensor {
    /** this + b */ add(b: TensorLike): Tensor;
    /** this − b */ sub(b: TensorLike): Tensor;
    /** this · b */ mul(b: TensorLike): Tensor;
    /** this / b */ div(b: TensorLike): Tensor;
    /** this ** b */ pow(b: TensorLike): Tensor;
    /** Elementwise minimum with b. */ min(b: TensorLike): Tensor;
    /** Elementwise maximum with b. */ max(b: TensorLike): Tensor;
    /** this == b */ eq(b: TensorLike): Tensor;
    /** this < b */ lt(b: TensorLike): Tensor;
    /** this <= b */ le(b: TensorLike): Tensor;
    /** this > b */ gt(b: TensorLike): Tensor;
    /** this >= b */ ge(b: TensorLike): Tensor;
    /** Logical and. */ and(b: Tensor): Tensor;
    /** Logical or. */ or(b: Tensor): Tensor;
    /** Logical not. */ not(): Tensor;
    /** −this */ neg(): Tensor;
    /** eˣ */ exp(): Tensor;
    /** ln x */ log(): Tensor;
    /** √x */ sqrt(): Tensor;
    /** 1/√x */ rsqrt(): Tensor;
    /** x² */ square(): Tensor;
    /** |x| */ abs(): Tensor;
    /** tanh x */ tanh(): Tensor;
    /** σ(x) */ sigmoid(): Tensor;
    /** erf x */ erf(): Tensor;
    /** max(x, 0) */ relu(): Tensor;
    /** x·σ(x) */ silu(): Tensor;
    /** Exact GELU. */ gelu(): Tensor;
    /** Clamp into [lo, hi]. */ clip(lo: TensorLike, hi: TensorLike): Tensor;
    /** Convert dtype. */ cast(to: DType): Tensor;
    /** Same value, no gradient through it. */ stopGradient(): Tensor;
    /** Batched matrix product. */ matmul(b: Tensor): Tensor;
    /** Σ over axes (all when omitted). */ sum(axes?: number | number[], keepdims?: boolean): Tensor;
    /** Mean over axes (all when omitted). */ mean(axes?: number | number[], keepdims?: boolean): Tensor;
    /** Max over axes (all when omitted). */ amax(axes?: number | number[], keepdims?: boolean): Tensor;
    /** Min over axes (all when omitted). */ amin(axes?: number | number[], keepdims?: boolean): Tensor;
    /** Stable log Σ exp over axes. */ logSumExp(axes?: number | number[], keepdims?: boolean): Tensor;
    /** Index of the max along an axis. */ argmax(axis: number, keepdims?: boolean): Tensor;
    /** Softmax along an axis (default last). */ softmax(axis?: number): Tensor;
    /** Log-softmax along an axis (default last). */ logSoftmax(axis?: number): Tensor;
    /** Running sum along an axis. */ cumsum(axis: number, opts?: { exclusive?: boolean; reverse?: boolean }): Tensor;
    /** k largest values and their indices along an axis. */ topk(k: Dim, axis?: number): [Tensor, Tensor];
    /** Σ this·mask / Σ mask. */ maskedMean(mask: Tensor, axes?: number | number[], keepdims?: boolean): Tensor;
    /** Σ this·mask. */ maskedSum(mask: Tensor, axes?: number | number[], keepdims?: boolean): Tensor;
    /** New shape (one -1 allowed). */ reshape(dims: Shape): Tensor;
    /** Permute axes (default: reverse). */ transpose(perm?: number[]): Tensor;
    /** Slice along axes. */ slice(axes: number[], starts: Dim[], ends?: Dim[], steps?: number[]): Tensor;
    /** Remove size-1 axes. */ squeeze(axes: number[]): Tensor;
    /** Insert size-1 axes. */ unsqueeze(axes: number[]): Tensor;
    /** Broadcast to a shape. */ expand(dims: Shape): Tensor;
    /** Take along an axis. */ gather(indices: Tensor, axis?: number): Tensor;
    /** Elementwise take along an axis. */ gatherElements(indices: Tensor, axis: number): Tensor;
  }
}

const gp = Graph.prototype;
gp.constant = function (values, dtype, shape) { return core.constant(this, values, dtype, shape); };
gp.output = function (t, name) { return core.output(this, t, name); };
gp.dimTensor = function (d) { return core.dimTensor(this, d); };
gp.shapeTensor = function (dims) { return core.shapeTensor(this, dims); };

const p = Tensor.prototype;
p.add = function (b) { return ew.add(this, b); };
p.sub = function (b) { return ew.sub(this, b); };
p.mul = function (b) { return ew.mul(this, b); };
p.div = function (b) { return ew.div(this, b); };
p.pow = function (b) { return ew.pow(this, b); };
p.min = function (b) { return ew.minimum(this, b); };
p.max = function (b) { return ew.maximum(this, b); };
p.eq = function (b) { return ew.equal(this, b); };
p.lt = function (b) { return ew.less(this, b); };
p.le = function (b) { return ew.lessOrEqual(this, b); };
p.gt = function (b) { return ew.greater(this, b); };
p.ge = function (b) { return ew.greaterOrEqual(this, b); };
p.and = function (b) { return ew.and(this, b); };
p.or = function (b) { return ew.or(this, b); };
p.not = function () { return ew.not(this); };
p.neg = function () { return ew.neg(this); };
p.exp = function () { return ew.exp(this); };
p.log = function () { return ew.log(this); };
p.sqrt = function () { return ew.sqrt(this); };
p.rsqrt = function () { return nn.rsqrt(this); };
p.square = function () { return nn.square(this); };
p.abs = function () { return ew.abs(this); };
p.tanh = function () { return ew.tanh(this); };
p.sigmoid = function () { return ew.sigmoid(this); };
p.erf = function () { return ew.erf(this); };
p.relu = function () { return ew.relu(this); };
p.silu = function () { return nn.silu(this); };
p.gelu = function () { return nn.gelu(this); };
p.clip = function (lo, hi) { return nn.clip(this, lo, hi); };
p.cast = function (to) { return ew.cast(this, to); };
p.stopGradient = function () { return ew.stopGradient(this); };
p.matmul = function (b) { return matmul(this, b); };
p.sum = function (axes, keepdims) { return red.reduceSum(this, axes, keepdims); };
p.mean = function (axes, keepdims) { return nn.mean(this, axes, keepdims); };
p.amax = function (axes, keepdims) { return red.reduceMax(this, axes, keepdims); };
p.amin = function (axes, keepdims) { return red.reduceMin(this, axes, keepdims); };
p.logSumExp = function (axes, keepdims) { return nn.logSumExp(this, axes, keepdims); };
p.argmax = function (axis, keepdims) { return red.argMax(this, axis, keepdims); };
p.softmax = function (axis) { return red.softmax(this, axis); };
p.logSoftmax = function (axis) { return red.logSoftmax(this, axis); };
p.cumsum = function (axis, opts) { return red.cumsum(this, axis, opts); };
p.topk = function (k, axis) { return red.topK(this, k, axis); };
p.maskedMean = function (mask, axes, keepdims) { return nn.maskedMean(this, mask, axes, keepdims); };
p.maskedSum = function (mask, axes, keepdims) { return nn.maskedSum(this, mask, axes, keepdims); };
p.reshape = function (dims) { return sh.reshape(this, dims); };
p.transpose = function (perm) { return sh.transpose(this, perm); };
p.slice = function (axes, starts, ends, steps) { return sh.slice(this, axes, starts, ends, steps); };
p.squeeze = function (axes) { return sh.squeeze(this, axes); };
p.unsqueeze = function (axes) { return sh.unsqueeze(this, axes); };
p.expand = function (dims) { return sh.expand(this, dims); };
p.gather = function (indices, axis) { return ix.gather(this, indices, axis); };
p.gatherElements = function (indices, axis) { return ix.gatherElements(this, indices, axis); };

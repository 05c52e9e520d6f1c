/**
 * What a gradient rule knows about the gradients it makes, for the accumulation in `grad` to use:
 * a scatter-add into zeros (a gather's gradient) can add its rows into another contribution
 * instead, sparing the zeros and the sum, each as large as the gathered table (an embedding's
 * [vocabulary, hidden]); and a half-precision gradient summed in float32 keeps that float32 value,
 * so a later widening (the Cast to a float32 master weight) need not round through half precision.
 */
import type { Tensor } from './graph';

/** A gradient made by scatter-adding rows into zeros. */
export interface ScatterAddGrad {
  /** The same rows scatter-added into `base` (a gradient of the same tensor): base + this gradient. */
  into(base: Tensor): Tensor;
}

const scatterAdds = new WeakMap<Tensor, ScatterAddGrad>();
const widened = new WeakMap<Tensor, Tensor>();

/** Marks `grad` as a scatter-add into zeros that `s.into` can redo into another base. */
export function markScatterAdd(grad: Tensor, s: ScatterAddGrad): void {
  scatterAdds.set(grad, s);
}

/** How `grad` was scatter-added into zeros, if it was. */
export function scatterAddOf(grad: Tensor): ScatterAddGrad | undefined {
  return scatterAdds.get(grad);
}

/** Marks half-precision `half` as `wide` (float32) rounded. */
export function markWide(half: Tensor, wide: Tensor): void {
  widened.set(half, wide);
}

/** The float32 value half-precision `t` was rounded from, if known. */
export function wideOf(t: Tensor): Tensor | undefined {
  return widened.get(t);
}

/** Small building blocks shared by gradient rules. */
import { dimEquals, type Shape } from '../dim';
import type { Tensor } from '../graph';
import { reduceSum } from './reduce';

/** Whether two shapes are the same dims. */
export function sameShape(a: Shape, b: Shape): boolean {
  return a.length === b.length && a.every((d, i) => dimEquals(d, b[i]));
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

/** Normalises a possibly negative axis against a rank, with a clear error. */
export function normAxis(axis: number, rank: number): number {
  const a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank || !Number.isInteger(a)) throw new Error(`axis ${axis} is out of range for rank ${rank}`);
  return a;
}

/** The permutation that undoes `perm`. */
export function inversePerm(perm: number[]): number[] {
  const inv = new Array<number>(perm.length);
  perm.forEach((p, i) => (inv[p] = i));
  return inv;
}

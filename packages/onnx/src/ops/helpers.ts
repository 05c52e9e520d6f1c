/**
 * Small building blocks shared by the op modules: axis and shape arithmetic, the broadcasting
 * shape rule, and the factories elementwise ops are defined with. Nothing here builds nodes.
 */
import { broadcastShapes, dimEquals, formatShape, type Shape } from '../dim';
import { isFloat, type DType } from '../dtype';
import { defineOp, type OpDef, type TensorType } from '../op';

/** Whether two shapes are the same dims. */
export function sameShape(a: Shape, b: Shape): boolean {
  return a.length === b.length && a.every((d, i) => dimEquals(d, b[i]));
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

function sameDtype(types: (TensorType | null)[]): DType {
  const ts = types.filter((t): t is TensorType => t !== null);
  const d = ts[0].dtype;
  if (ts.some((t) => t.dtype !== d)) throw new Error(`dtypes differ (${ts.map((t) => t.dtype).join(' vs ')}); cast explicitly`);
  return d;
}

/** NumPy broadcasting of same-dtype operands; the output dtype is theirs unless given. */
export function broadcastRule(types: (TensorType | null)[], outDtype?: DType): TensorType[] {
  const dtype = sameDtype(types);
  const shape = broadcastShapes(...types.map((t) => t!.shape));
  if (!shape) throw new Error(`shapes ${types.map((t) => formatShape(t!.shape)).join(' and ')} do not broadcast`);
  return [{ dtype: outDtype ?? dtype, shape }];
}

/** Rejects non-floating-point operands. */
export function requireFloat(types: (TensorType | null)[]): void {
  for (const t of types) if (t && !isFloat(t.dtype)) throw new Error(`expects a floating-point tensor, got ${t.dtype}`);
}

/** Defines a broadcasting binary op with the given gradient rule. */
export function binary(name: string, grad: OpDef['grad'], opts: { floatOnly?: boolean } = {}): OpDef {
  return defineOp({
    name,
    infer: (types) => {
      if (opts.floatOnly) requireFloat(types);
      return broadcastRule(types);
    },
    grad,
  });
}

/** Defines a unary op whose output has its input's type (floating point only unless told). */
export function unary(name: string, grad: OpDef['grad'], opts: { floatOnly?: boolean } = { floatOnly: true }): OpDef {
  return defineOp({
    name,
    infer: (types) => {
      if (opts.floatOnly) requireFloat(types);
      return [{ dtype: types[0]!.dtype, shape: types[0]!.shape }];
    },
    grad,
  });
}

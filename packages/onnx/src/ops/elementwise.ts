/**
 * Elementwise primitives: NumPy-broadcasting binary ops, unary math, comparisons, logic, Where,
 * Cast and Identity. Each op's shape rule and gradient rule sit together.
 */
import { isFloat, isInteger, type DType } from '../dtype';
import { broadcastShapes, dimEquals, formatShape } from '../dim';
import { applyOp, setCoreOps, Tensor, type TensorLike } from '../graph';
import { attr, defineOp, type OpDef, type TensorType } from '../op';
import { concatOp } from './shape-ops';
import { shapeOp } from './shape-ops';
import { unbroadcast } from './helpers';

function sameDtype(types: (TensorType | null)[]): DType {
  const ts = types.filter((t): t is TensorType => t !== null);
  const d = ts[0].dtype;
  if (ts.some((t) => t.dtype !== d)) throw new Error(`dtypes differ (${ts.map((t) => t.dtype).join(' vs ')}); cast explicitly`);
  return d;
}

function broadcastRule(types: (TensorType | null)[], outDtype?: DType): TensorType[] {
  const dtype = sameDtype(types);
  const shape = broadcastShapes(...types.map((t) => t!.shape));
  if (!shape) throw new Error(`shapes ${types.map((t) => formatShape(t!.shape)).join(' and ')} do not broadcast`);
  return [{ dtype: outDtype ?? dtype, shape }];
}

function requireFloat(types: (TensorType | null)[]): void {
  for (const t of types) if (t && !isFloat(t.dtype)) throw new Error(`expects a floating-point tensor, got ${t.dtype}`);
}

function binary(name: string, grad: OpDef['grad'], opts: { floatOnly?: boolean } = {}): OpDef {
  return defineOp({
    name,
    infer: (types) => {
      if (opts.floatOnly) requireFloat(types);
      return broadcastRule(types);
    },
    grad,
  });
}

function unary(name: string, grad: OpDef['grad'], opts: { floatOnly?: boolean } = { floatOnly: true }): OpDef {
  return defineOp({
    name,
    infer: (types) => {
      if (opts.floatOnly) requireFloat(types);
      return [{ dtype: types[0]!.dtype, shape: types[0]!.shape }];
    },
    grad,
  });
}

const one = (x: Tensor): Tensor => scalarLike(1, x);

/** d/da, d/db of a binary op, each reduced back to its input's shape. */
function both(inputs: (Tensor | null)[], da: () => Tensor | null, db: () => Tensor | null): (Tensor | null)[] {
  const [a, b] = inputs as Tensor[];
  const ga = da();
  const gb = db();
  return [ga && unbroadcast(ga, a.shape), gb && unbroadcast(gb, b.shape)];
}

export const addOp = binary('Add', ({ inputs, dy: [g] }) => both(inputs, () => g, () => g));
export const subOp = binary('Sub', ({ inputs, dy: [g] }) => both(inputs, () => g, () => neg(g!)));
export const mulOp = binary('Mul', ({ inputs: [a, b], dy: [g] }) => both([a, b], () => mul(g!, b!), () => mul(g!, a!)));
export const divOp = binary('Div', ({ inputs: [a, b], outputs: [y], dy: [g] }) =>
  both([a, b], () => div(g!, b!), () => neg(div(mul(g!, y), b!))),
);
export const powOp = binary(
  'Pow',
  ({ inputs: [a, b], outputs: [y], dy: [g] }) =>
    both(
      [a, b],
      () => mul(g!, mul(b!, pow(a!, sub(b!, one(b!))))),
      () => mul(g!, mul(y, log(a!))),
    ),
  { floatOnly: true },
);
export const maxOp = binary('Max', ({ inputs: [a, b], dy: [g] }) => {
  const aWins = greaterOrEqual(a!, b!);
  return both([a, b], () => where(aWins, g!, zerosLike(g!)), () => where(aWins, zerosLike(g!), g!));
});
export const minOp = binary('Min', ({ inputs: [a, b], dy: [g] }) => {
  const aWins = lessOrEqual(a!, b!);
  return both([a, b], () => where(aWins, g!, zerosLike(g!)), () => where(aWins, zerosLike(g!), g!));
});
export const modOp = defineOp<{ fmod: number }>({
  name: 'Mod',
  infer: (types) => broadcastRule(types),
  onnxAttrs: (a) => ({ fmod: attr.int(a.fmod) }),
  grad: 'none',
});

function comparison(name: string): OpDef {
  return defineOp({ name, infer: (types) => broadcastRule(types, 'bool'), grad: 'none' });
}
export const equalOp = comparison('Equal');
export const lessOp = comparison('Less');
export const lessOrEqualOp = comparison('LessOrEqual');
export const greaterOp = comparison('Greater');
export const greaterOrEqualOp = comparison('GreaterOrEqual');

function logical(name: string): OpDef {
  return defineOp({
    name,
    infer: (types) => {
      for (const t of types) if (t!.dtype !== 'bool') throw new Error(`expects bool tensors, got ${t!.dtype}`);
      return broadcastRule(types, 'bool');
    },
    grad: 'none',
  });
}
export const andOp = logical('And');
export const orOp = logical('Or');
export const xorOp = logical('Xor');
export const notOp = defineOp({
  name: 'Not',
  infer: ([x]) => {
    if (x!.dtype !== 'bool') throw new Error(`expects a bool tensor, got ${x!.dtype}`);
    return [{ dtype: 'bool', shape: x!.shape }];
  },
  grad: 'none',
});

export const negOp = unary('Neg', ({ dy: [g] }) => [neg(g!)], { floatOnly: false });
// y first: g may be a broadcast [.., 1] (a folded Expand), and ONNX Runtime's fast broadcasting
// kernels want the full-size operand on the left.
export const expOp = unary('Exp', ({ outputs: [y], dy: [g] }) => [mul(y, g!)]);
export const logOp = unary('Log', ({ inputs: [x], dy: [g] }) => [div(g!, x!)]);
export const sqrtOp = unary('Sqrt', ({ outputs: [y], dy: [g] }) => [div(mul(g!, scalarLike(0.5, y)), y)]);
export const reciprocalOp = unary('Reciprocal', ({ outputs: [y], dy: [g] }) => [neg(mul(g!, mul(y, y)))]);
export const tanhOp = unary('Tanh', ({ outputs: [y], dy: [g] }) => [mul(g!, sub(one(y), mul(y, y)))]);
export const sigmoidOp = unary('Sigmoid', ({ outputs: [y], dy: [g] }) => [mul(g!, mul(y, sub(one(y), y)))]);
export const erfOp = unary('Erf', ({ inputs: [x], dy: [g] }) => [
  mul(g!, mul(scalarLike(2 / Math.sqrt(Math.PI), x!), exp(neg(mul(x!, x!))))),
]);
export const sinOp = unary('Sin', ({ inputs: [x], dy: [g] }) => [mul(g!, cos(x!))]);
export const cosOp = unary('Cos', ({ inputs: [x], dy: [g] }) => [neg(mul(g!, sin(x!)))]);
export const absOp = unary('Abs', ({ inputs: [x], dy: [g] }) => [mul(g!, sign(x!))], { floatOnly: false });
export const reluOp = unary('Relu', ({ inputs: [x], dy: [g] }) => [where(greater(x!, zerosLike(x!)), g!, zerosLike(g!))]);
export const signOp = unary('Sign', 'none', { floatOnly: false });
export const floorOp = unary('Floor', 'none');
export const ceilOp = unary('Ceil', 'none');
export const roundOp = unary('Round', 'none');
export const isNaNOp = defineOp({ name: 'IsNaN', infer: ([x]) => [{ dtype: 'bool', shape: x!.shape }], grad: 'none' });
export const isInfOp = defineOp({ name: 'IsInf', infer: ([x]) => [{ dtype: 'bool', shape: x!.shape }], grad: 'none' });

export const whereOp = defineOp({
  name: 'Where',
  infer: ([c, a, b]) => {
    if (c!.dtype !== 'bool') throw new Error(`condition must be bool, got ${c!.dtype}`);
    const [out] = broadcastRule([a, b]);
    const shape = broadcastShapes(c!.shape, out.shape);
    if (!shape) throw new Error(`condition ${formatShape(c!.shape)} does not broadcast with ${formatShape(out.shape)}`);
    return [{ dtype: out.dtype, shape }];
  },
  nonDiffInputs: [0],
  grad: ({ inputs: [c, a, b], dy: [g] }) => {
    const z = zerosLike(g!);
    return [null, unbroadcast(where(c!, g!, z), a!.shape), unbroadcast(where(c!, z, g!), b!.shape)];
  },
});

export const castOp = defineOp<{ to: DType }>({
  name: 'Cast',
  infer: ([x], a) => [{ dtype: a.to, shape: x!.shape }],
  onnxAttrs: (a) => ({ to: { kind: 'int', value: dtypeCode(a.to) } }),
  grad: ({ inputs: [x], dy: [g] }) => [isFloat(x!.dtype) ? cast(g!, x!.dtype) : null],
});

export const identityOp = defineOp({
  name: 'Identity',
  infer: ([x]) => [{ dtype: x!.dtype, shape: x!.shape }],
  grad: ({ dy: [g] }) => [g],
});

/** Identity whose output is treated as a constant by autodiff. */
export const stopGradientOp = defineOp({
  name: 'StopGradient',
  onnxOp: 'Identity',
  infer: ([x]) => [{ dtype: x!.dtype, shape: x!.shape }],
  grad: 'none',
});

// ---- functional API --------------------------------------------------------------------------

import { onnxTypeCode as dtypeCode } from '../dtype';

/** A scalar constant with the dtype of `like`, in `like`'s graph. */
export function scalarLike(value: number, like: Tensor): Tensor {
  return like.graph.constant(value, like.dtype, []);
}

/** Turns a JS number into a scalar of the other operand's dtype. */
function pair(a: TensorLike, b: TensorLike): [Tensor, Tensor] {
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

const bin = (op: OpDef) => (a: TensorLike, b: TensorLike): Tensor => {
  const [x, y] = pair(a, b);
  const x1 = unexpanded(x, y);
  return applyOp(op, [x1, unexpanded(y, x1)], {})[0]; // y against x1: both sources could be too small together
};
const un = (op: OpDef) => (x: Tensor): Tensor => applyOp(op, [x], {})[0];

/** a + b (broadcasting). */
export const add = bin(addOp);
/** a − b (broadcasting). */
export const sub = bin(subOp);
/** a · b (broadcasting). */
export const mul = bin(mulOp);
/** a / b (broadcasting; integer division truncates). */
export const div = bin(divOp);
/** a ** b (broadcasting, floating point). */
export const pow = bin(powOp);
/** Elementwise maximum. */
export const maximum = bin(maxOp);
/** Elementwise minimum. */
export const minimum = bin(minOp);
/** a == b → bool. */
export const equal = bin(equalOp);
/** a < b → bool. */
export const less = bin(lessOp);
/** a <= b → bool. */
export const lessOrEqual = bin(lessOrEqualOp);
/** a > b → bool. */
export const greater = bin(greaterOp);
/** a >= b → bool. */
export const greaterOrEqual = bin(greaterOrEqualOp);
/** Logical and of bool tensors. */
export const and = bin(andOp);
/** Logical or of bool tensors. */
export const or = bin(orOp);
/** Logical xor of bool tensors. */
export const xor = bin(xorOp);
/** Logical not. */
export const not = un(notOp);
/** −x. */
export const neg = un(negOp);
/** eˣ. */
export const exp = un(expOp);
/** Natural log. */
export const log = un(logOp);
/** √x. */
export const sqrt = un(sqrtOp);
/** 1/x. */
export const reciprocal = un(reciprocalOp);
/** tanh x. */
export const tanh = un(tanhOp);
/** 1/(1+e⁻ˣ). */
export const sigmoid = un(sigmoidOp);
/** Gauss error function. */
export const erf = un(erfOp);
/** sin x. */
export const sin = un(sinOp);
/** cos x. */
export const cos = un(cosOp);
/** |x|. */
export const abs = un(absOp);
/** max(x, 0). */
export const relu = un(reluOp);
/** Sign of x (−1, 0, 1); no gradient. */
export const sign = un(signOp);
/** ⌊x⌋; no gradient. */
export const floor = un(floorOp);
/** ⌈x⌉; no gradient. */
export const ceil = un(ceilOp);
/** Round half to even; no gradient. */
export const round = un(roundOp);
/** Whether each element is NaN. */
export const isNaN = un(isNaNOp);
/** Whether each element is ±inf. */
export const isInf = un(isInfOp);
/** The tensor itself, as a new value. */
export const identity = un(identityOp);
/** The tensor itself, with gradients stopped. */
export const stopGradient = un(stopGradientOp);

/** Integer remainder (sign of the divisor, like Python's %). */
export function mod(a: TensorLike, b: TensorLike): Tensor {
  const [x, y] = pair(a, b);
  if (!isInteger(x.dtype)) throw new Error(`mod expects integer tensors, got ${x.dtype}`);
  return applyOp(modOp, [x, y], { fmod: 0 })[0];
}

/** cond ? a : b, elementwise with broadcasting. */
export function where(cond: Tensor, a: TensorLike, b: TensorLike): Tensor {
  const [x, y] = pair(a, b);
  return applyOp(whereOp, [cond, x, y], {})[0];
}

/** Converts to another dtype (float → int truncates toward zero). */
export function cast(x: Tensor, to: DType): Tensor {
  if (x.dtype === to) return x;
  return applyOp(castOp, [x], { to })[0];
}

/** Zeros with x's shape and dtype (computed from x's shape, not from its values). */
export function zerosLike(x: Tensor): Tensor {
  return constantOfShapeLike(x, 0);
}

/** Ones with x's shape and dtype. */
export function onesLike(x: Tensor): Tensor {
  return constantOfShapeLike(x, 1);
}

import { expand } from './shape-ops';

function constantOfShapeLike(x: Tensor, value: number): Tensor {
  const s = scalarLike(value, x);
  if (x.rank === 0) return s;
  return expand(s, x.shape, x);
}

setCoreOps({ identity: identityOp as OpDef<object>, cast: castOp as OpDef<object>, mul: mulOp, shape: shapeOp as OpDef<object>, concat: concatOp as OpDef<object> });

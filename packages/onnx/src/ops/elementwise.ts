/**
 * Elementwise primitives: NumPy-broadcasting binary ops, unary math, comparisons, logic, Where,
 * Cast and Identity. Each op's shape rule and gradient rule sit together. Mul, Cast and Identity
 * are defined in core.ts (constants and run-time dims are built with them) and re-exported here.
 */
import { isInteger } from '../dtype';
import { broadcastShapes, formatShape } from '../dim';
import { applyOp, type Tensor, type TensorLike } from '../graph';
import { attr, defineOp, type OpDef } from '../op';
import { binaryFn, binaryGrads, expand, identityOp, mul, pair, scalarLike, unaryFn, unbroadcast } from './core';
import { binary, broadcastRule, unary } from './helpers';

export { cast, castOp, identityOp, mul, mulOp, scalarLike } from './core';

const one = (x: Tensor): Tensor => scalarLike(1, x);

export const addOp = binary('Add', ({ inputs, dy: [g] }) => binaryGrads(inputs, () => g, () => g));
export const subOp = binary('Sub', ({ inputs, dy: [g] }) => binaryGrads(inputs, () => g, () => neg(g!)));
export const divOp = binary('Div', ({ inputs: [a, b], outputs: [y], dy: [g] }) =>
  binaryGrads([a, b], () => div(g!, b!), () => neg(div(mul(g!, y), b!))),
);
export const powOp = binary(
  'Pow',
  ({ inputs: [a, b], outputs: [y], dy: [g] }) =>
    binaryGrads(
      [a, b],
      () => mul(g!, mul(b!, pow(a!, sub(b!, one(b!))))),
      () => mul(g!, mul(y, log(a!))),
    ),
  { floatOnly: true },
);
export const maxOp = binary('Max', ({ inputs: [a, b], dy: [g] }) => {
  const aWins = greaterOrEqual(a!, b!);
  return binaryGrads([a, b], () => where(aWins, g!, zerosLike(g!)), () => where(aWins, zerosLike(g!), g!));
});
export const minOp = binary('Min', ({ inputs: [a, b], dy: [g] }) => {
  const aWins = lessOrEqual(a!, b!);
  return binaryGrads([a, b], () => where(aWins, g!, zerosLike(g!)), () => where(aWins, zerosLike(g!), g!));
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

/** Identity whose output is treated as a constant by autodiff. */
export const stopGradientOp = defineOp({
  name: 'StopGradient',
  onnxOp: 'Identity',
  infer: ([x]) => [{ dtype: x!.dtype, shape: x!.shape }],
  grad: 'none',
});

// ---- functional API --------------------------------------------------------------------------

/** a + b (broadcasting). */
export const add = binaryFn(addOp);
/** a − b (broadcasting). */
export const sub = binaryFn(subOp);
/** a / b (broadcasting; integer division truncates). */
export const div = binaryFn(divOp);
/** a ** b (broadcasting, floating point). */
export const pow = binaryFn(powOp);
/** Elementwise maximum. */
export const maximum = binaryFn(maxOp);
/** Elementwise minimum. */
export const minimum = binaryFn(minOp);
/** a == b → bool. */
export const equal = binaryFn(equalOp);
/** a < b → bool. */
export const less = binaryFn(lessOp);
/** a <= b → bool. */
export const lessOrEqual = binaryFn(lessOrEqualOp);
/** a > b → bool. */
export const greater = binaryFn(greaterOp);
/** a >= b → bool. */
export const greaterOrEqual = binaryFn(greaterOrEqualOp);
/** Logical and of bool tensors. */
export const and = binaryFn(andOp);
/** Logical or of bool tensors. */
export const or = binaryFn(orOp);
/** Logical xor of bool tensors. */
export const xor = binaryFn(xorOp);
/** Logical not. */
export const not = unaryFn(notOp);
/** −x. */
export const neg = unaryFn(negOp);
/** eˣ. */
export const exp = unaryFn(expOp);
/** Natural log. */
export const log = unaryFn(logOp);
/** √x. */
export const sqrt = unaryFn(sqrtOp);
/** 1/x. */
export const reciprocal = unaryFn(reciprocalOp);
/** tanh x. */
export const tanh = unaryFn(tanhOp);
/** 1/(1+e⁻ˣ). */
export const sigmoid = unaryFn(sigmoidOp);
/** Gauss error function. */
export const erf = unaryFn(erfOp);
/** sin x. */
export const sin = unaryFn(sinOp);
/** cos x. */
export const cos = unaryFn(cosOp);
/** |x|. */
export const abs = unaryFn(absOp);
/** max(x, 0). */
export const relu = unaryFn(reluOp);
/** Sign of x (−1, 0, 1); no gradient. */
export const sign = unaryFn(signOp);
/** ⌊x⌋; no gradient. */
export const floor = unaryFn(floorOp);
/** ⌈x⌉; no gradient. */
export const ceil = unaryFn(ceilOp);
/** Round half to even; no gradient. */
export const round = unaryFn(roundOp);
/** Whether each element is NaN. */
export const isNaN = unaryFn(isNaNOp);
/** Whether each element is ±inf. */
export const isInf = unaryFn(isInfOp);
/** The tensor itself, as a new value. */
export const identity = unaryFn(identityOp);
/** The tensor itself, with gradients stopped. */
export const stopGradient = unaryFn(stopGradientOp);

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

/** Zeros with x's shape and dtype (computed from x's shape, not from its values). */
export function zerosLike(x: Tensor): Tensor {
  return constantOfShapeLike(x, 0);
}

/** Ones with x's shape and dtype. */
export function onesLike(x: Tensor): Tensor {
  return constantOfShapeLike(x, 1);
}

function constantOfShapeLike(x: Tensor, value: number): Tensor {
  const s = scalarLike(value, x);
  if (x.rank === 0) return s;
  return expand(s, x.shape, x);
}

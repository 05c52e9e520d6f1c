/**
 * The op registry: `defineOp` registers each primitive's `OpDef` (its ONNX form, shape/dtype rule
 * and gradient rule side by side; the type is in graph.ts, since Tensor, Node and OpDef refer to
 * each other), so autodiff, the serializer and the tests can enumerate every op (a test fails when
 * a differentiable op lacks a gradient check).
 */
import type { AttrValue, OpDef } from './graph';

export type { AttrValue, GradContext, OpDef, TensorType } from './graph';

const registry = new Map<string, OpDef<never>>();

/** Defines and registers a primitive op. */
export function defineOp<A = object>(def: OpDef<A>): OpDef<A> {
  if (registry.has(def.name)) throw new Error(`op '${def.name}' is defined twice`);
  registry.set(def.name, def as unknown as OpDef<never>);
  return def;
}

/** Every registered primitive op. */
export function registeredOps(): OpDef<never>[] {
  return [...registry.values()];
}

/** Attribute helpers. */
export const attr = {
  int: (value: number): AttrValue => ({ kind: 'int', value }),
  float: (value: number): AttrValue => ({ kind: 'float', value }),
  string: (value: string): AttrValue => ({ kind: 'string', value }),
  ints: (value: number[]): AttrValue => ({ kind: 'ints', value }),
  floats: (value: number[]): AttrValue => ({ kind: 'floats', value }),
};

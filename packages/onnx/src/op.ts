/**
 * Op definitions: each primitive has one `OpDef` holding its ONNX form, its shape/dtype rule and
 * its gradient rule side by side. The registry lets autodiff, the serializer and the tests
 * enumerate every op (a test fails when a differentiable op lacks a gradient check).
 */
import type { DType } from './dtype';
import type { Dim } from './dim';
import type { Graph, Tensor } from './graph';

/** Static type of a value: what shape inference works on. */
export interface TensorType {
  dtype: DType;
  shape: Dim[];
}

/** An ONNX attribute value, tagged with its ONNX attribute type. */
export type AttrValue =
  | { kind: 'int'; value: number }
  | { kind: 'float'; value: number }
  | { kind: 'string'; value: string }
  | { kind: 'ints'; value: number[] }
  | { kind: 'floats'; value: number[] }
  | { kind: 'tensor'; dtype: DType; shape: number[]; data: ArrayLike<number | bigint> }
  | { kind: 'graph'; value: Graph };

/** What a gradient rule receives. */
export interface GradContext<A> {
  /** The node's inputs (null for omitted optional inputs). */
  inputs: (Tensor | null)[];
  /** The node's outputs. */
  outputs: Tensor[];
  /** The op's attributes, as the DSL gave them. */
  attrs: A;
  /** Gradient of the loss w.r.t. each output (null where the loss does not depend on it). */
  dy: (Tensor | null)[];
}

/**
 * A primitive op. `infer` throws (with a message naming what was expected) on bad input; the graph
 * adds the op name, the input shapes and the caller's source line.
 */
export interface OpDef<A = object> {
  /** Name used in errors and the registry (the ONNX op type unless `onnxOp` says otherwise). */
  name: string;
  /** ONNX op type emitted (defaults to `name`). */
  onnxOp?: string;
  /** ONNX domain ('' = ai.onnx, 'com.microsoft' for contrib ops). */
  domain?: string;
  /** Shape and dtype rule: the types of the outputs. */
  infer(inputs: (TensorType | null)[], attrs: A): TensorType[];
  /** ONNX attributes of the emitted node (default: none). */
  onnxAttrs?(attrs: A): Record<string, AttrValue>;
  /**
   * Gradient rule: d(loss)/d(input) for each input, or null for inputs without a gradient.
   * `'none'` marks ops whose outputs are piecewise constant or integral (comparisons, argmax,
   * sampling): gradients stop there. An op with no `grad` at all is not differentiable yet:
   * asking autodiff to go through it is an error.
   */
  grad?: ((ctx: GradContext<A>) => (Tensor | null)[]) | 'none';
  /** Indices of inputs that are never differentiated (integer indices, shape tensors...). */
  nonDiffInputs?: number[];
}

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

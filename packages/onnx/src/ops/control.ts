/**
 * Control flow: ONNX Loop and If with bodies built by TypeScript callbacks. Bodies may read any
 * value of the enclosing graphs. Not differentiable yet: autodiff rejects paths through them.
 */
import { anonymousDim, dimEquals, formatShape, type Dim } from '../dim';
import type { DType } from '../dtype';
import { applyOp, Graph, GraphError, type Tensor } from '../graph';
import { defineOp } from '../op';
import { constant, output } from './core';

/** Static description of a Loop node. */
export interface LoopAttrs {
  body: Graph;
  carried: { dtype: DType; shape: Dim[] }[];
  scans: { dtype: DType; shape: Dim[] }[];
}

export const loopOp = defineOp<LoopAttrs>({
  name: 'Loop',
  infer: (_inputs, { carried, scans }) => {
    const trips = anonymousDim();
    return [...carried.map((c) => ({ dtype: c.dtype, shape: [...c.shape] })), ...scans.map((s) => ({ dtype: s.dtype, shape: [trips, ...s.shape] }))];
  },
  onnxAttrs: ({ body }) => ({ body: { kind: 'graph', value: body } }),
});

/** Static description of an If node. */
export interface IfAttrs {
  thenBranch: Graph;
  elseBranch: Graph;
  outputs: { dtype: DType; shape: Dim[] }[];
}

export const ifOp = defineOp<IfAttrs>({
  name: 'If',
  infer: (_inputs, { outputs }) => outputs.map((o) => ({ dtype: o.dtype, shape: [...o.shape] })),
  onnxAttrs: ({ thenBranch, elseBranch }) => ({
    then_branch: { kind: 'graph', value: thenBranch },
    else_branch: { kind: 'graph', value: elseBranch },
  }),
});

/** What a loop body returns. */
export interface LoopStep {
  /** Continue? (bool scalar). Omitted: keep going until the trip count. */
  cond?: Tensor;
  /** New values of the loop-carried tensors, in order. */
  carried: Tensor[];
  /** Per-iteration values stacked along a new leading axis. */
  scans?: Tensor[];
}

/** Options of `loop`. */
export interface LoopOptions {
  /** Maximum trip count (int64 scalar tensor or a number); omitted: until `cond` is false. */
  maxTrips?: Tensor | number;
  /** Initial condition (bool scalar); omitted: true. */
  cond?: Tensor;
  /**
   * Shapes of the carried values inside the body when they change across iterations (e.g. a
   * growing sequence); default: the initial values' shapes.
   */
  carriedShapes?: Dim[][];
}

/**
 * An ONNX Loop: runs `body(i, carried)` while i < maxTrips and cond holds. Returns the final
 * carried values followed by the stacked scan outputs.
 */
export function loop(init: Tensor[], body: (i: Tensor, carried: Tensor[]) => LoopStep, opts: LoopOptions = {}): Tensor[] {
  const anchor = init[0] ?? opts.cond ?? (typeof opts.maxTrips === 'object' ? opts.maxTrips : undefined);
  if (!anchor) throw new GraphError('loop needs an initial carried value, a cond or a maxTrips tensor');
  const outer = Graph.active() ?? anchor.graph;
  const g = new Graph(outer.uniqueName('loop_body'), outer);
  const shapes = opts.carriedShapes ?? init.map((t) => t.shape);
  const step = Graph.build(g, () => {
    const i = g.input(g.freshName('iter'), 'int64', []);
    const condIn = g.input(g.freshName('cond_in'), 'bool', []);
    const carriedIn = init.map((t, k) => g.input(g.freshName('carried'), t.dtype, shapes[k]));
    const result = body(i, carriedIn);
    return { result, condIn };
  });
  const { result, condIn } = step;
  if (result.carried.length !== init.length) {
    throw new GraphError(`loop body returned ${result.carried.length} carried values, expected ${init.length}`);
  }
  result.carried.forEach((t, k) => {
    if (t.dtype !== init[k].dtype) throw new GraphError(`loop carried value ${k}: body returns ${t.dtype}, initial is ${init[k].dtype}`);
  });
  Graph.build(g, () => {
    output(g, result.cond ?? condIn);
    for (const t of [...result.carried, ...(result.scans ?? [])]) output(g, t);
  });
  const trips = opts.maxTrips === undefined ? null : typeof opts.maxTrips === 'number' ? constant(anchor.graph, opts.maxTrips, 'int64', []) : opts.maxTrips;
  const carried = result.carried.map((t, k) => ({ dtype: t.dtype, shape: mergeShapes(shapes[k], t.shape) }));
  const scans = (result.scans ?? []).map((t) => ({ dtype: t.dtype, shape: t.shape }));
  return applyOp(loopOp, [trips, opts.cond ?? null, ...init], { body: g, carried, scans }, outer);
}

/** An ONNX If: the outputs of `thenFn` when cond (a bool scalar) is true, else of `elseFn`. */
export function ifElse(cond: Tensor, thenFn: () => Tensor[], elseFn: () => Tensor[]): Tensor[] {
  if (cond.dtype !== 'bool') throw new GraphError(`if: condition must be bool, got ${cond.dtype}`);
  const outer = Graph.active() ?? cond.graph;
  const branch = (fn: () => Tensor[], label: string) => {
    const g = new Graph(outer.uniqueName(label), outer);
    const outs = Graph.build(g, () => fn().map((t) => output(g, t)));
    return { g, outs };
  };
  const a = branch(thenFn, 'then');
  const b = branch(elseFn, 'else');
  if (a.outs.length !== b.outs.length) throw new GraphError(`if: branches return ${a.outs.length} and ${b.outs.length} values`);
  const outputs = a.outs.map((t, k) => {
    if (t.dtype !== b.outs[k].dtype) throw new GraphError(`if: output ${k} is ${t.dtype} in one branch, ${b.outs[k].dtype} in the other`);
    return { dtype: t.dtype, shape: mergeShapes(t.shape, b.outs[k].shape) };
  });
  return applyOp(ifOp, [cond], { thenBranch: a.g, elseBranch: b.g, outputs }, outer);
}

function mergeShapes(a: Dim[], b: Dim[]): Dim[] {
  if (a.length !== b.length) throw new GraphError(`shapes ${formatShape(a)} and ${formatShape(b)} differ in rank`);
  return a.map((d, i) => (dimEquals(d, b[i]) ? d : anonymousDim()));
}


/**
 * Reverse-mode automatic differentiation over a graph: `grad(loss, wrt)` appends the backward
 * nodes to the same graph, using each op's gradient rule (see op.ts).
 */
import { dimEquals, formatShape, isAnonymousDim } from './dim';
import { isFloat } from './dtype';
import { GraphError, type Node, type Tensor } from './graph';
import { add, onesLike, zerosLike } from './ops/elementwise';

/** Options of `grad`. */
export interface GradOptions {
  /** Gradient of the final result w.r.t. `loss` (default: ones; required when loss is not a scalar). */
  seed?: Tensor;
  /** What to return for a `wrt` tensor the loss does not depend on (default: zeros). */
  unused?: 'zeros' | 'error';
}

/**
 * d(loss)/d(x) for each x in `wrt`, as new tensors of the same graph. Gradients of tensors used in
 * several places are summed; broadcasting is undone by each rule. Ops without a gradient rule (Loop,
 * If) make `grad` throw when they lie on a path from `wrt` to `loss`.
 */
export function grad(loss: Tensor, wrt: Tensor[], opts: GradOptions = {}): Tensor[] {
  const graph = loss.graph;
  if (graph.parent) throw new GraphError('grad: differentiating inside a Loop/If body is not supported');
  if (!isFloat(loss.dtype)) throw new GraphError(`grad: loss must be floating point, got ${loss.dtype}`);
  const isScalar = loss.shape.every((d) => d === 1);
  if (!isScalar && !opts.seed) throw new GraphError(`grad: loss has shape ${formatShape(loss.shape)}; reduce it to a scalar or pass a seed`);
  for (const x of wrt) {
    if (!isFloat(x.dtype)) throw new GraphError(`grad: cannot differentiate w.r.t. ${x.name} of dtype ${x.dtype}`);
    if (x.graph !== graph) throw new GraphError(`grad: ${x.name} is not in the loss's graph`);
  }

  // Forward: values that depend on some wrt. Backward: the nodes between them and the loss.
  const dependsOnWrt = new Set<Tensor>(wrt);
  for (const node of graph.nodes) {
    if (node.inputs.some((t) => t && dependsOnWrt.has(t))) for (const o of node.outputs) dependsOnWrt.add(o);
  }
  const feedsLoss = new Set<Tensor>([loss]);
  const path: Node[] = [];
  for (let k = graph.nodes.length - 1; k >= 0; k--) {
    const node = graph.nodes[k];
    if (!node.outputs.some((o) => feedsLoss.has(o))) continue;
    if (!node.inputs.some((t) => t && dependsOnWrt.has(t))) continue;
    path.push(node);
    for (const t of node.inputs) if (t) feedsLoss.add(t);
  }

  const grads = new Map<Tensor, Tensor>();
  const accumulate = (t: Tensor, g: Tensor) => {
    const prev = grads.get(t);
    grads.set(t, prev ? add(prev, g) : g);
  };
  return graph.scope('grad', () => {
    accumulate(loss, opts.seed ?? onesLike(loss));
    for (const node of path) {
      const dy = node.outputs.map((o) => grads.get(o) ?? null);
      if (dy.every((g) => g === null)) continue;
      const rule = node.op.grad;
      if (rule === 'none') continue;
      if (rule === undefined) {
        throw new GraphError(`grad: ${node.op.name} (node ${node.name}) has no gradient rule; it lies between the loss and a differentiated input`);
      }
      const dx = rule({ inputs: node.inputs, outputs: node.outputs, attrs: node.attrs, dy });
      node.inputs.forEach((x, i) => {
        const g = dx[i];
        if (!x || !g || !dependsOnWrt.has(x) || !isFloat(x.dtype) || node.op.nonDiffInputs?.includes(i)) return;
        checkGradShape(node, x, g);
        accumulate(x, g);
      });
    }
    return wrt.map((x) => {
      const g = grads.get(x);
      if (g) return g;
      if (opts.unused === 'error') throw new GraphError(`grad: the loss does not depend on ${x.name}`);
      return zerosLike(x);
    });
  });
}

/** A gradient must have its input's shape (a wrong one is a bug in a gradient rule). */
function checkGradShape(node: Node, x: Tensor, g: Tensor): void {
  const ok = g.rank === x.rank && g.shape.every((d, i) => dimEquals(d, x.shape[i]) || isAnonymousDim(d) || isAnonymousDim(x.shape[i]));
  if (!ok || g.dtype !== x.dtype) {
    throw new GraphError(`grad: the ${node.op.name} rule gave ${g} for input ${x} (node ${node.name})`);
  }
}

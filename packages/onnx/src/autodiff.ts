/**
 * Reverse-mode automatic differentiation over a graph: `grad(loss, wrt)` appends the backward
 * nodes to the same graph, using each op's gradient rule (see op.ts). `checkpoint` marks a region
 * whose activations the backward pass recomputes instead of keeping; `customGradient` a region
 * differentiated by one rule of its own instead of its nodes' rules.
 */
import { dimEquals, formatShape, isAnonymousDim } from './dim';
import { isFloat } from './dtype';
import { applyOp, GraphError, type Node, type Tensor } from './graph';
import { add, cast, mul, onesLike, zerosLike } from './ops/elementwise';
import { reshape, slice } from './ops/shape-ops';
import { scatterAddOf } from './sparse-grad';

/** A recomputation region: the nodes `fn` built, and the inputs it recomputes from. */
interface Region {
  nodes: Node[];
  inputs: Set<Tensor>;
}

const regionOf = new WeakMap<Node, Region>();

/**
 * Activation recomputation (gradient checkpointing). Runs `fn` now; when `grad` later reaches the
 * nodes `fn` built, it rebuilds the ones that depend on `inputs` from those inputs and
 * differentiates the copies, so the forward pass's intermediate values are no longer needed by the
 * backward pass and ONNX Runtime frees them after their last forward use. Memory for the region
 * falls to its inputs plus one region's activations at a time; the price is running the region's
 * forward twice. Nodes of the region that do not depend on `inputs` (weight casts, transposes)
 * are not copied: the backward pass reads the originals.
 *
 * The copies must not run before the backward pass reaches the region, or they would be alive
 * as long as the originals: their inputs are made to depend on the region's output gradients by
 * adding zero derived from one element of one of them (ONNX has no control edges; ORT orders
 * nodes by data dependencies only). A NaN or infinite gradient there turns the recomputed values
 * non-finite too, which the update's non-finite check reports as it would the gradient itself.
 * Nested regions count as the outermost one.
 */
export function checkpoint<T>(inputs: Tensor[], fn: () => T): T {
  if (inputs.length === 0) throw new GraphError('checkpoint: give the tensors the region is recomputed from');
  const graph = inputs[0].graph;
  const start = graph.nodes.length;
  const result = fn();
  const region: Region = { nodes: graph.nodes.slice(start), inputs: new Set(inputs) };
  for (const n of region.nodes) regionOf.set(n, region);
  return result;
}

/**
 * Copies of a region's nodes that depend on its inputs, gated on `late` (a gradient the backward
 * pass computes just before it needs the region). Returns original → copy for every copied value.
 */
function recomputeRegion(region: Region, late: Tensor): Map<Tensor, Tensor> {
  const copies = new Map<Tensor, Tensor>();
  const corner = late.rank === 0 ? late : slice(late, [...Array(late.rank).keys()], Array(late.rank).fill(0), Array(late.rank).fill(1));
  const zero = mul(reshape(corner, []), 0);
  for (const x of region.inputs) if (isFloat(x.dtype)) copies.set(x, add(x, cast(zero, x.dtype)));
  for (const node of region.nodes) {
    if (!node.inputs.some((t) => t && copies.has(t))) continue;
    const outs = applyOp(node.op, node.inputs.map((t) => (t && copies.get(t)) ?? t), node.attrs, node.outputs[0].graph);
    node.outputs.forEach((o, i) => copies.set(o, outs[i]));
  }
  return copies;
}

/** What a {@link customGradient} rule is given: the region's inputs, output, saved values and dy. */
export interface CustomGradientContext {
  inputs: Tensor[];
  output: Tensor;
  /** The region values the rule reads, as `fn` declared them (recomputed copies inside a checkpoint). */
  saved: Tensor[];
  /** d(loss)/d(output). */
  dy: Tensor;
}

/** A region with a rule of its own: its nodes, inputs, the one value leaving it, and the rule. */
interface CustomRegion {
  nodes: Set<Node>;
  inputs: Tensor[];
  output: Tensor;
  saved: Tensor[];
  rule: (ctx: CustomGradientContext) => (Tensor | null)[];
}

const customOf = new WeakMap<Node, CustomRegion>();

/**
 * A region whose backward pass is `rule` rather than the rules of the nodes `fn` builds (JAX's
 * custom_vjp): for a composite whose gradient is cheaper written whole than chained through its
 * parts. `fn` returns the one value leaving the region and the values `rule` reads; `rule` returns
 * d(loss)/d(input) per input (null: none). No other value built inside may be used outside the
 * region on a path to the loss (`grad` refuses it, since its gradient would be lost).
 */
export function customGradient(inputs: Tensor[], fn: () => { output: Tensor; saved?: Tensor[] }, rule: (ctx: CustomGradientContext) => (Tensor | null)[]): Tensor {
  if (inputs.length === 0) throw new GraphError('customGradient: give the tensors the region is differentiated with respect to');
  const graph = inputs[0].graph;
  const start = graph.nodes.length;
  const { output, saved = [] } = fn();
  const nodes = graph.nodes.slice(start);
  if (!nodes.some((n) => n.outputs.includes(output))) throw new GraphError('customGradient: the output must be built inside the region');
  const region: CustomRegion = { nodes: new Set(nodes), inputs, output, saved, rule };
  for (const n of nodes) customOf.set(n, region);
  return output;
}

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
  // a gather's gradient (rows scatter-added into zeros) is added into the other contribution instead
  const accumulate = (t: Tensor, g: Tensor) => {
    const prev = grads.get(t);
    grads.set(t, !prev ? g : (scatterAddOf(g)?.into(prev) ?? scatterAddOf(prev)?.into(g) ?? add(prev, g)));
  };
  // Recomputed copies per checkpoint region, made when the backward pass first reaches it: by then
  // every consumer outside the region has been differentiated (regions are contiguous in node
  // order), so the gradients of its outputs are complete.
  // Copies no rule reads are left for serialization, which emits only live nodes.
  const recomputed = new Map<Region, Map<Tensor, Tensor>>();
  const copiesFor = (node: Node): Map<Tensor, Tensor> | undefined => {
    const region = regionOf.get(node);
    if (!region) return undefined;
    let copies = recomputed.get(region);
    if (!copies) {
      const late = region.nodes.flatMap((n) => n.outputs).map((o) => grads.get(o)).find((g) => g !== undefined)!;
      copies = graph.scope('recompute', () => recomputeRegion(region, late));
      recomputed.set(region, copies);
    }
    return copies;
  };
  // A custom region's rule runs when the backward pass reaches the node making its output (every
  // consumer of the output comes later in node order, so its gradient is complete); the region's
  // other nodes are skipped, and must have no gradient of their own from outside.
  const applyCustom = (node: Node, custom: CustomRegion) => {
    if (!node.outputs.includes(custom.output)) {
      const leaked = node.outputs.find((o) => grads.has(o));
      if (leaked) throw new GraphError(`grad: ${leaked.name}, built inside a customGradient region, is used outside it on a path to the loss`);
      return;
    }
    const dy = grads.get(custom.output);
    if (!dy) return;
    const copies = copiesFor(node);
    const pick = (t: Tensor) => (copies && copies.get(t)) ?? t;
    const dx = graph.scope(node.name, () => custom.rule({ inputs: custom.inputs.map(pick), output: pick(custom.output), saved: custom.saved.map(pick), dy }));
    custom.inputs.forEach((x, i) => {
      const g = dx[i];
      if (!g || !dependsOnWrt.has(x) || !isFloat(x.dtype)) return;
      checkGradShape(node, x, g);
      accumulate(x, g);
    });
  };
  return graph.scope('grad', () => {
    accumulate(loss, opts.seed ?? onesLike(loss));
    for (const node of path) {
      const custom = customOf.get(node);
      if (custom) {
        applyCustom(node, custom);
        continue;
      }
      const dy = node.outputs.map((o) => grads.get(o) ?? null);
      if (dy.every((g) => g === null)) continue;
      const rule = node.op.grad;
      if (rule === 'none') continue;
      if (rule === undefined) {
        throw new GraphError(`grad: ${node.op.name} (node ${node.name}) has no gradient rule; it lies between the loss and a differentiated input`);
      }
      // In a checkpoint region the rule reads the recomputed values; gradients stay keyed by the
      // original tensors.
      const copies = copiesFor(node);
      const inputs = copies ? node.inputs.map((t) => (t && copies.get(t)) ?? t) : node.inputs;
      const outputs = copies ? node.outputs.map((t) => copies.get(t) ?? t) : node.outputs;
      // Named after the forward node (grad/layer3/attn/MatMul_7/…): profiles attribute backward
      // time to the forward op it differentiates.
      const dx = graph.scope(node.name, () => rule({ inputs, outputs, attrs: node.attrs, dy }));
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

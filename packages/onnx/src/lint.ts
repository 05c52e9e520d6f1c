/** Static checks on built graphs. */
import type { Graph, Node, Tensor } from './graph';

/**
 * Nodes that do arithmetic on run-time shapes: int64 results computed from Shape outputs (and
 * constants). ONNX Runtime runs such nodes on the CPU, with device synchronisation around them, and
 * refuses the session when CPU fallback is disabled. A Shape output used directly as the shape
 * input of Expand/Reshape is fine — unless the Shape reads a Transpose's output: ORT's transpose
 * optimizer rewrites Shape(Transpose(x)) into a Gather over Shape(x), which it also runs on the CPU,
 * so such Shape nodes are listed too. Graphs meant for the GPU should have none; `reshape`, `expand`
 * and `causalMask` avoid them where they can.
 */
export function runtimeShapeNodes(graph: Graph): Node[] {
  const fromShape = new Set<Tensor>();
  const constant = new Set<Tensor>([...graph.initializers.values()].map((i) => i.tensor));
  const found: Node[] = [];
  for (const node of graph.nodes) {
    if (node.op.name === 'Shape') {
      node.outputs.forEach((o) => fromShape.add(o));
      if (node.inputs[0]?.node?.op.name === 'Transpose') found.push(node);
      continue;
    }
    const ins = node.inputs.filter((t): t is Tensor => t !== null);
    const onShapes = ins.some((t) => fromShape.has(t)) && ins.every((t) => fromShape.has(t) || constant.has(t));
    if (onShapes && node.outputs.every((o) => o.dtype === 'int64')) {
      found.push(node);
      node.outputs.forEach((o) => fromShape.add(o));
    } else if (ins.length > 0 && ins.every((t) => constant.has(t))) {
      node.outputs.forEach((o) => constant.add(o)); // folded by ORT at load time
    }
  }
  return found;
}

/** Static checks on built graphs. */
import { cpuPlacedNodes, NO_CUDA_KERNEL } from './cpu-placement';
import type { Graph, Node, Tensor } from './graph';
import { toModelProto } from './serialize';

export { NO_CUDA_KERNEL };

/**
 * Nodes that do arithmetic on run-time shapes, which ONNX Runtime runs on the CPU, with device
 * synchronisation around them, refusing the session when CPU fallback is disabled: the nodes of the
 * graph's ONNX model that {@link cpuPlacedNodes} places there as shape computations (fed only by
 * Shape outputs, graph inputs and small initializers) or as a Shape of a Transpose (which ORT
 * rewrites into a Gather over Shape(x)). A Shape of static dims is folded, and a Shape output used
 * directly as the shape input of Expand/Reshape stays on the device. Graphs meant for the GPU
 * should have none; `reshape`, `expand` and `causalMask` avoid them where they can.
 */
export function runtimeShapeNodes(graph: Graph): Node[] {
  const byName = new Map(graph.nodes.map((n) => [n.name, n]));
  return cpuPlacedNodes(toModelProto(graph))
    .filter((p) => p.subgraph.length === 0 && (p.reason === 'shape computation' || p.reason === 'Shape of a Transpose'))
    .map((p) => byName.get(p.name)!);
}

/** Nodes that ONNX Runtime's CUDA provider cannot run (see NO_CUDA_KERNEL): graphs meant for the GPU should have none. */
export function noCudaKernelNodes(graph: Graph): Node[] {
  return graph.nodes.filter((n) => {
    const gap = NO_CUDA_KERNEL[n.op.name];
    const dtype = n.outputs[0]?.dtype;
    return gap !== undefined && (gap === 'any' || (dtype !== undefined && gap.includes(dtype)));
  });
}

/**
 * Concat and Split nodes whose CUDA kernels build tables on the host and copy them to the device on
 * every run: more than 32 parts, or parts whose sizes along the axis differ or are not static
 * (ONNX Runtime passes up to 32 equal parts' addresses in the kernel's arguments instead). The
 * tables cost host time in proportion to the axis length, and CUDA-graph replay repeats the copy
 * from host memory ORT freed after capture, so a replayed kernel can read stale addresses. Graphs
 * captured as CUDA graphs should have none.
 */
export function hostTableNodes(graph: Graph): Node[] {
  return graph.nodes.filter((n) => {
    if (n.op.name !== 'Concat' && n.op.name !== 'Split') return false;
    const parts = n.op.name === 'Concat' ? n.inputs.filter((t): t is Tensor => t !== null) : n.outputs;
    const { axis } = n.attrs as { axis: number };
    const sizes = parts.map((t) => t.shape[axis]);
    return parts.length > 32 || sizes.some((d) => typeof d !== 'number' || d !== sizes[0]);
  });
}

/** Static checks on built graphs. */
import type { Graph, Node, Tensor } from './graph';

/** Whether t is a Transpose's output, directly or through Slice/Reshape/Unsqueeze/Squeeze (ORT folds Shape through them). */
function readsTranspose(t: Tensor | null | undefined): boolean {
  for (let n = t?.node; n; n = n.inputs[0]?.node) {
    if (n.op.name === 'Transpose') return true;
    if (!['Slice', 'Reshape', 'Unsqueeze', 'Squeeze'].includes(n.op.name)) return false;
  }
  return false;
}

/**
 * Nodes that do arithmetic on run-time shapes: int64 results computed from Shape outputs (and
 * constants). ONNX Runtime runs such nodes on the CPU, with device synchronisation around them, and
 * refuses the session when CPU fallback is disabled. A Shape output used directly as the shape
 * input of Expand/Reshape is fine — unless the Shape reads a Transpose's output, directly or through
 * Slice/Reshape/Unsqueeze/Squeeze: ORT rewrites Shape(Transpose(x)) into a Gather over Shape(x),
 * which it runs on the CPU (seen on the H100 for Shape(Slice(Transpose(x))) too), so such Shape
 * nodes are listed too. Graphs meant for the GPU should have none; `reshape`, `expand`
 * and `causalMask` avoid them where they can.
 */
export function runtimeShapeNodes(graph: Graph): Node[] {
  const fromShape = new Set<Tensor>();
  const constant = new Set<Tensor>([...graph.initializers.values()].map((i) => i.tensor));
  const found: Node[] = [];
  for (const node of graph.nodes) {
    if (node.op.name === 'Shape') {
      node.outputs.forEach((o) => fromShape.add(o));
      if (readsTranspose(node.inputs[0])) found.push(node);
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

/**
 * (op, dtype) pairs ONNX Runtime 1.29's CUDA provider has no kernel for: a session with CPU
 * fallback off refuses a graph holding one, and with fallback on the node runs on the CPU with
 * copies around it. Keyed by the node's first output dtype. Found on the H100:
 * - Pad, bfloat16: the KV prefill extends caches by a Slice of a zero buffer instead.
 * - ReduceMax, bfloat16: maxima over logits run in float32.
 * - Reciprocal, bfloat16: `rsqrt` divides instead.
 * - Multinomial (any dtype): GPU sampling draws by inverse CDF from host-made uniforms.
 * From the provider's kernel registrations (not yet seen failing on the H100):
 * - MaxPool, bfloat16 (`windowMax`, `lastAxisMax`): registered for float32, float64, float16 and
 *   8-bit integers only; the loss takes its maxima over float32 logits.
 */
export const NO_CUDA_KERNEL: Readonly<Record<string, readonly string[] | 'any'>> = {
  Pad: ['bfloat16'],
  ReduceMax: ['bfloat16'],
  Reciprocal: ['bfloat16'],
  Multinomial: 'any',
  MaxPool: ['bfloat16'],
};

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

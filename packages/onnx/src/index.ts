/**
 * @lathe/onnx — Lathe's graph layer: a tensor DSL that emits ONNX, with build-time shape/dtype
 * inference and reverse-mode autodiff.
 */
import './tensor-methods';

export * from './dim';
export * from './dtype';
export { Graph, GraphError, Tensor, applyOp, type InitializerData, type Node, type TensorLike } from './graph';
export { defineOp, registeredOps, attr, type OpDef, type GradContext, type TensorType, type AttrValue } from './op';
export * from './ops/elementwise';
export * from './ops/reduce';
export * from './ops/shape-ops';
export * from './ops/linalg';
export * from './ops/indexing';
export * from './ops/random';
export * from './ops/control';
export * from './ops/fused';
export * from './nn';
export { checkpoint, customGradient, grad, type CustomGradientContext, type GradOptions } from './autodiff';
export { toModelProto, toModelBytes, liveNodes, OPSET, IR_VERSION, type SerializeOptions } from './serialize';
export * from './proto';
export { hostTableNodes, noCudaKernelNodes, runtimeShapeNodes, NO_CUDA_KERNEL } from './lint';
export { cpuPlacedNodes, describeCpuPlacement, CUDA_CPU_INPUTS, CUDA_CPU_OUTPUTS, SMALL_INITIALIZER_ELEMENTS, type CpuPlacedNode, type CpuPlacementOptions, type CpuPlacementReason } from './cpu-placement';

/**
 * Lathe's own INT4 matmul for generation graphs (`quantizedWeights: 'kernel'`): the W4A16 custom op
 * of @lathe/kernels (`w4a16Ops`), which sits above this package, is passed in through this shape.
 * It reads MatMulNBits' inputs as they are, so only the node changes; projections it cannot take
 * (8 bits, a dtype or block size it lacks, too many or unknown rows) keep MatMulNBits.
 */
import type { DType, Tensor } from '@lathe/onnx';
import type { SessionOptions } from '@lathe/runtime';
import type { NBitsLayout } from './layout';

/** A weight-only matmul over MatMulNBits' inputs (what `w4a16Ops(provider, kernels)` returns). */
export interface NBitsKernel {
  /** x [..., K] · dequant(B)ᵀ → [..., N]. */
  matmul(x: Tensor, b: Tensor, scales: Tensor, zeroPoints: Tensor | undefined, attrs: NBitsLayout['attrs']): Tensor;
  /** The same product as one output per width (consecutive column ranges of N: projections stacked along N). */
  matmulSplit(x: Tensor, b: Tensor, scales: Tensor, zeroPoints: Tensor | undefined, attrs: NBitsLayout['attrs'], widths: readonly number[]): Tensor[];
  /** Why a projection cannot take the kernel with activations in `dtype`, or undefined. */
  unsupported(attrs: NBitsLayout['attrs'], dtype: DType): string | undefined;
  /** Session options the graphs need (the op's custom-op domain). */
  session: Pick<SessionOptions, 'customOpDomains'>;
}

/**
 * Rows the kernel takes at most by default: decode batches up to 64 (split-K kernels to 16 rows, tiled
 * ones past that), the range where the op was at least as fast as MatMulNBits' dequantize + GEMM on the
 * device; larger batches keep MatMulNBits (docs/benchmarks.md, the quantization row).
 */
export const KERNEL_MAX_ROWS = 64;

/**
 * Whether x · Wᵀ goes through `kernel`: a 4-bit projection it supports, with x's rows (the product of
 * its leading dims) known when the graph is built and at most `maxRows` — a decode step's. Rows
 * unknown until run time (prefill's [B, P]) keep MatMulNBits, whose dequantize + GEMM ran those
 * faster than the op's tiled kernels (docs/benchmarks.md, the quantization row).
 */
export function takesKernel(kernel: NBitsKernel, x: Tensor, attrs: NBitsLayout['attrs'], maxRows = KERNEL_MAX_ROWS): boolean {
  const lead = x.shape.slice(0, -1);
  if (!lead.every((d): d is number => typeof d === 'number')) return false;
  const rows = lead.reduce((p, d) => p * d, 1);
  return rows <= maxRows && kernel.unsupported(attrs, x.dtype) === undefined;
}

/** One INT4 projection of a {@link NBitsPipeline}, as its pipeline reads it. */
export interface NBitsPipelineProjection {
  /** The weight's name, or a fused group's ({@link FusedProjection}'s `name`). */
  key: string;
  b: Tensor;
  scales: Tensor;
  zeroPoints?: Tensor;
  attrs: NBitsLayout['attrs'];
  /** Outputs' widths for a fused group; absent: one output. */
  widths?: readonly number[];
}

/**
 * INT4 products of many rows as dequantize + GEMM with each dequantize queued ahead of its product
 * (what `w4a16GemmOps(provider, W4A16Gemm.create(kernels))` of @lathe/kernels returns): projections the
 * kernel does not take (more than `kernelMaxRows` rows, or rows unknown at build) go through it instead
 * of MatMulNBits, in the order the model reads them.
 */
export interface NBitsPipeline {
  /** A pipeline over `projections` for one graph: call it for each in order, `(key, x)` → its outputs (`packed`: a group's as one). */
  pipeline(projections: readonly NBitsPipelineProjection[]): (key: string, x: Tensor, packed?: boolean) => Tensor[];
  /** Why a projection cannot go through it with activations in `dtype`, or undefined. */
  unsupported(attrs: NBitsLayout['attrs'], dtype: DType): string | undefined;
  /** Session options the graphs need (its custom-op domain). */
  session: Pick<SessionOptions, 'customOpDomains'>;
}

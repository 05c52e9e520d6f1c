/**
 * ONNX Runtime's fused weight-only GEMM/GEMV for MatMulNBits on CUDA ("fpA_intB", CUTLASS), and
 * when a projection can take it. The kernel reads B, scales and zero points in a layout it makes
 * in `PrePack`, which ORT calls only for constant initializers: a node whose weights are bound
 * graph inputs fails at its first run when the path is on. The conditions mirror
 * `CheckFpAIntBEligibility` in contrib_ops/cuda/quantization/matmul_nbits.cc (package README).
 */
import type { DType } from '@lathe/onnx';
import type { SessionOptions } from '@lathe/runtime';
import type { NBitsLayout } from './layout';

/** The session config entry that turns the fused path on (it wins over the ORT_FPA_INTB_GEMM environment variable). */
export const FPA_INTB_GEMM_CONFIG = 'ep.cuda.fpa_intb_gemm';

/** The environment variable that turns it on (the only switch of older ORT releases; read when the session builds its kernels). */
export const FPA_INTB_GEMM_ENV = 'ORT_FPA_INTB_GEMM';

/**
 * Session options that ask for the fused path: the config entry, and the environment variable
 * during the session's creation unless the user set it (older releases read only that).
 */
export function fusedGemmSession(): SessionOptions {
  return { config: { [FPA_INTB_GEMM_CONFIG]: '1' }, ...(process.env[FPA_INTB_GEMM_ENV] === undefined ? { env: { [FPA_INTB_GEMM_ENV]: '1' } } : {}) };
}

/**
 * Why a MatMulNBits projection cannot take the fused path on CUDA with activations in `dtype`,
 * or undefined when it can (once its weights are initializers and the path is on).
 */
export function fusedGemmIneligibility(attrs: NBitsLayout['attrs'], dtype: DType): string | undefined {
  const { N, K, bits, blockSize } = attrs;
  if (dtype !== 'float16' && dtype !== 'bfloat16') return `activations are ${dtype} (the fused path takes float16 or bfloat16)`;
  if (bits !== 4 && bits !== 8) return `${bits} bits (4 or 8)`;
  if (![32, 64, 128].includes(blockSize)) return `block size ${blockSize} (32, 64 or 128)`;
  const nAlign = bits === 8 ? 32 : 64;
  if (N % nAlign !== 0) return `N = ${N} is not a multiple of ${nAlign}`;
  if (K % blockSize !== 0) return `K = ${K} is not a multiple of the block size ${blockSize}`;
  return undefined;
}

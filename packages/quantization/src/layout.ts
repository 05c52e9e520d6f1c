/**
 * A quantized matrix as the inputs of its ONNX Runtime kernel: INT4 as stored; INT8 re-laid for
 * MatMulNBits (bits = 8: unsigned with the default zero point 128, the per-channel scale repeated
 * over K-blocks — the same products, so the CUDA kernels for 8 bits apply); NF4 as stored.
 */
import { kBlocks, type QuantizedMatrix } from './matrix';

/** MatMulNBits inputs and attributes. */
export interface NBitsLayout {
  op: 'MatMulNBits';
  /** uint8 [N, kBlocks, blockSize·bits/8]. */
  b: Uint8Array;
  bShape: [number, number, number];
  /** float32 [N, kBlocks]. */
  scales: Float32Array;
  /** uint8 [N, ceil(kBlocks·bits/8)], absent for the default zero point. */
  zeroPoints?: Uint8Array;
  attrs: { K: number; N: number; bits: number; blockSize: number };
}

/** MatMulBnb4 inputs and attributes (NF4). */
export interface Bnb4Layout {
  op: 'MatMulBnb4';
  /** uint8 [ceil(N·K / 2)]. */
  b: Uint8Array;
  /** float32 [ceil(N·K / blockSize)]. */
  absmax: Float32Array;
  attrs: { K: number; N: number; blockSize: number };
}

/** The block size an INT8 matrix is laid out with for MatMulNBits: the largest of 128/64/32/16 dividing K, else 32 (K padded). */
export function int8BlockSize(K: number): number {
  return [128, 64, 32, 16].find((b) => K % b === 0) ?? 32;
}

/** The kernel inputs of `m`. */
export function kernelLayout(m: QuantizedMatrix): NBitsLayout | Bnb4Layout {
  const { rows: N, cols: K } = m;
  if (m.format === 'nf4') return { op: 'MatMulBnb4', b: m.packed, absmax: m.absmax, attrs: { K, N, blockSize: m.blockSize } };
  if (m.format === 'int4') {
    const nb = kBlocks(K, m.blockSize);
    return { op: 'MatMulNBits', b: m.packed, bShape: [N, nb, m.blockSize / 2], scales: m.scales, zeroPoints: m.zeroPoints, attrs: { K, N, bits: 4, blockSize: m.blockSize } };
  }
  const bs = int8BlockSize(K);
  const nb = kBlocks(K, bs);
  const b = new Uint8Array(N * nb * bs).fill(128);
  const scales = new Float32Array(N * nb);
  for (let n = 0; n < N; n++) {
    for (let k = 0; k < K; k++) b[n * nb * bs + k] = m.q[n * K + k] + 128;
    scales.fill(m.scales[n], n * nb, (n + 1) * nb);
  }
  return { op: 'MatMulNBits', b, bShape: [N, nb, bs], scales, attrs: { K, N, bits: 8, blockSize: bs } };
}

/**
 * A quantized weight matrix W [N, K] (a PyTorch Linear's [out, in]) in one of the three formats,
 * each in the layout its ONNX Runtime kernel reads, and the shared operations on it: dequantize
 * back to float32 and count the stored bits.
 */
import { NF4_CODE } from './codes';

/** The weight formats. */
export type QuantFormat = 'int8' | 'int4' | 'nf4';

/** Every format's name, for CLI and config validation. */
export const QUANT_FORMATS: readonly QuantFormat[] = ['int8', 'int4', 'nf4'];

/** INT8 per output channel, symmetric: W[n, k] ≈ q[n, k] · scales[n], q in [−127, 127]. */
export interface Int8Matrix {
  format: 'int8';
  rows: number;
  cols: number;
  /** int8 [N, K] row-major. */
  q: Int8Array;
  /** float32 [N]: absmax / 127. */
  scales: Float32Array;
  /** float32 [N]: each row's max |w| (bitsandbytes' SCB), what the scale is computed from. */
  absmax: Float32Array;
}

/**
 * INT4 per block of `blockSize` along K, in MatMulNBits' layout: `packed` [N, kBlocks, blockSize/2]
 * with element 2j in the low nibble of byte j; W ≈ (q − zp) · scale, zp = 8 when `zeroPoints` is
 * absent (symmetric). A K that does not divide the block is padded with q = zp (a zero weight).
 */
export interface Int4Matrix {
  format: 'int4';
  rows: number;
  cols: number;
  blockSize: number;
  /** uint8 [N, kBlocks, blockSize / 2]. */
  packed: Uint8Array;
  /** float32 [N, kBlocks]. */
  scales: Float32Array;
  /** uint8 [N, ceil(kBlocks / 2)], 4-bit zero points, block 2j in the low nibble; absent: symmetric. */
  zeroPoints?: Uint8Array;
}

/**
 * The NF4 scale of every block after double quantization (bitsandbytes' nested quant state):
 * absmax[b] ≈ DYNAMIC_CODE[codes[b]] · absmax2[⌊b / blockSize⌋] + offset.
 */
export interface NestedAbsmax {
  /** uint8 [numBlocks]: indices into the dynamic code. */
  codes: Uint8Array;
  /** float32 [ceil(numBlocks / blockSize)]. */
  absmax: Float32Array;
  /** The mean of the original absmax values, subtracted before quantizing them. */
  offset: number;
  /** Block size of the second quantization: 256. */
  blockSize: number;
}

/**
 * NF4 in bitsandbytes' (and MatMulBnb4's) layout: W flattened row-major, cut into blocks of
 * `blockSize` (the last may be short), W ≈ NF4_CODE[q] · absmax[block]; two codes per byte, the
 * first in the high nibble. With `nested`, `absmax` is not stored: it is recovered from the nested state.
 */
export interface Nf4Matrix {
  format: 'nf4';
  rows: number;
  cols: number;
  blockSize: number;
  /** uint8 [ceil(N·K / 2)]. */
  packed: Uint8Array;
  /** float32 [ceil(N·K / blockSize)]: each block's max |w| (after double quantization, the dequantized value). */
  absmax: Float32Array;
  nested?: NestedAbsmax;
}

/** A quantized weight matrix. */
export type QuantizedMatrix = Int8Matrix | Int4Matrix | Nf4Matrix;

/** Number of K-blocks of a block-wise matrix. */
export function kBlocks(cols: number, blockSize: number): number {
  return Math.ceil(cols / blockSize);
}

/** Bytes the matrix stores (packed codes, scales, zero points, nested state). */
export function storedBytes(m: QuantizedMatrix): number {
  switch (m.format) {
    case 'int8':
      return m.q.byteLength + m.scales.byteLength;
    case 'int4':
      return m.packed.byteLength + m.scales.byteLength + (m.zeroPoints?.byteLength ?? 0);
    case 'nf4':
      return m.packed.byteLength + (m.nested ? m.nested.codes.byteLength + m.nested.absmax.byteLength + 4 : m.absmax.byteLength);
  }
}

/** Stored bits per weight: 8 × bytes / (N·K). */
export function bitsPerWeight(m: QuantizedMatrix): number {
  return (8 * storedBytes(m)) / (m.rows * m.cols);
}

/** W [N, K] as float32, exactly as the format defines it (each weight one float32 product). */
export function dequantize(m: QuantizedMatrix): Float32Array {
  const { rows: N, cols: K } = m;
  const w = new Float32Array(N * K);
  if (m.format === 'int8') {
    for (let n = 0; n < N; n++) for (let k = 0; k < K; k++) w[n * K + k] = Math.fround(m.q[n * K + k] * m.scales[n]);
    return w;
  }
  if (m.format === 'int4') {
    const nb = kBlocks(K, m.blockSize);
    const rowBytes = (nb * m.blockSize) / 2;
    for (let n = 0; n < N; n++) {
      for (let k = 0; k < K; k++) {
        const byte = m.packed[n * rowBytes + (k >> 1)];
        const q = k & 1 ? byte >> 4 : byte & 15;
        const b = Math.floor(k / m.blockSize);
        w[n * K + k] = Math.fround((q - int4ZeroPoint(m, n, b)) * m.scales[n * nb + b]);
      }
    }
    return w;
  }
  const absmax = m.absmax;
  for (let i = 0; i < N * K; i++) {
    const byte = m.packed[i >> 1];
    const q = i & 1 ? byte & 15 : byte >> 4;
    w[i] = Math.fround(NF4_CODE[q] * absmax[Math.floor(i / m.blockSize)]);
  }
  return w;
}

/** The zero point of block `b` of row `n` (8 when symmetric). */
export function int4ZeroPoint(m: Int4Matrix, n: number, b: number): number {
  if (!m.zeroPoints) return 8;
  const perRow = Math.ceil(kBlocks(m.cols, m.blockSize) / 2);
  const byte = m.zeroPoints[n * perRow + (b >> 1)];
  return b & 1 ? byte >> 4 : byte & 15;
}

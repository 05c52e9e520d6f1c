/**
 * The quantizers, each a direct transcription of its format's definition (formulas in the doc
 * comments). Quotients are computed in float64 from float32 operands and rounded half to even.
 */
import { DYNAMIC_CODE, NF4_THRESHOLDS } from './codes';
import { kBlocks, type Int4Matrix, type Int8Matrix, type NestedAbsmax, type Nf4Matrix } from './matrix';

/** Round half to even (banker's rounding), as numpy and torch round. */
export function roundHalfEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

function clamp(x: number, lo: number, hi: number): number {
  return x < lo ? lo : x > hi ? hi : x;
}

function checkShape(what: string, w: Float32Array, rows: number, cols: number): void {
  if (!Number.isInteger(rows) || !Number.isInteger(cols) || rows < 1 || cols < 1) throw new Error(`${what}: shape [${rows}, ${cols}] must be positive integers`);
  if (w.length !== rows * cols) throw new Error(`${what}: ${w.length} values for a [${rows}, ${cols}] matrix`);
}

/**
 * INT8, per output channel, symmetric: s[n] = max_k |W[n, k]| / 127, q = round(W / s) clamped to
 * [−127, 127] (an all-zero row gets s = 0, q = 0).
 */
export function quantizeInt8(w: Float32Array, rows: number, cols: number): Int8Matrix {
  checkShape('quantizeInt8', w, rows, cols);
  const q = new Int8Array(rows * cols);
  const scales = new Float32Array(rows);
  const absmax = new Float32Array(rows);
  for (let n = 0; n < rows; n++) {
    let amax = 0;
    for (let k = 0; k < cols; k++) amax = Math.max(amax, Math.abs(w[n * cols + k]));
    absmax[n] = amax;
    const s = Math.fround(amax / 127);
    scales[n] = s;
    if (s === 0) continue;
    for (let k = 0; k < cols; k++) q[n * cols + k] = clamp(roundHalfEven(w[n * cols + k] / s), -127, 127);
  }
  return { format: 'int8', rows, cols, q, scales, absmax };
}

/** Block sizes INT4 supports (MatMulNBits' fused CUDA path takes these). */
export const INT4_BLOCK_SIZES: readonly number[] = [32, 64, 128];

/**
 * INT4 per block of K, in MatMulNBits' layout (see {@link Int4Matrix}).
 * Symmetric (llama.cpp's Q4_0, ONNX Runtime's quantizer): m = the block's value of largest |w|,
 * s = m / −8, q = round(w / s) + 8 clamped to [0, 15] — m itself is exactly q = 0.
 * With zero points: lo = min(0, min w), hi = max(0, max w), s = (hi − lo) / 15,
 * zp = round(−lo / s) clamped to [0, 15], q = round(w / s) + zp clamped to [0, 15].
 * K is padded to whole blocks with q = zp; an all-zero block gets s = 0.
 */
export function quantizeInt4(w: Float32Array, rows: number, cols: number, opts: { blockSize?: number; zeroPoints?: boolean } = {}): Int4Matrix {
  checkShape('quantizeInt4', w, rows, cols);
  const bs = opts.blockSize ?? 64;
  if (!INT4_BLOCK_SIZES.includes(bs)) throw new Error(`quantizeInt4: block size ${bs} is not one of ${INT4_BLOCK_SIZES.join(', ')}`);
  const nb = kBlocks(cols, bs);
  const rowBytes = (nb * bs) / 2;
  const packed = new Uint8Array(rows * rowBytes);
  const scales = new Float32Array(rows * nb);
  const zpRow = Math.ceil(nb / 2);
  const zeroPoints = opts.zeroPoints ? new Uint8Array(rows * zpRow) : undefined;
  for (let n = 0; n < rows; n++) {
    for (let b = 0; b < nb; b++) {
      const k0 = b * bs;
      const k1 = Math.min(cols, k0 + bs);
      let s: number;
      let zp = 8;
      if (zeroPoints) {
        let lo = 0;
        let hi = 0;
        for (let k = k0; k < k1; k++) {
          lo = Math.min(lo, w[n * cols + k]);
          hi = Math.max(hi, w[n * cols + k]);
        }
        s = Math.fround((hi - lo) / 15);
        zp = s === 0 ? 8 : clamp(roundHalfEven(-lo / s), 0, 15);
        zeroPoints[n * zpRow + (b >> 1)] |= b & 1 ? zp << 4 : zp;
      } else {
        let m = 0;
        for (let k = k0; k < k1; k++) if (Math.abs(w[n * cols + k]) > Math.abs(m)) m = w[n * cols + k];
        s = Math.fround(m / -8);
      }
      scales[n * nb + b] = s;
      for (let k = k0; k < k0 + bs; k++) {
        const q = k < k1 && s !== 0 ? clamp(roundHalfEven(w[n * cols + k] / s) + zp, 0, 15) : zp;
        packed[n * rowBytes + (k >> 1)] |= k & 1 ? q << 4 : q;
      }
    }
  }
  return { format: 'int4', rows, cols, blockSize: bs, packed, scales, zeroPoints };
}

/**
 * NF4 as bitsandbytes' `quantize_4bit(quant_type='nf4')` computes it: W flattened row-major in
 * blocks of 64, absmax per block, x = w · (1/absmax) in float32, the code whose value is nearest
 * (ties to the lower code, the kernel's thresholds), two codes per byte with the first in the high
 * nibble. `doubleQuant`: the absmax values are then quantized too ({@link doubleQuantize}) and the
 * matrix keeps their dequantized values.
 */
export function quantizeNf4(w: Float32Array, rows: number, cols: number, opts: { blockSize?: number; doubleQuant?: boolean } = {}): Nf4Matrix {
  checkShape('quantizeNf4', w, rows, cols);
  const bs = opts.blockSize ?? 64;
  if (!Number.isInteger(bs) || bs < 2 || bs % 2 !== 0) throw new Error(`quantizeNf4: block size ${bs} must be an even integer`);
  const total = rows * cols;
  const nb = Math.ceil(total / bs);
  const absmax = new Float32Array(nb);
  const packed = new Uint8Array(Math.ceil(total / 2));
  for (let b = 0; b < nb; b++) {
    const i1 = Math.min(total, (b + 1) * bs);
    let amax = 0;
    for (let i = b * bs; i < i1; i++) amax = Math.max(amax, Math.abs(w[i]));
    absmax[b] = amax;
    const r = Math.fround(1 / amax);
    for (let i = b * bs; i < i1; i++) {
      const q = amax === 0 ? 7 : nf4Code(Math.fround(w[i] * r));
      packed[i >> 1] |= i & 1 ? q : q << 4;
    }
  }
  if (!opts.doubleQuant) return { format: 'nf4', rows, cols, blockSize: bs, packed, absmax };
  const nested = doubleQuantize(absmax);
  return { format: 'nf4', rows, cols, blockSize: bs, packed, absmax: nestedAbsmax(nested), nested };
}

/** The NF4 code of a normalized weight: how many thresholds it exceeds. */
function nf4Code(x: number): number {
  let q = 0;
  while (q < 15 && x > NF4_THRESHOLDS[q]) q++;
  return q;
}

/**
 * Double quantization (QLoRA): offset = mean(absmax); c = absmax − offset quantized in blocks of
 * 256 with the signed dynamic code — per block a2 = max |c|, code = the nearest value to c / a2
 * (ties to the lower index). bitsandbytes' `quantize_blockwise` over `absmax − absmax.mean()`.
 */
export function doubleQuantize(absmax: Float32Array, blockSize = 256): NestedAbsmax {
  let sum = 0;
  for (const a of absmax) sum += a;
  const offset = Math.fround(sum / absmax.length);
  const nb = Math.ceil(absmax.length / blockSize);
  const codes = new Uint8Array(absmax.length);
  const absmax2 = new Float32Array(nb);
  for (let b = 0; b < nb; b++) {
    const i1 = Math.min(absmax.length, (b + 1) * blockSize);
    const c = (i: number) => Math.fround(absmax[i] - offset);
    let amax = 0;
    for (let i = b * blockSize; i < i1; i++) amax = Math.max(amax, Math.abs(c(i)));
    absmax2[b] = amax;
    const r = Math.fround(1 / amax);
    for (let i = b * blockSize; i < i1; i++) codes[i] = amax === 0 ? ZERO_INDEX : nearestDynamic(Math.fround(c(i) * r));
  }
  return { codes, absmax: absmax2, offset, blockSize };
}

const ZERO_INDEX = DYNAMIC_CODE.indexOf(0);

/** Index of the dynamic-code value nearest x (binary search, ties to the lower index). */
function nearestDynamic(x: number): number {
  let lo = 0;
  let hi = DYNAMIC_CODE.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (DYNAMIC_CODE[mid] <= x) lo = mid;
    else hi = mid;
  }
  return x - DYNAMIC_CODE[lo] <= DYNAMIC_CODE[hi] - x ? lo : hi;
}

/** The block scales a nested state stands for: code · absmax2 + offset, in float32 (bitsandbytes' dequantize order). */
export function nestedAbsmax(n: NestedAbsmax): Float32Array {
  const out = new Float32Array(n.codes.length);
  for (let i = 0; i < out.length; i++) out[i] = Math.fround(Math.fround(DYNAMIC_CODE[n.codes[i]] * n.absmax[Math.floor(i / n.blockSize)]) + n.offset);
  return out;
}

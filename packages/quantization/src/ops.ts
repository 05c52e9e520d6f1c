/**
 * ONNX Runtime's weight-only quantized matmuls (com.microsoft contrib ops) in the graph DSL, and
 * the same products from standard ops (dequantize, then MatMul) for providers without the kernels.
 * Each computes x · Wᵀ for a PyTorch Linear weight W [N, K]; the gradient with respect to x is
 * dy · W (the weights are frozen), so LoRA over a quantized base trains through them.
 */
import * as L from '@lathe/onnx';
import { attr, defineOp, formatShape, isFloat, type Tensor } from '@lathe/onnx';
import { NF4_CODE } from './codes';

interface NBitsAttrs {
  K: number;
  N: number;
  bits: number;
  blockSize: number;
}

/** MatMulNBits: A [..., K] · dequant(B)ᵀ → [..., N]; B uint8 [N, kBlocks, blockSize·bits/8], scales [N·kBlocks] in A's dtype, zero points optional. */
export const matMulNBitsOp = defineOp<NBitsAttrs>({
  name: 'MatMulNBits',
  domain: 'com.microsoft',
  nonDiffInputs: [1, 2, 3],
  infer: ([a, b, scales, zp], { K, N, bits, blockSize }) => {
    if (!isFloat(a!.dtype)) throw new Error(`A must be floating point, got ${a!.dtype}`);
    if (a!.shape[a!.shape.length - 1] !== K) throw new Error(`A's last dim must be K = ${K}, got ${formatShape(a!.shape)}`);
    const nb = Math.ceil(K / blockSize);
    const blob = (blockSize * bits) / 8;
    if (b!.dtype !== 'uint8' || b!.shape.join(',') !== [N, nb, blob].join(',')) throw new Error(`B must be uint8[${N}, ${nb}, ${blob}], got ${b!.dtype}${formatShape(b!.shape)}`);
    if (scales!.dtype !== a!.dtype) throw new Error(`scales must be ${a!.dtype} (A's dtype), got ${scales!.dtype}`);
    if (zp && zp.dtype !== 'uint8') throw new Error(`zero points must be uint8, got ${zp.dtype}`);
    return [{ dtype: a!.dtype, shape: [...a!.shape.slice(0, -1), N] }];
  },
  onnxAttrs: ({ K, N, bits, blockSize }) => ({ K: attr.int(K), N: attr.int(N), bits: attr.int(bits), block_size: attr.int(blockSize) }),
  grad: ({ inputs: [, b, scales, zp], dy: [dy], attrs }) => [L.matmul(dy!, dequantizeNBits(b!, scales!, zp ?? undefined, attrs, dy!.dtype)), null, null, null],
});

interface Bnb4Attrs {
  K: number;
  N: number;
  blockSize: number;
  /** 1: NF4 (0 would be FP4). */
  quantType: number;
  /** 1: A · Wᵀ (forward); 0: A · W (A's last dim N; the backward through frozen weights). */
  transB: number;
  /**
   * How the gradient with respect to A is computed: 'kernel', MatMulBnb4 with transB flipped (W
   * read as stored; ONNX Runtime's CUDA kernel — its CPU kernel ignores transB = 0), or
   * 'dequantize' (default): dy times W dequantized from standard ops, on any provider.
   */
  backward?: 'kernel' | 'dequantize';
}

/** MatMulBnb4: bitsandbytes-layout NF4 B (flat uint8, high nibble first) with float absmax per block. */
export const matMulBnb4Op: L.OpDef<Bnb4Attrs> = defineOp<Bnb4Attrs>({
  name: 'MatMulBnb4',
  domain: 'com.microsoft',
  nonDiffInputs: [1, 2],
  infer: ([a, b, absmax], { K, N, blockSize, transB }) => {
    if (!isFloat(a!.dtype)) throw new Error(`A must be floating point, got ${a!.dtype}`);
    const inner = transB ? K : N;
    if (a!.shape[a!.shape.length - 1] !== inner) throw new Error(`A's last dim must be ${transB ? 'K' : 'N'} = ${inner}, got ${formatShape(a!.shape)}`);
    if (b!.dtype !== 'uint8' || b!.shape.join(',') !== String(Math.ceil((N * K) / 2))) throw new Error(`B must be uint8[${Math.ceil((N * K) / 2)}], got ${b!.dtype}${formatShape(b!.shape)}`);
    if (absmax!.dtype !== a!.dtype || absmax!.shape.join(',') !== String(Math.ceil((N * K) / blockSize))) {
      throw new Error(`absmax must be ${a!.dtype}[${Math.ceil((N * K) / blockSize)}], got ${absmax!.dtype}${formatShape(absmax!.shape)}`);
    }
    return [{ dtype: a!.dtype, shape: [...a!.shape.slice(0, -1), transB ? N : K] }];
  },
  onnxAttrs: ({ K, N, blockSize, quantType, transB }) => ({ K: attr.int(K), N: attr.int(N), block_size: attr.int(blockSize), quant_type: attr.int(quantType), transB: attr.int(transB) }),
  grad: ({ inputs: [, b, absmax], dy: [dy], attrs }): (Tensor | null)[] => {
    if (attrs.backward === 'kernel') return [L.applyOp(matMulBnb4Op, [dy!, b!, absmax!], { ...attrs, transB: attrs.transB ? 0 : 1 })[0], null, null];
    const w = dequantizeNf4(b!, absmax!, attrs, NF4_CODE, dy!.dtype); // [N, K]
    return [L.matmul(dy!, attrs.transB ? w : L.transpose(w, [1, 0])), null, null];
  },
});

/** x · Wᵀ through MatMulNBits (scales cast to x's dtype in the graph when stored wider). */
export function matMulNBits(x: Tensor, b: Tensor, scales: Tensor, zeroPoints: Tensor | undefined, a: NBitsAttrs): Tensor {
  const s = scales.dtype === x.dtype ? scales : L.cast(scales, x.dtype);
  return L.applyOp(matMulNBitsOp, zeroPoints ? [x, b, s, zeroPoints] : [x, b, s], a)[0];
}

/** x · Wᵀ through MatMulBnb4 (NF4); `backward` as in {@link matMulBnb4Op}. */
export function matMulBnb4(x: Tensor, b: Tensor, absmax: Tensor, a: { K: number; N: number; blockSize: number }, backward: 'kernel' | 'dequantize' = 'dequantize'): Tensor {
  const am = absmax.dtype === x.dtype ? absmax : L.cast(absmax, x.dtype);
  return L.applyOp(matMulBnb4Op, [x, b, am], { ...a, quantType: 1, transB: 1, backward })[0];
}

/** Low and high nibbles of a uint8 tensor as `dtype`, interleaved on a new last axis [..., 2·n] (low first). */
function nibbles(b: Tensor, dtype: L.DType, highFirst: boolean): Tensor {
  const g = b.graph;
  const v = L.cast(b, 'int32');
  const sixteen = g.constant(16, 'int32', []);
  const hi = L.div(v, sixteen); // integer division: the high nibble
  const lo = L.sub(v, L.mul(hi, sixteen));
  const pair = highFirst ? [hi, lo] : [lo, hi];
  const both = L.concat(pair.map((t) => L.unsqueeze(t, [b.rank])), b.rank); // [..., n, 2]
  return L.cast(L.reshape(both, [...b.shape.slice(0, -1), -1] as number[]), dtype);
}

/**
 * W [N, K] in `dtype` from MatMulNBits inputs, from standard ops (Div/Mul/Sub on int32, Gather-free):
 * (q − zp) · scale per block, padding columns sliced off.
 */
export function dequantizeNBits(b: Tensor, scales: Tensor, zeroPoints: Tensor | undefined, a: NBitsAttrs, dtype: L.DType): Tensor {
  if (a.bits !== 4 && a.bits !== 8) throw new Error(`dequantizeNBits: ${a.bits} bits are not supported (4 or 8)`);
  const g = b.graph;
  const nb = Math.ceil(a.K / a.blockSize);
  const q = a.bits === 4 ? nibbles(b, 'float32', false) : L.cast(b, 'float32'); // [N, nb, blockSize]
  let zp: Tensor;
  if (!zeroPoints) zp = g.constant(2 ** (a.bits - 1), 'float32', []);
  else if (a.bits === 4) zp = L.unsqueeze(L.slice(nibbles(zeroPoints, 'float32', false), [1], [0], [nb]), [2]); // [N, nb, 1]
  else zp = L.unsqueeze(L.cast(zeroPoints, 'float32'), [2]);
  const s = L.unsqueeze(L.reshape(L.cast(scales, 'float32'), [a.N, nb]), [2]);
  const w = L.reshape(L.mul(L.sub(q, zp), s), [a.N, nb * a.blockSize]);
  const cut = nb * a.blockSize === a.K ? w : L.slice(w, [1], [0], [a.K]);
  return dtype === 'float32' ? cut : L.cast(cut, dtype);
}

/** W [N, K] in `dtype` from MatMulBnb4 inputs (NF4 table lookup by Gather), from standard ops. */
export function dequantizeNf4(b: Tensor, absmax: Tensor, a: { K: number; N: number; blockSize: number }, code: Float32Array, dtype: L.DType): Tensor {
  const g = b.graph;
  const total = a.N * a.K;
  const nb = Math.ceil(total / a.blockSize);
  const idx = L.cast(nibbles(b, 'float32', true), 'int64'); // [2·ceil(NK/2)]
  const table = g.constant(Array.from(code), 'float32', [16]);
  let vals = L.gather(table, idx, 0);
  const padded = nb * a.blockSize;
  if (vals.shape[0] !== padded) {
    const len = vals.shape[0] as number;
    vals = len > padded ? L.slice(vals, [0], [0], [padded]) : L.concat([vals, g.constant(new Array(padded - len).fill(0), 'float32', [padded - len])], 0);
  }
  const w = L.mul(L.reshape(vals, [nb, a.blockSize]), L.unsqueeze(L.cast(absmax, 'float32'), [1]));
  const flat = L.slice(L.reshape(w, [padded]), [0], [0], [total]);
  const out = L.reshape(flat, [a.N, a.K]);
  return dtype === 'float32' ? out : L.cast(out, dtype);
}

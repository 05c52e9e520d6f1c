/**
 * A quantized projection in a graph: its kernel's tensors (graph inputs to bind, or initializers
 * holding the bytes) and x · Wᵀ through the kernel or, where it has none, dequantize + MatMul.
 */
import * as L from '@lathe/onnx';
import type { Graph, Tensor } from '@lathe/onnx';
import { toBfloat16Bits, toFloat16Bits } from '@lathe/runtime';
import { NF4_CODE } from './codes';
import type { Bnb4Layout, NBitsLayout } from './layout';
import { dequantizeNBits, dequantizeNf4, matMulBnb4, matMulNBits } from './ops';

/** The graph tensors of one quantized weight. */
export type QuantizedLinearTensors =
  | { op: 'MatMulNBits'; b: Tensor; scales: Tensor; zeroPoints?: Tensor; attrs: NBitsLayout['attrs'] }
  | { op: 'MatMulBnb4'; b: Tensor; absmax: Tensor; attrs: Bnb4Layout['attrs'] };

/** How a quantized projection is computed: ONNX Runtime's fused kernel, or dequantize then MatMul (standard ops, any provider). */
export type QuantizedMatmulMode = 'kernel' | 'dequantize';

/** The names of a quantized weight's kernel tensors, from its HF weight name (`….weight` → `….weight.qb`, `.scales`, …). */
export function kernelTensorNames(hfName: string): { b: string; scales: string; zeroPoints: string; absmax: string } {
  return { b: `${hfName}.q`, scales: `${hfName}.scales`, zeroPoints: `${hfName}.zero_points`, absmax: `${hfName}.absmax` };
}

/** The kernel tensor shapes and dtypes of a layout (what graph inputs declare and device buffers hold). */
export function kernelTensorSpecs(hfName: string, l: NBitsLayout | Bnb4Layout, scaleDtype: L.DType): { name: string; dtype: L.DType; shape: number[]; data: Uint8Array | Float32Array }[] {
  const n = kernelTensorNames(hfName);
  if (l.op === 'MatMulBnb4') {
    return [
      { name: n.b, dtype: 'uint8', shape: [l.b.length], data: l.b },
      { name: n.absmax, dtype: scaleDtype, shape: [l.absmax.length], data: l.absmax },
    ];
  }
  const specs: { name: string; dtype: L.DType; shape: number[]; data: Uint8Array | Float32Array }[] = [
    { name: n.b, dtype: 'uint8', shape: [...l.bShape], data: l.b },
    { name: n.scales, dtype: scaleDtype, shape: [l.attrs.N, l.bShape[1]], data: l.scales },
  ];
  if (l.zeroPoints) specs.push({ name: n.zeroPoints, dtype: 'uint8', shape: [l.attrs.N, l.zeroPoints.length / l.attrs.N], data: l.zeroPoints });
  return specs;
}

/**
 * How a quantized weight's kernel tensors enter a graph: `inline`, initializers holding the bytes
 * with float32 scales (tests, any provider: the kernel's scales are cast in the graph); otherwise
 * scales in `scaleDtype` (the activations' dtype, as MatMulNBits/MatMulBnb4 read them), as graph
 * inputs bound to device buffers or, with `initializer`, as initializers holding the bytes — which
 * ONNX Runtime prepacks (its fused weight-only GEMM needs that; see the package README).
 */
export type QuantizedLinearDeclaration = { inline: true } | { inline?: false; scaleDtype: L.DType; initializer?: boolean };

/** Declares a quantized weight's kernel tensors in `g` (see {@link QuantizedLinearDeclaration}). */
export function declareQuantizedLinear(g: Graph, hfName: string, l: NBitsLayout | Bnb4Layout, how: QuantizedLinearDeclaration): QuantizedLinearTensors {
  const specs = kernelTensorSpecs(hfName, l, how.inline ? 'float32' : how.scaleDtype);
  const embed = how.inline || how.initializer;
  const t = specs.map((s) => (embed ? g.initializer(s.name, s.dtype, s.shape, { kind: 'inline', bytes: hostBytes(s.data, s.dtype) }) : g.input(s.name, s.dtype, s.shape)));
  if (l.op === 'MatMulBnb4') return { op: l.op, b: t[0], absmax: t[1], attrs: l.attrs };
  return { op: l.op, b: t[0], scales: t[1], zeroPoints: t[2], attrs: l.attrs };
}

/** A kernel tensor's host bytes in `dtype`: codes as they are, scales converted from float32 (bfloat16/float16 bits). */
export function hostBytes(data: Uint8Array | Float32Array, dtype: L.DType): Uint8Array {
  if (data instanceof Uint8Array) return data;
  const typed = dtype === 'bfloat16' ? toBfloat16Bits(data) : dtype === 'float16' ? toFloat16Bits(data) : dtype === 'float32' ? data : undefined;
  if (!typed) throw new Error(`quantized scales cannot be stored as ${dtype} (float32, float16 or bfloat16)`);
  return new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength);
}

const dequantized = new WeakMap<Tensor, Tensor>();

/**
 * x · Wᵀ for a quantized W. `dequantize` builds Wᵀ once per weight, in the weight's own graph (as
 * `linear` does), so a decode loop's body reads it as an outer value. `backward`: how NF4's
 * gradient with respect to x is formed (see `matMulBnb4Op`); MatMulNBits' always dequantizes.
 */
export function quantizedMatmul(x: Tensor, t: QuantizedLinearTensors, mode: QuantizedMatmulMode = 'kernel', backward: 'kernel' | 'dequantize' = 'dequantize'): Tensor {
  if (mode === 'kernel') return t.op === 'MatMulBnb4' ? matMulBnb4(x, t.b, t.absmax, t.attrs, backward) : matMulNBits(x, t.b, t.scales, t.zeroPoints, t.attrs);
  let wt = dequantized.get(t.b);
  if (!wt) {
    wt = L.Graph.build(t.b.graph, () => {
      const w = t.op === 'MatMulBnb4' ? dequantizeNf4(t.b, t.absmax, t.attrs, NF4_CODE, x.dtype) : dequantizeNBits(t.b, t.scales, t.zeroPoints, t.attrs, x.dtype);
      return L.transpose(w, [1, 0]);
    });
    dequantized.set(t.b, wt);
  }
  return L.matmul(x, wt);
}

/**
 * Host-side tensors: a typed array and its dims. Half-precision values travel as their 16-bit
 * patterns in a Uint16Array (convert with `toFloat16Bits` / `fromBfloat16Bits` …, see half.ts).
 */
import { dtypeBytes, type DType } from '@lathe/onnx';

/** A typed array holding a tensor's elements. */
export type HostArray = Float32Array | Float64Array | Int8Array | Uint8Array | Uint16Array | Int32Array | Uint32Array | BigInt64Array;

/** A tensor in host memory. */
export interface HostTensor {
  data: HostArray;
  dims: readonly number[];
}

/** Element count of a shape. */
export function sizeOf(dims: readonly number[]): number {
  let n = 1;
  for (const d of dims) n *= d;
  return n;
}

/** The typed-array constructor that holds a dtype's elements (float16/bfloat16 as bit patterns). */
export function hostArrayType(dtype: DType): { new (n: number): HostArray; new (buffer: ArrayBuffer, byteOffset?: number, length?: number): HostArray } {
  switch (dtype) {
    case 'float32':
      return Float32Array;
    case 'float64':
      return Float64Array;
    case 'float16':
    case 'bfloat16':
      return Uint16Array;
    case 'int8':
      return Int8Array;
    case 'uint8':
    case 'bool':
      return Uint8Array;
    case 'int32':
      return Int32Array;
    case 'uint32':
      return Uint32Array;
    case 'int64':
      return BigInt64Array;
  }
}

/** Throws unless `data` is the right array type and length for `dtype` and `dims`; `what` names the tensor. */
export function checkHostTensor(what: string, dtype: DType, t: HostTensor): void {
  const Type = hostArrayType(dtype);
  if (!(t.data instanceof Type)) throw new Error(`${what}: expected a ${Type.name} for ${dtype} data, got ${t.data.constructor.name}`);
  for (const d of t.dims) if (!Number.isInteger(d) || d < 0) throw new Error(`${what}: invalid dims [${t.dims.join(', ')}]`);
  const n = sizeOf(t.dims);
  if (t.data.length !== n) throw new Error(`${what}: ${t.data.length} elements for dims [${t.dims.join(', ')}] (${n} expected)`);
}

/** Bytes a tensor of this dtype and shape occupies. */
export function byteSize(dtype: DType, dims: readonly number[]): number {
  return sizeOf(dims) * dtypeBytes(dtype);
}

/** A host tensor of a dtype from plain numbers (int64 accepts numbers; float16/bfloat16 are rounded to nearest even). */
export function hostTensor(dtype: DType, dims: readonly number[], values: ArrayLike<number> | ArrayLike<bigint>): HostTensor {
  const n = sizeOf(dims);
  if (values.length !== n) throw new Error(`hostTensor: ${values.length} values for dims [${dims.join(', ')}] (${n} expected)`);
  const Type = hostArrayType(dtype);
  const data = new Type(n);
  for (let i = 0; i < n; i++) {
    const v = values[i];
    (data as unknown as (number | bigint)[])[i] = dtype === 'int64' ? BigInt(v) : Number(v);
  }
  return { data, dims: [...dims] };
}

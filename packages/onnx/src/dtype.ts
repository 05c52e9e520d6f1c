/** Element types of Lathe tensors and their ONNX codes. */
import { OnnxDataType } from './proto';

/** Element type of a tensor. */
export type DType =
  | 'float32'
  | 'float16'
  | 'bfloat16'
  | 'float64'
  | 'int8'
  | 'uint8'
  | 'int32'
  | 'uint32'
  | 'int64'
  | 'bool';

const codes: Record<DType, number> = {
  float32: OnnxDataType.FLOAT,
  float16: OnnxDataType.FLOAT16,
  bfloat16: OnnxDataType.BFLOAT16,
  float64: OnnxDataType.DOUBLE,
  int8: OnnxDataType.INT8,
  uint8: OnnxDataType.UINT8,
  int32: OnnxDataType.INT32,
  uint32: OnnxDataType.UINT32,
  int64: OnnxDataType.INT64,
  bool: OnnxDataType.BOOL,
};

const bytes: Record<DType, number> = {
  float32: 4,
  float16: 2,
  bfloat16: 2,
  float64: 8,
  int8: 1,
  uint8: 1,
  int32: 4,
  uint32: 4,
  int64: 8,
  bool: 1,
};

/** The ONNX TensorProto.DataType code of a dtype. */
export function onnxTypeCode(dtype: DType): number {
  return codes[dtype];
}

/** The dtype of an ONNX TensorProto.DataType code; throws for codes Lathe does not use. */
export function dtypeFromOnnxCode(code: number): DType {
  for (const [name, c] of Object.entries(codes)) if (c === code) return name as DType;
  throw new Error(`ONNX data type ${code} is not supported by Lathe`);
}

/** Bytes per element. */
export function dtypeBytes(dtype: DType): number {
  return bytes[dtype];
}

/** Whether gradients can flow through values of this dtype. */
export function isFloat(dtype: DType): boolean {
  return dtype === 'float32' || dtype === 'float16' || dtype === 'bfloat16' || dtype === 'float64';
}

/** Whether the dtype is a signed or unsigned integer type (not bool). */
export function isInteger(dtype: DType): boolean {
  return dtype === 'int8' || dtype === 'uint8' || dtype === 'int32' || dtype === 'uint32' || dtype === 'int64';
}

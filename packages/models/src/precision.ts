/** The precision that numerically sensitive math (norms, softmax, RoPE angles, log-partitions) runs in. */
import type { DType } from '@lathe/onnx';

/** The dtype sensitive math (norms, softmax) runs in: float32, or float64 for float64 models. */
export function accumulationDtype(dtype: DType): DType {
  return dtype === 'float64' ? 'float64' : 'float32';
}

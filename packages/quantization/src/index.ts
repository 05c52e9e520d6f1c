/** @lathe/quantization — INT8, INT4 and NF4 weight quantization, quantized projections in the decoder graphs, quantized checkpoints. */
import { setQuantizedFolderReader } from '@lathe/models';
import { dequantizedFolderWeights } from './checkpoint';

export * from './codes';
export * from './matrix';
export * from './quantize';
export * from './ops';
export * from './layout';
export * from './linear';
export * from './fused';
export * from './kernel';
export * from './model';
export * from './checkpoint';
export * from './shift';
export * from './qlora';

// Importing the package lets `CausalLM.fromPretrained` (and so every loader built on it) read quantized checkpoints, dequantized.
setQuantizedFolderReader(dequantizedFolderWeights);

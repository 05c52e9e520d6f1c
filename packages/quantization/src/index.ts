/** @lathe/quantization — INT8, INT4 and NF4 weight quantization, quantized projections in the decoder graphs, quantized checkpoints. */
export * from './codes';
export * from './matrix';
export * from './quantize';
export * from './ops';
export * from './layout';
export * from './linear';
export * from './model';

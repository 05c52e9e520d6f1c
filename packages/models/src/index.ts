/** @lathe/models — decoders (Qwen3, Qwen2, Llama) as Lathe graphs, from and to HF files, and the CausalLM model object. */
export * from './config';
export * from './safetensors';
export * from './precision';
export * from './rope';
export * from './decoder';
export * from './params';
export * from './heads';
export * from './logprobs';
export * from './graph-weights';
export * from './causal-lm';
export * from './quantized-folders';
export * from './random';
export * from './random-model';
export * from './save';
export * from './presets';

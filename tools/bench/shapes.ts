/**
 * Model shapes the benchmarks build random models of (Hugging Face config.json fields): Qwen3-0.6B
 * — the shape the issues' targets are stated at — and Qwen3-1.7B (the ICL-V source system's model).
 */
import type { HfConfig } from '@lathe/models';

/** Qwen3-0.6B's architecture (random weights are fine for timing). */
export const QWEN3_0_6B: HfConfig = {
  architectures: ['Qwen3ForCausalLM'],
  vocab_size: 151936,
  hidden_size: 1024,
  intermediate_size: 3072,
  num_hidden_layers: 28,
  num_attention_heads: 16,
  num_key_value_heads: 8,
  head_dim: 128,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000,
  max_position_embeddings: 40960,
  tie_word_embeddings: true,
};

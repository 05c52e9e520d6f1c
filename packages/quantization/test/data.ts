/** Seeded test weights: Gaussian, and heavy-tailed (Student t with 3 degrees of freedom, outliers a transformer's weights have). */
import { rng } from '../../../tools/testing/ort-cpu';

export function gaussian(n: number, seed: number, std = 0.02): Float32Array {
  const u = rng(seed);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = std * Math.sqrt(-2 * Math.log(1 - u())) * Math.cos(2 * Math.PI * u());
  return out;
}

export function heavyTailed(n: number, seed: number, std = 0.02): Float32Array {
  const z = gaussian(4 * n, seed, 1);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = (std * z[4 * i]) / Math.sqrt((z[4 * i + 1] ** 2 + z[4 * i + 2] ** 2 + z[4 * i + 3] ** 2) / 3);
  return out;
}

/**
 * The tiny Qwen3 the quantized-model tests build from seeded weights: head_dim 16 for
 * GroupQueryAttention's CPU rotary; intermediate 96 pads down_proj's K (96) to two INT4 blocks of 64.
 */
export const tinyQwen3 = {
  architectures: ['Qwen3ForCausalLM'],
  vocab_size: 96,
  hidden_size: 64,
  intermediate_size: 96,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 16,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  max_position_embeddings: 64,
  tie_word_embeddings: true,
};

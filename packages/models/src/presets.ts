/**
 * Model shapes to build with random weights (`lathe model init`): a tiny Qwen3 for trying every
 * command on the CPU, and Qwen3's real shapes for benchmarks. All use Qwen3's vocabulary, so the
 * real Qwen3 tokenizer fits them.
 */
import type { HfConfig } from './config';

/** One preset: its config.json, the dtype its weights are stored in by default, and a line of help. */
export interface ModelPreset {
  config: HfConfig;
  dtype: 'float32' | 'bfloat16';
  describe: string;
}

/** What every Qwen3 shares: the vocabulary (151,936 rows, the tokenizer's 151,669 ids padded), special ids, norms and RoPE base. */
const QWEN3_COMMON: HfConfig = {
  architectures: ['Qwen3ForCausalLM'],
  model_type: 'qwen3',
  vocab_size: 151936,
  bos_token_id: 151643,
  eos_token_id: 151645,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000,
  attention_bias: false,
  hidden_act: 'silu',
  tie_word_embeddings: true,
};

/** The depth, heads and context Qwen3-0.6B and Qwen3-1.7B share: the two differ only in width. */
const QWEN3_SMALL_DEPTH = {
  num_hidden_layers: 28,
  num_attention_heads: 16,
  num_key_value_heads: 8,
  head_dim: 128,
  max_position_embeddings: 40960,
} as const;

/** The depth, heads and context Qwen3-4B and Qwen3-8B share: the two differ in width and in whether the LM head is tied. */
const QWEN3_LARGE_DEPTH = {
  num_hidden_layers: 36,
  num_attention_heads: 32,
  num_key_value_heads: 8,
  head_dim: 128,
  max_position_embeddings: 40960,
} as const;

/** Qwen3-14B's depth and heads: 40 layers of 40 query heads, its own LM head. */
const QWEN3_14B_DEPTH = {
  num_hidden_layers: 40,
  num_attention_heads: 40,
  num_key_value_heads: 8,
  head_dim: 128,
  max_position_embeddings: 40960,
} as const;

/** The presets by name (Qwen3-0.6B, -1.7B, -4B, -8B and -14B as in their published config.json files). */
export const MODEL_PRESETS = {
  'tiny-qwen3': {
    config: {
      ...QWEN3_COMMON,
      hidden_size: 64,
      intermediate_size: 192,
      num_hidden_layers: 2,
      num_attention_heads: 4,
      num_key_value_heads: 2,
      head_dim: 16, // a multiple of 16: the KV-cache generation engine runs it
      max_position_embeddings: 4096,
    },
    dtype: 'float32',
    describe: '2 layers, hidden 64 (9.8M parameters, nearly all the embedding; 39 MB): every command runs it on the CPU in seconds',
  },
  'qwen3-0.6b': {
    config: { ...QWEN3_COMMON, hidden_size: 1024, intermediate_size: 3072, ...QWEN3_SMALL_DEPTH },
    dtype: 'bfloat16',
    describe: "Qwen3-0.6B's shape (0.6B parameters; large: 1.2 GB in bfloat16, for benchmarks)",
  },
  'qwen3-1.7b': {
    config: { ...QWEN3_COMMON, hidden_size: 2048, intermediate_size: 6144, ...QWEN3_SMALL_DEPTH },
    dtype: 'bfloat16',
    describe: "Qwen3-1.7B's shape (1.7B parameters; large: 3.4 GB in bfloat16, for benchmarks)",
  },
  'qwen3-4b': {
    config: { ...QWEN3_COMMON, hidden_size: 2560, intermediate_size: 9728, ...QWEN3_LARGE_DEPTH },
    dtype: 'bfloat16',
    describe: "Qwen3-4B's shape (4.02B parameters; large: 8.0 GB in bfloat16, for benchmarks)",
  },
  'qwen3-8b': {
    config: { ...QWEN3_COMMON, hidden_size: 4096, intermediate_size: 12288, ...QWEN3_LARGE_DEPTH, tie_word_embeddings: false },
    dtype: 'bfloat16',
    describe: "Qwen3-8B's shape (8.19B parameters, its own LM head; large: 16.4 GB in bfloat16, for benchmarks)",
  },
  'qwen3-14b': {
    config: { ...QWEN3_COMMON, hidden_size: 5120, intermediate_size: 17408, ...QWEN3_14B_DEPTH, tie_word_embeddings: false },
    dtype: 'bfloat16',
    describe: "Qwen3-14B's shape (14.8B parameters, its own LM head; large: 29.5 GB in bfloat16, for benchmarks)",
  },
} as const satisfies Record<string, ModelPreset>;

/** A preset's name. */
export type ModelPresetName = keyof typeof MODEL_PRESETS;

/** The preset names, in the order help lists them. */
export const MODEL_PRESET_NAMES = Object.keys(MODEL_PRESETS) as ModelPresetName[];

/**
 * The built-in demo task of `lathe demo`, `lathe sft` and `lathe grpo`: two-number addition, a
 * character tokenizer over its alphabet and a tiny random Qwen3 sized for it, so the quick start
 * runs on a CPU with no downloads.
 */
import { existsSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { randomModel, readConfig, type DecoderConfig, type HfConfig } from '@lathe/models';
import { CharTokenizer } from '@lathe/tokenizer';
import { runPaths } from '@lathe/data';
import type { SftExample } from './sft-data';

/** The built-in demo model: a tiny random Qwen3 with a character tokenizer. */
export const BUILTIN_MODEL = 'builtin:tiny';
/** The built-in demo task: two-number addition. */
export const BUILTIN_DATA = 'builtin:addition';
/** The character tokenizer of the built-in task (for models `lathe demo`/`lathe sft` trained on it). */
export const BUILTIN_TOKENIZER = 'builtin:addition';

/** The built-in task's alphabet. */
export const ADDITION_ALPHABET = '0123456789+=';

/** The built-in task: every "a+b=" with 0 ≤ a, b < 100, answer "c". */
export function additionExamples(): SftExample[] {
  const out: SftExample[] = [];
  for (let a = 0; a < 100; a++) for (let b = 0; b < 100; b++) out.push({ prompt: `${a}+${b}=`, response: `${a + b}` });
  return out;
}

/** The built-in task's tokenizer: one id per character of {@link ADDITION_ALPHABET}. */
export function additionTokenizer(): CharTokenizer {
  return new CharTokenizer({ alphabet: ADDITION_ALPHABET });
}

/** The demo model: a tiny Qwen3 sized for the character vocabulary. */
function builtinModelConfig(vocabSize: number): HfConfig {
  return {
    architectures: ['Qwen3ForCausalLM'],
    vocab_size: vocabSize,
    hidden_size: 64,
    intermediate_size: 192,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: 16,
    rms_norm_eps: 1e-6,
    rope_theta: 10000,
    max_position_embeddings: 64,
    tie_word_embeddings: true,
  };
}

/**
 * The built-in model of a run: `<run_dir>/base-model`, read back when it is there (a resume; a new
 * run's `startRunDir` has removed any earlier copy) and otherwise made from `seed` and written
 * atomically, so a crash never leaves a partial copy for a resume to read.
 */
export function builtinBaseModel(runDir: string, seed: number): { dir: string; config: DecoderConfig } {
  const dir = runPaths(runDir).baseModel;
  if (existsSync(join(dir, 'config.json'))) return { dir, config: readConfig(dir).config };
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  const config = randomModel(tmp, builtinModelConfig(additionTokenizer().vocabSize), { seed, std: 0.02 });
  rmSync(dir, { recursive: true, force: true }); // a folder without config.json: an unfinished copy
  renameSync(tmp, dir);
  return { dir, config };
}

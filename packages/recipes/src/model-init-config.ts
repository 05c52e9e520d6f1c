/** `lathe model init`'s options: defaults, flags and YAML keys. */
import { MODEL_PRESETS, MODEL_PRESET_NAMES } from '@lathe/models';
import type { ConfigOf, OptionSchema } from './options';

/** Every option of `lathe model init`. */
export const modelInitSchema = {
  preset: { type: 'string', default: 'tiny-qwen3', choices: MODEL_PRESET_NAMES, describe: `Model shape, with random weights: ${MODEL_PRESET_NAMES.map((n) => `${n}: ${MODEL_PRESETS[n].describe}`).join('; ')}` },
  out: { type: 'string', default: '', describe: 'Folder to write (created when missing) [required]' },
  seed: { type: 'number', default: 0, integer: true, min: 0, describe: 'Seed of the random weights (a seed writes the same bytes every time)' },
  dtype: { type: 'string', default: 'auto', choices: ['auto', 'float32', 'bfloat16'], describe: "Dtype of the stored weights; auto: the preset's (float32 for tiny-qwen3; bfloat16 for the real shapes, as Qwen3's checkpoints)" },
  overwrite: { type: 'boolean', default: false, describe: 'Write into a folder that is not empty, replacing its model and tokenizer files (other files stay)' },
} as const satisfies OptionSchema;

/** A resolved `lathe model init` config. */
export type ModelInitConfig = ConfigOf<typeof modelInitSchema>;

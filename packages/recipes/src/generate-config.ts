/** `lathe generate`'s options: defaults, flags, YAML keys and the config saved beside the output. */
import { decodeOptions, deviceOption, generationEngineOption, quantizedWeightsOption, resumableOptions, samplingFilterOptions } from './common-options';
import type { ConfigOf, OptionSchema } from './options';
import { MAX_SAMPLES_PER_MODE } from './trajectories';

/** Every option of `lathe generate`: defaults, flags, YAML keys and the config saved beside the output. */
export const generateSchema = {
  model: { type: 'string', default: '', describe: 'Hugging Face model folder: config.json, *.safetensors and (unless --tokenizer) tokenizer.json + tokenizer_config.json [required]' },
  tokenizer: { type: 'string', default: 'model', describe: "'model' (the model folder's tokenizer files), or a folder holding tokenizer.json and tokenizer_config.json" },
  data: { type: 'string', default: '', describe: 'Prompts: a JSONL(.gz) or Parquet file, one prompt per row; prompt_idx is the 0-based row index [required]' },
  prompt_field: { type: 'string', default: 'auto', describe: "Field holding the prompt text; auto: 'prompt', or 'problem' (MATH) when the first row has no 'prompt'" },
  answer_field: { type: 'string', default: 'answer', describe: "Field holding the reference answer; rows without one are not graded (MATH files without 'answer': 'solution', graded by its last \\boxed{})" },
  limit: { type: 'number', default: 0, integer: true, min: 0, describe: 'Only the first N prompts (0: all)' },
  prompt_format: {
    type: 'string',
    default: 'chat',
    choices: ['chat', 'raw', 'r1_zero'],
    describe: "chat: the prompt as the user turn of the model's chat template, rendered with thinking on and with thinking off (Qwen3's enable_thinking); raw: the text as it is; r1_zero: the R1-Zero template ('…User: {prompt}\\nAssistant: <think>')",
  },
  samples_thinking: { type: 'number', default: 4, integer: true, min: 0, max: MAX_SAMPLES_PER_MODE - 1, describe: 'Samples per prompt with thinking on (chat: enable_thinking=true); with raw and r1_zero, every sample' },
  samples_non_thinking: { type: 'number', default: 4, integer: true, min: 0, max: MAX_SAMPLES_PER_MODE - 1, describe: 'Samples per prompt with thinking off (chat: enable_thinking=false, an empty <think></think> block); must be 0 with raw and r1_zero' },
  max_new_tokens: { type: 'number', default: 1024, integer: true, min: 1, describe: "Generation limit per sample (finish_reason 'length' when reached)" },
  temperature: { type: 'number', default: 1, min: 0, describe: 'Sampling temperature (0: greedy)' },
  ...samplingFilterOptions(),
  seed: { type: 'number', default: 0, integer: true, describe: 'Seed: sample j of prompt p in a thinking mode reads noise stream sampleKey(p, mode, j) of it, so samples do not depend on batch size, engine, parts or resume' },
  grader: { type: 'string', default: 'math', choices: ['math', 'none'], describe: "'correct' of rows whose prompt has an answer: the math grader (the answer after </think> extracted and compared symbolically; an unclosed <think> scores 0), or none" },
  output: { type: 'string', default: '', describe: 'Trajectory Parquet file, written atomically once every part is done; beside it <name>.config.yaml (this config) and, while running, <name>.parts/ [required]' },
  shard_prompts: { type: 'number', default: 64, integer: true, min: 1, describe: 'Prompts per part file in <name>.parts/: a crash or Ctrl-C loses at most the part in progress' },
  resume: { type: 'boolean', default: false, describe: 'Continue an interrupted run: keep its complete parts, generate the rest (the config must match the saved one except batch_size and generation_engine)' },
  overwrite: { type: 'boolean', default: false, describe: "Replace an existing output and an earlier run's parts" },
  device: deviceOption,
  compute_dtype: { type: 'string', default: 'auto', choices: ['auto', 'float32', 'bfloat16', 'float16'], describe: 'Compute dtype (auto: float32 on cpu, bfloat16 on cuda; bfloat16/float16 need --device cuda)' },
  ...decodeOptions,
  quantized_weights: quantizedWeightsOption,
  ...resumableOptions({
    generation_engine: generationEngineOption,
    batch_size: { type: 'number', default: 64, integer: true, min: 1, describe: 'Samples per generation run (the KV-cache rows): speed and memory, not the samples' },
  }),
} as const satisfies OptionSchema;

/** A resolved `lathe generate` config. */
export type GenerateConfig = ConfigOf<typeof generateSchema>;

/** Options that may change between a run and its `--resume` (they change speed, not the samples). */
export const GENERATE_RESUMABLE_KEYS: readonly (keyof GenerateConfig)[] = ['resume', 'overwrite', 'batch_size', 'generation_engine'];

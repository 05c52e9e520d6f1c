/** `lathe eval`'s options: defaults, flags, YAML keys and the config saved in the run directory. */
import { decodeOptions, deviceOption, generationEngineOption, quantizedWeightsOption, samplingFilterOptions } from './common-options';
import { BENCHMARKS } from './eval-benchmarks';
import type { ConfigOf, OptionSchema } from './options';

/** The named prompt templates: `{problem}` is replaced by the problem text. */
export const EVAL_TEMPLATES = {
  /** Qwen2.5-Math / Qwen3 evaluation: the chat template's user turn asking for a boxed answer. */
  'qwen-boxed': '{problem}\nPlease reason step by step, and put your final answer within \\boxed{}.',
  /** DeepSeek-R1-Zero's plain-text template (the response continues inside `<think>`, the answer in `<answer>`). */
  'r1-zero': '{problem}',
} as const;

/** Every option of `lathe eval`. */
export const evalSchema = {
  model: { type: 'string', default: '', describe: 'Hugging Face model folders (config.json, *.safetensors, tokenizer.json + tokenizer_config.json), comma-separated: several models give one table with a row each [required unless --regrade]' },
  tokenizer: { type: 'string', default: 'model', describe: "'model' (each model folder's tokenizer files), or a folder holding tokenizer.json and tokenizer_config.json for every model" },
  benchmarks: { type: 'string', default: BENCHMARKS.join(','), describe: `Benchmarks, comma-separated, or all (known: ${BENCHMARKS.join(', ')})` },
  data_dir: { type: 'string', default: '../shared/datasets', describe: 'Folder holding the benchmark files in the public layout (aime24/test.jsonl, minerva_math/test.jsonl, …)' },
  limit: { type: 'number', default: 0, integer: true, min: 0, describe: 'Only the first N problems of each benchmark (0: all)' },
  prompt_template: {
    type: 'string',
    default: 'qwen-boxed',
    describe: "qwen-boxed (the chat template's user turn: the problem, then 'Please reason step by step, and put your final answer within \\boxed{}.'), r1-zero (the R1-Zero plain-text template, answer in <answer>…</answer>), or your own text with {problem} where the problem goes (the chat template's user turn, or the whole input with --raw_template)",
  },
  raw_template: { type: 'boolean', default: false, describe: "Your --prompt_template is the model's whole input, not the chat template's user turn (for base models without a chat template)" },
  thinking: { type: 'boolean', default: true, describe: "With a chat template: Qwen3's enable_thinking switch (a sample still thinking at --max_new_tokens has no answer and counts as wrong)" },
  n: { type: 'number', default: 8, integer: true, min: 1, describe: 'Samples per problem of the small sets (AIME24, AIME25, AMC23): avg@n over them' },
  n_large: { type: 'number', default: 1, integer: true, min: 1, describe: 'Samples per problem of the larger sets (MATH-500, Minerva, OlympiadBench, GSM8K)' },
  pass_k: { type: 'string', default: '1,8', describe: 'The k of pass@k (unbiased estimator), comma-separated; a k above a set\'s n is left out for that set' },
  max_new_tokens: { type: 'number', default: 4096, integer: true, min: 1, describe: "Generation limit per sample (a sample that reaches it counts toward the truncation rate; finish_reason 'length')" },
  temperature: { type: 'number', default: 0.6, min: 0, describe: 'Sampling temperature (0: greedy)' },
  ...samplingFilterOptions(),
  top_p: { ...samplingFilterOptions().top_p, default: 0.95 },
  seed: { type: 'number', default: 0, integer: true, describe: 'Seed of the sampling noise: sample j of a problem reads its own stream, so results do not depend on batch size or engine' },
  rounded_tolerance: {
    type: 'string',
    default: 'digits',
    choices: ['digits', 'fixed'],
    describe: "A rounded decimal against an exact gold (1.414 for \\sqrt{2}): digits accepts it when it equals the gold rounded to the digits it shows (at least 2 significant); fixed compares both at the grader's fixed 6 decimal places (see docs/graders.md)",
  },
  grade_workers: { type: 'number', default: 2, integer: true, min: 1, describe: 'Worker threads for symbolic grading, which runs while generation continues' },
  reward_model: { type: 'string', default: '', describe: "A reward model folder (lathe rm train): every completion is scored, and best-of-n (the highest-scored sample's accuracy) is reported" },
  run_dir: { type: 'string', default: '', describe: 'Run directory for completions (<label>.completions.parquet), summary.json, summary.md and config.yaml (default: runs/eval-<UTC time>)' },
  overwrite: { type: 'boolean', default: false, describe: "Replace an earlier eval's files in --run_dir" },
  regrade: { type: 'string', default: '', describe: "An earlier eval's run directory: grade its saved completions again with this grader and --rounded_tolerance (no model, no generation; the run's own benchmarks and --pass_k) and rewrite its summary" },
  device: deviceOption,
  compute_dtype: { type: 'string', default: 'auto', choices: ['auto', 'float32', 'bfloat16', 'float16'], describe: 'Compute dtype (auto: float32 on cpu, bfloat16 on cuda; bfloat16/float16 need --device cuda)' },
  generation_engine: generationEngineOption,
  ...decodeOptions,
  quantized_weights: quantizedWeightsOption,
  batch_size: { type: 'number', default: 256, integer: true, min: 1, describe: 'Samples per generation run (the KV-cache rows); all problems × samples are queued, this many in flight' },
} as const satisfies OptionSchema;

/** A resolved `lathe eval` config. */
export type EvalConfig = ConfigOf<typeof evalSchema>;

/** `--pass_k` as sorted distinct positive integers; anything else is an error naming the flag. */
export function parsePassK(text: string): number[] {
  const ks = text.split(',').map((s) => s.trim()).filter((s) => s !== '');
  const out = ks.map((s) => {
    const k = Number(s);
    if (!Number.isInteger(k) || k < 1) throw new Error(`--pass_k: '${s}' is not a positive integer (e.g. --pass_k 1,8)`);
    return k;
  });
  return [...new Set(out)].sort((a, b) => a - b);
}

/** The user text of `problem` under a template: a preset's name or text holding `{problem}`; errors name the flag. */
export function renderEvalTemplate(template: string, problem: string): string {
  const text = (EVAL_TEMPLATES as Record<string, string>)[template] ?? template;
  if (!text.includes('{problem}')) throw new Error(`--prompt_template '${template}': not a preset (${Object.keys(EVAL_TEMPLATES).join(', ')}) and has no {problem} placeholder`);
  return text.split('{problem}').join(problem);
}

/** Samples per problem of a benchmark: `n` for the small sets, `n_large` for the others. */
export function samplesFor(benchmark: string, cfg: Pick<EvalConfig, 'n' | 'n_large'>): number {
  return SMALL_SETS.has(benchmark) ? cfg.n : cfg.n_large;
}

const SMALL_SETS = new Set(['aime24', 'aime25', 'amc23']);

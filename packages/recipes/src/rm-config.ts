/** `lathe rm train` and `lathe rm eval`'s options: defaults, flags, YAML keys and the config saved with checkpoints. */
import { REWARD_LORA_TARGETS } from '@lathe/reward-models';
import { BUILTIN_DATA } from './demo-task';
import {
  deviceOption,
  evalExamplesOption,
  gradReduceDtypeOption, gradBucketMbOption,
  gradOverlapOption,
  loraOptions,
  modelOption,
  optimizerOptions,
  promptFormatOptions,
  quantizeBaseOption,
  runDirOption,
  seedOption,
  tokenizerOption,
  trainAttentionOption,
  trainComputeDtypeOption,
  trainRunOptions,
  trainStepOptions,
  zeroStageOption,
} from './common-options';
import type { ConfigOf, OptionSchema } from './options';

/** `--data` of the preference commands (rm train, rm eval, dpo). */
export const preferenceDataOption = {
  type: 'string',
  default: BUILTIN_DATA,
  describe: `Preference pairs: a JSONL or Parquet file of HH-RLHF {"chosen", "rejected"} transcripts ("\\n\\nHuman: …\\n\\nAssistant: …", read as chat turns), {"prompt", "chosen", "rejected"} texts, or TRL's conversational rows (lists of {"role", "content"}), each with an optional "margin"; or ${BUILTIN_DATA} (the demo task's problems, the true sum preferred to a wrong one)`,
} as const;

/** `--max_length` of the preference commands: pairs are skipped, never truncated. */
export const preferenceMaxLengthOption = { type: 'number', default: 1024, integer: true, min: 2, describe: 'Longest sequence (prompt + response + EOS) in tokens: a pair with a longer one is skipped and counted, never truncated' } as const;

/** `--eval_examples` of the preference training commands. */
export const heldOutPairsOption = { ...evalExamplesOption, describe: 'Held-out pairs, scored for pairwise accuracy (the same ones for the same data, seed and count)' } as const;

/** LoRA (or QLoRA) for reward models and DPO: the attention projections by default. */
export const preferenceLoraOptions = { ...loraOptions, lora_targets: { ...loraOptions.lora_targets, default: REWARD_LORA_TARGETS }, quantize_base: quantizeBaseOption } as const satisfies OptionSchema;

/** The device, train step and batch options of the preference training commands (rm train, dpo). */
export const preferenceStepOptions = {
  ...trainStepOptions({ steps: 500, batch_size: 16, batch: 'Preference pairs per optimizer step (each pair is two sequences)' }),
  attention: trainAttentionOption,
  max_length: preferenceMaxLengthOption,
  zero_stage: zeroStageOption,
  grad_reduce_dtype: gradReduceDtypeOption,
  grad_overlap: gradOverlapOption,
  grad_bucket_mb: gradBucketMbOption,
} as const satisfies OptionSchema;

/** The held-out pairs of the preference training commands and how often they are scored. */
export const preferenceEvalOptions = {
  eval_examples: heldOutPairsOption,
  eval_every: { type: 'number', default: 50, integer: true, min: 0, describe: 'Score the held-out pairs every N steps (also before the first and after the last; 0: only then)' },
} as const satisfies OptionSchema;

/**
 * The options after the loss of a preference training command (rm train, dpo): AdamW at peak `lr`
 * on a linear schedule, LoRA on the attention projections, the seed (`seeds` names what it draws),
 * the held-out pairs, checkpoints, resume and logging.
 */
export function preferenceRunOptions(lr: number, seeds: string) {
  return {
    ...optimizerOptions({ lr, schedule: 'linear', warmup_steps: 0, weight_decay: 0, max_grad_norm: 1 }),
    ...preferenceLoraOptions,
    seed: seedOption(seeds),
    ...preferenceEvalOptions,
    ...trainRunOptions(200, 'metrics and evaluations'),
  } as const satisfies OptionSchema;
}

/** Every option of `lathe rm train`. */
export const rmTrainSchema = {
  model: { ...modelOption, describe: `${modelOption.describe}: a causal LM (its LM head replaced by a score head drawn from N(0, 0.02²) with --seed) or a reward model (…ForSequenceClassification) to train further` },
  tokenizer: tokenizerOption,
  data: preferenceDataOption,
  ...promptFormatOptions,
  run_dir: runDirOption('runs/rm', 'config.yaml, metrics.jsonl, checkpoints/ (Hugging Face sequence-classification folders) and eval/'),
  ...preferenceStepOptions,
  margin: { type: 'boolean', default: false, describe: "Read each pair's 'margin' field m into the loss, −log σ(r_chosen − r_rejected − m) (a pair without one is an error naming its row)" },
  center_rewards_coefficient: { type: 'number', default: 0, min: 0, describe: "Add c·(r_chosen + r_rejected)² per pair, keeping rewards centred on zero (TRL's center_rewards_coefficient; 0.01 is usual); 0: off" },
  ...preferenceRunOptions(1e-5, "data order, the held-out split, the new score head and LoRA's initial adapters"),
} as const satisfies OptionSchema;

/** A resolved `lathe rm train` config. */
export type RmTrainConfig = ConfigOf<typeof rmTrainSchema>;

/** Every option of `lathe rm eval`. */
export const rmEvalSchema = {
  model: { type: 'string', default: '', describe: 'Reward model folder: a `lathe rm train` checkpoint or any Hugging Face …ForSequenceClassification folder with one label (required)' },
  tokenizer: tokenizerOption,
  data: preferenceDataOption,
  ...promptFormatOptions,
  device: deviceOption,
  compute_dtype: { ...trainComputeDtypeOption, describe: 'Dtype of the weights and compute when scoring (bfloat16 needs --device cuda); rewards are float32 either way' },
  max_length: preferenceMaxLengthOption,
  batch_size: { type: 'number', default: 32, integer: true, min: 1, describe: 'Pairs scored per run (each pair is two sequences)' },
  limit: { type: 'number', default: 0, integer: true, min: 0, describe: 'Score only the first N pairs of the data (0: all)' },
  output: { type: 'string', default: 'rm-scores.parquet', describe: 'Parquet file of the scores, one row per scored pair (written whole or not at all)' },
} as const satisfies OptionSchema;

/** A resolved `lathe rm eval` config. */
export type RmEvalConfig = ConfigOf<typeof rmEvalSchema>;

/** `lathe critic train`'s options: defaults, flags, YAML keys and the config saved with checkpoints. */
import { CRITIC_ABLATIONS } from '@lathe/critic';
import { deviceOption, loraOptions, modelOption, optimizerOptions, runDirOption, seedOption, tokenizerOption, trainRunOptions, trainStepOptions } from './common-options';
import type { ConfigOf, OptionSchema } from './options';

/** The grid options, shared by training (saved with the checkpoint) and the commands that check a checkpoint against them. */
export const criticGridOptions = {
  reward_bins: { type: 'string', default: 'binary', choices: ['binary', 'fractional'], describe: "Reward bins: binary (0 and 1: Q is P(reward = 1)) or fractional (0, 0.1, …, 1: Q is the expected reward); a reward falls in the nearest bin" },
  length_bins: { type: 'number', default: 16, integer: true, min: 1, describe: 'Remaining-length bins, log-spaced over 0…--max_remaining (short lengths get one bin per token)' },
  max_remaining: { type: 'number', default: 4096, integer: true, min: 1, describe: 'Longest remaining length the bins cover (the generation limit of the data): a longer attempt is an error naming it' },
} as const satisfies OptionSchema;

/** Every option of a critic training run. */
export const criticTrainSchema = {
  model: modelOption,
  tokenizer: tokenizerOption,
  data: { type: 'string', default: '', describe: "Trajectory Parquet file (lathe critic data or lathe generate): prompt_idx, prompt_token_ids, output_token_ids and 'correct' or 'value' in 0–1; a prompt's rows are its attempts [required]" },
  run_dir: runDirOption('runs/critic', 'config.yaml, metrics.jsonl and checkpoints/ (each with critic_bins.json)'),
  ...trainStepOptions({ steps: 500, batch_size: 8, batch: 'Packed rows of --max_length tokens per optimizer step' }),
  max_length: { type: 'number', default: 4096, integer: true, min: 2, describe: 'Training length: in-context sequences are packed into rows of this many tokens; an attempt longer than it is skipped and counted' },
  ...criticGridOptions,
  supervise_from_trajectory: { type: 'number', default: 0, integer: true, min: 0, describe: 'Attempts of a sequence before this many earlier ones are context only (no loss on them)' },
  ablation: { type: 'string', default: 'none', choices: CRITIC_ABLATIONS, describe: "none (the full format), no_ans (earlier attempts' feedback without their text), no_feedback (earlier attempts without feedback), no_context (each attempt after its prompt alone)" },
  ...optimizerOptions({ lr: 1e-5, schedule: 'cosine', warmup_steps: 20, weight_decay: 0.01, max_grad_norm: 1 }),
  ...loraOptions,
  seed: seedOption('the packed rows\' order and the built-in model'),
  ...trainRunOptions(200, 'metrics'),
} as const satisfies OptionSchema;

/** Options `--resume` accepts with new values (they change neither the weights nor the data order). */
export const CRITIC_TRAIN_RESUMABLE_KEYS: readonly (keyof CriticTrainConfig)[] = ['resume', 'force', 'overwrite', 'save_every', 'keep_last', 'log_every', 'gradient_checkpointing', 'report_to', 'wandb_project'];

/** A resolved critic training config. */
export type CriticTrainConfig = ConfigOf<typeof criticTrainSchema>;

/** Options of the commands that read a critic checkpoint (label, eval). */
const criticReadOptions = {
  critic: { type: 'string', default: '', describe: 'Critic checkpoint folder (lathe critic train writes one, with critic_bins.json) [required]' },
  tokenizer: { ...tokenizerOption, describe: `${tokenizerOption.describe}; spells the feedback of in-context attempts` },
  bins: { type: 'string', default: '', describe: "A critic_bins.json the checkpoint must match (a checkpoint with another grid is refused); '': the checkpoint's own" },
  context_attempts: { type: 'number', default: 0, integer: true, min: 0, describe: "Earlier attempts at the same prompt (its other rows, in file order) the critic reads, with their feedback, before each attempt" },
  batch_size: { type: 'number', default: 8, integer: true, min: 1, describe: 'Trajectories per forward pass' },
  device: deviceOption,
  compute_dtype: { type: 'string', default: 'float32', choices: ['float32', 'bfloat16'], describe: 'Compute dtype of the forward passes (weights stored float32; bfloat16 needs --device cuda)' },
} as const satisfies OptionSchema;

/** Every option of `lathe critic label`. */
export const criticLabelSchema = {
  ...criticReadOptions,
  model: { type: 'string', default: '', describe: 'Reference policy folder: its min-p candidates at each output position are labelled (the prompt_token_ids are its input) [required]' },
  data: { type: 'string', default: '', describe: "Trajectory Parquet file to label (prompt_token_ids, output_token_ids; 'correct'/'value' needed only with --context_attempts) [required]" },
  output: { type: 'string', default: '', describe: 'Parquet file written (atomically): the input columns plus candidate_ids, candidate_q_values, candidate_ref_logprobs, candidate_remaining, token_q_values, token_remaining, token_entropies (the next-token entropy under the reference policy at each output token) [required]' },
  min_p: { type: 'number', default: 0.1, min: 0, max: 1, describe: "Candidates: the reference policy's tokens with p ≥ min_p × the most likely one's" },
  max_candidates: { type: 'number', default: 16, integer: true, min: 1, describe: 'At most this many candidates per position (the most likely first)' },
} as const satisfies OptionSchema;

/** Every option of `lathe critic eval`. */
export const criticEvalSchema = {
  ...criticReadOptions,
  data: { type: 'string', default: '', describe: "Held-out trajectory Parquet file with 'correct' or 'value' [required]" },
  max_context: { type: 'number', default: 0, integer: true, min: 0, describe: 'Evaluate with 0, 1, …, max_context in-context attempts (each attempt needs that many other rows of its prompt)' },
  reliability_bins: { type: 'number', default: 10, integer: true, min: 1, describe: 'Bins of the reliability table and the ECE' },
  output: { type: 'string', default: '', describe: "JSON report written (atomically) besides the summary on stdout ('': none)" },
} as const satisfies OptionSchema;

/** A resolved `lathe critic label` config. */
export type CriticLabelConfig = ConfigOf<typeof criticLabelSchema>;
/** A resolved `lathe critic eval` config. */
export type CriticEvalConfig = ConfigOf<typeof criticEvalSchema>;

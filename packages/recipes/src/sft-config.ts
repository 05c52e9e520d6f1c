/** `lathe sft`'s options: defaults, flags, YAML keys and the config saved with checkpoints. */
import { BUILTIN_DATA, BUILTIN_MODEL } from './demo-task';
import { evalExamplesOption, loraOptions, modelOption, quantizeBaseOption, optimizerOptions, promptFormatOptions, resumableOptions, runDirOption, seedOption, trainRunOptions, trainStepOptions, trainAttentionOption, logprobKernelOption, ropeKernelOption, swigluKernelOption, zeroStageOption, gradReduceDtypeOption, gradBucketMbOption, gradOverlapOption } from './common-options';
import { serveTrainingOptions } from './serve-training-config';
import type { ConfigOf, OptionSchema } from './options';
import { sftBenchmarkSamplingOptions, TRAIN_EVAL_KEYS, trainEvalOptions } from './train-eval-config';

/** Every option of an SFT run. */
export const sftSchema = {
  model: modelOption,
  data: {
    type: 'string',
    default: BUILTIN_DATA,
    describe: `JSONL file of {"prompt", "response"[, "subject"]} rows or of conversations {"messages": [{"role", "content"}, …]} (see --data_format), a .parquet file with those columns, or ${BUILTIN_DATA} (synthetic "a+b=" problems)`,
  },
  data_format: {
    type: 'string',
    default: 'auto',
    choices: ['auto', 'prompt_response', 'messages'],
    describe: "What a row of --data is: prompt_response ({prompt, response}), messages (TRL's conversational format, rendered with the model's chat template; the evaluation generates the last assistant turn), or auto: messages when the first row has a 'messages' field",
  },
  assistant_only_loss: {
    type: 'boolean',
    default: true,
    describe: "With messages rows: the loss on the assistant's turns only, each from its generation prompt through its end-of-turn token (TRL's assistant_only_loss); false: on every token of the conversation",
  },
  ...promptFormatOptions,
  run_dir: runDirOption('runs/sft', 'config.yaml, metrics.jsonl, checkpoints/ and eval/'),
  ...trainStepOptions({ steps: 1000, batch_size: 32, batch: 'Sequences per optimizer step' }),
  attention: trainAttentionOption,
  logprob_kernel: logprobKernelOption,
  rope_kernel: ropeKernelOption,
  swiglu_kernel: swigluKernelOption,
  zero_stage: zeroStageOption,
  grad_reduce_dtype: gradReduceDtypeOption,
  grad_overlap: gradOverlapOption,
  grad_bucket_mb: gradBucketMbOption,
  cuda_graph: {
    type: 'boolean',
    default: false,
    describe:
      'Replay the train step as a CUDA graph, with no gaps between kernel launches. Every batch is padded to exactly [batch_size, max_length], so use it when examples are near max_length (e.g. long-context SFT) or steps are short (LoRA, small models), not when most examples are much shorter. Needs --device cuda and --micro_batches 1',
  },
  max_length: { type: 'number', default: 512, integer: true, min: 2, describe: 'Longest training sequence in tokens (see --overlong)' },
  overlong: { type: 'string', default: 'skip', choices: ['skip', 'truncate'], describe: "Examples over max_length: skip them, or cut them at max_length (a prompt/response example's response, a conversation's end; both counted)" },
  packing: {
    type: 'boolean',
    default: false,
    describe:
      "Pack several examples into each row of max_length tokens (TRL's packing, best-fit decreasing) instead of one padded row each: attention stays inside each example (a block-diagonal causal mask, positions restarting), so each is trained as it would be alone, with less padding. --batch_size then counts packed rows. Needs composed attention (auto picks it; flash is refused)",
  },
  ...optimizerOptions({ lr: 2e-5, schedule: 'cosine', warmup_steps: 20, weight_decay: 0.01, max_grad_norm: 1 }),
  ...loraOptions,
  quantize_base: quantizeBaseOption,
  seed: seedOption('data order, the held-out split and the built-in model'),
  eval_examples: evalExamplesOption,
  eval_grader: { type: 'string', default: 'exact', choices: ['exact', 'math'], describe: 'How a generated response is judged: exact string match, or the math grader (final answers extracted and compared symbolically)' },
  eval_every: { type: 'number', default: 100, integer: true, min: 0, describe: 'Evaluate every N steps (0: only at the end)' },
  max_new_tokens: { type: 'number', default: 16, integer: true, min: 1, describe: 'Generation length limit during evaluation' },
  ...trainEvalOptions,
  ...sftBenchmarkSamplingOptions,
  ...trainRunOptions(200, 'metrics and evaluations'),
  ...resumableOptions(serveTrainingOptions("from the trainer's own device weights, read in place (no copy, no reload; with LoRA the frozen base plus the adapters being trained; not with --quantize_base)")),
} as const satisfies OptionSchema;

/** Options `--resume` accepts with new values in an SFT run (they change neither the weights nor the data order). */
export const SFT_RESUMABLE_KEYS: readonly (keyof SftConfig)[] = ['resume', 'force', 'overwrite', 'eval_every', 'save_every', 'keep_last', 'log_every', 'gradient_checkpointing', 'attention', 'cuda_graph', 'max_new_tokens', 'report_to', 'wandb_project', ...TRAIN_EVAL_KEYS, 'eval_temperature', 'eval_top_p', 'serve_port', 'serve_host', 'serve_max_rows', 'zero_stage', 'grad_reduce_dtype', 'grad_overlap', 'grad_bucket_mb', 'logprob_kernel', 'rope_kernel', 'swiglu_kernel'];

/** A resolved SFT config. */
export type SftConfig = ConfigOf<typeof sftSchema>;

/**
 * `lathe demo` (the README's main command): the built-in model and task, with the settings that
 * make a 2-layer model learn two-digit addition; sized for two CPU cores.
 */
export const DEMO_SFT_OVERRIDES: Partial<SftConfig> = {
  model: BUILTIN_MODEL,
  data: BUILTIN_DATA,
  run_dir: 'runs/demo',
  steps: 1000,
  batch_size: 64,
  lr: 5e-3,
  warmup_steps: 20,
  eval_every: 250,
  save_every: 500,
  // the quick start's command is run again as it is: each run replaces runs/demo
  overwrite: true,
};

/** `lathe grpo`'s options: defaults, flags, YAML keys and the config saved with every checkpoint. */
import { ESTIMATOR_NAMES, GRPO_DEFAULTS, LOSS_AGGREGATIONS, POLICY_TERMS, type GrpoAlgorithmOptions } from '@lathe/grpo';
import { BUILTIN_DATA, BUILTIN_TOKENIZER } from './demo-task';
import { checkpointOptions, deviceOption, evalExamplesOption, generationEngineOption, gradientCheckpointingOption, gradReduceDtypeOption, gradBucketMbOption, loraOptions, microBatchesOption, modelOption, optimizerOptions, promptFormatOptions, quantizeBaseOption, reportOptions, resumableOptions, resumeOptions, runDirOption, samplingFilterOptions, seedOption, trainAttentionChoicesHelp, trainAttentionOption, trainComputeDtypeOption, logprobKernelOption, ropeKernelOption, swigluKernelOption } from './common-options';
import type { ConfigOf, OptionSchema } from './options';
import { TRAIN_EVAL_KEYS, trainEvalOptions } from './train-eval-config';
import { classmateOptions, rolloutIsOption } from './classmate-config';
import { serveTrainingOptions } from './serve-training-config';

/** sft's `--attention` help with its last sentence for GRPO, whose RL-step passes take the kernels too. */
const grpoAttentionHelp = `${trainAttentionChoicesHelp} In lathe grpo the re-scoring, reference and value passes attend through the kernels too (forward only); generation and evaluation keep GroupQueryAttention`;

/** Every option of a GRPO-family run; the trainer's defaults come from `GRPO_DEFAULTS`. */
export const grpoSchema = {
  // model and data
  model: { ...modelOption, describe: `${modelOption.describe}; also the frozen KL reference` },
  tokenizer: { type: 'string', default: 'model', describe: `'model' (the model folder's tokenizer.json), a folder holding tokenizer.json, or ${BUILTIN_TOKENIZER} (the character tokenizer of the built-in task)` },
  data: { type: 'string', default: BUILTIN_DATA, describe: `Prompts with reference answers: a JSONL or Parquet file of {"prompt", "answer"} rows (see --prompt_field, --answer_field), or ${BUILTIN_DATA} (synthetic "a+b=" problems)` },
  prompt_field: { type: 'string', default: 'prompt', describe: 'Field of a data row holding the prompt' },
  answer_field: { type: 'string', default: 'answer', describe: 'Field of a data row holding the reference answer (e.g. "response" for SFT-style files)' },
  ...promptFormatOptions,
  eval_examples: evalExamplesOption,
  run_dir: runDirOption('runs/grpo', 'config.yaml, metrics.jsonl, rollouts.sqlite, checkpoints/ and eval/'),
  device: { ...deviceOption, default: GRPO_DEFAULTS.device },
  compute_dtype: { ...trainComputeDtypeOption, default: GRPO_DEFAULTS.compute },
  ...resumableOptions({
    attention: { ...trainAttentionOption, default: GRPO_DEFAULTS.attention, describe: grpoAttentionHelp },
    logprob_kernel: {
      ...logprobKernelOption,
      describe:
        "The LM head's log-probs and entropy in the policy's train step and the re-scoring and reference passes through Lathe's fused cross-entropy kernels (each vocabulary chunk's logits read once forward and once backward in the compute dtype, no float32 copy) instead of ONNX Runtime's cast, LogSoftmax and their backward; needs the attention kernels. 'auto': on exactly when the run's attention is Lathe's kernels (--attention kernels, or auto where it picks them; measured in docs/guides/kernels.md), off otherwise; true: on, an error where the attention is not the kernels; false: off",
    },
    rope_kernel: {
      ...ropeKernelOption,
      describe:
        "Rotate queries and keys (RoPE) in the policy's train step, the re-scoring and reference passes and the value model through Lathe's kernel, in the compute dtype with the inverse rotation as its gradient, instead of ONNX Runtime's RotaryEmbedding and its composed backward; needs the attention kernels. 'auto': on exactly when the run's attention is Lathe's kernels and the model's head size is one the kernel takes (the GRPO step's A/B in docs/guides/kernels.md), off otherwise; true: on, an error where it cannot be; false: off",
    },
    swiglu_kernel: {
      ...swigluKernelOption,
      describe:
        "Each MLP's silu(gate)·up in the policy's train step, the re-scoring and reference passes and the value model through Lathe's SwiGLU kernel (one pass forward and one backward, in the compute dtype) instead of ONNX Runtime's QuickGelu, Mul and their composed gradients; needs the attention kernels. 'auto': on exactly when the run's attention is Lathe's kernels (the GRPO step's A/B in docs/guides/kernels.md), off otherwise; true: on, an error where the attention is not the kernels; false: off",
    },
    gradient_checkpointing: { ...gradientCheckpointingOption, default: GRPO_DEFAULTS.gradientCheckpointing },
  }),
  // rewards
  reward: { type: 'string', default: 'exact', choices: ['exact', 'math', 'none'], describe: "Correctness reward (source 'correct', 1 or 0): exact match of the completion with the answer, the math grader (final answer extracted and compared symbolically), or none: no correctness source and no answer field needed (the reward comes from --reward_model, --reward_fn or --format_reward; held-out evaluation then reports the mean of that reward over the greedy completions)" },
  format_reward: { type: 'number', default: 0, describe: "Weight of the r1_zero format reward (source 'format': 1 when the completion is '…</think> <answer>…</answer>'); 0: off" },
  overlong_buffer: { type: 'number', default: 0, integer: true, min: 0, describe: "DAPO's overlong shaping (source 'overlong'): the penalty falls linearly from 0 to -1 over the last N tokens before --max_new_tokens; 0: off" },
  reward_model: {
    type: 'string',
    default: '',
    describe:
      "A reward model folder (a lathe rm train checkpoint or any …ForSequenceClassification one with one label): source 'rm', its score of each prompt + completion (thinking stripped; encoded as lathe rm train encodes pairs, with the folder's tokenizer or, when it has none, this run's), frozen on the policy's device in --compute_dtype, every completion of a step in one run; a NaN score refuses the step. '': none",
  },
  reward_fn: {
    type: 'string',
    default: '',
    describe:
      "Your own reward functions, 'file.ts#name' (.ts, .js, .cjs or .mjs; several separated by commas; 'file.ts' alone: its default export): each a function (prompt, completion, meta) => number | Promise<number>, meta holding answer, completionTokens and stopped; source '<name>' (the file's name for a default export). '': none",
  },
  reward_weights: {
    type: 'string',
    default: '',
    describe:
      "Weights of the reward sources, 'source=weight,…' (e.g. rm=1,correct=0.5; sources: correct, format, overlong, rm and your functions' names): the step's reward is Σ weight·value; a source not named keeps weight 1 (format: --format_reward); weight 0 computes and logs a source without training on it",
  },
  ...classmateOptions,
  reward_fallback: { type: 'number', default: 0, describe: 'Value a per-sample reward source (a grader, your function) contributes when it throws or returns NaN/±∞ (each failure is logged with its prompt and counted)' },
  // rollouts
  steps: { type: 'number', default: 100, integer: true, min: 1, describe: 'RL steps (each: rollouts, rewards, advantages, epochs × minibatch updates)' },
  prompts_per_step: { type: 'number', default: 16, integer: true, min: 1, describe: 'Prompts per RL step (the training set must hold at least this many; epochs of the set are reshuffled)' },
  group_size: { type: 'number', default: 8, integer: true, min: 1, describe: 'Completions sampled per prompt (G; group baselines need ≥ 2)' },
  max_new_tokens: { type: 'number', default: 256, integer: true, min: 1, describe: 'Generation limit per completion (also the constant of --aggregation token-sum-norm)' },
  temperature: { type: 'number', default: GRPO_DEFAULTS.temperature, min: 0, describe: 'Sampling temperature of rollouts (> 0); the loss uses log-probs at the same temperature' },
  ...samplingFilterOptions('; needs --old_logprobs rescore'),
  prompts_per_run: { type: 'number', default: GRPO_DEFAULTS.promptsPerRun, integer: true, min: 0, describe: 'Prompts per generation run (each run holds their G completions’ KV caches; 0: all prompts of a step in one run)' },
  ...resumableOptions({ generation_engine: { ...generationEngineOption, default: GRPO_DEFAULTS.generationEngine } }),
  dynamic_sampling: { type: 'boolean', default: false, describe: "DAPO's dynamic sampling: drop groups whose rewards are all equal and sample more prompts until the step has --prompts_per_step informative groups" },
  max_sampling_rounds: { type: 'number', default: 3, integer: true, min: 1, describe: 'With --dynamic_sampling: at most this many sampling rounds per step (a shortfall is logged, not hidden)' },
  // algorithm
  estimator: { type: 'string', default: GRPO_DEFAULTS.estimator, choices: ESTIMATOR_NAMES, describe: "Advantage estimator: grpo (group mean/std), dr_grpo (no std; with --aggregation token-sum-norm, Dr.GRPO), rloo (leave-one-out), remax (greedy baseline), reinforce_pp (batch whitening), reinforce_pp_baseline (group mean, then whitening), gae (PPO: GAE over token rewards with a learned value model, whitened; see --gae_gamma and the value_* options), gdpo (each reward source normalised in its group, weighted sum whitened over the batch: GDPO), grpo_main_classmate_separated (GRPO over the base reward on every token plus GRPO over the classmate reward on --token_level_classmate_reward_mode's tokens; needs --classmates). The classmate method's adv_estimator" },
  gae_gamma: { type: 'number', default: GRPO_DEFAULTS.valueModel.gamma, min: 0, max: 1, describe: 'With --estimator gae: the discount γ of GAE' },
  gae_lambda: { type: 'number', default: GRPO_DEFAULTS.valueModel.lambda, min: 0, max: 1, describe: 'With --estimator gae: GAE’s λ (1: Monte Carlo returns minus the value; verl’s default)' },
  value_trunk: { type: 'string', default: GRPO_DEFAULTS.valueModel.trunk, choices: ['separate', 'shared'], describe: "With --estimator gae: the value model's own weights (the policy's trunk copied, its own step and lr), or a value head on the policy's trunk (values from the policy's scoring pass, one train step for both; no --value_lr or --value_warmup_steps)" },
  value_coef: { type: 'number', default: GRPO_DEFAULTS.valueModel.coef, min: 0, describe: 'With --value_trunk shared: the value loss’s weight in the joint loss' },
  value_lr: { type: 'number', default: 0, min: 0, describe: "With --estimator gae: the value model's peak learning rate (it follows --schedule and --warmup_steps like --lr); 0: --lr" },
  value_clip: { type: 'number', default: GRPO_DEFAULTS.valueModel.clip, min: 0, describe: 'With --estimator gae: the value clip ε (a value moves at most ±ε from the one its return was computed with, per step); 0: no clip' },
  value_warmup_steps: { type: 'number', default: GRPO_DEFAULTS.valueModel.warmupSteps, integer: true, min: 0, describe: 'With --estimator gae: RL steps that train the value model alone, the policy frozen' },
  aggregation: { type: 'string', default: GRPO_DEFAULTS.loss.aggregation, choices: LOSS_AGGREGATIONS, describe: 'Loss aggregation: token-mean (DAPO, verl), seq-mean-token-sum, seq-mean-token-mean (original GRPO), token-sum-norm (Dr.GRPO: normalised by sequences × max_new_tokens)' },
  clip_low: { type: 'number', default: GRPO_DEFAULTS.loss.clipLow, min: 0, max: 0.999, describe: 'PPO ratio clip below at 1 - clip_low' },
  clip_high: { type: 'number', default: GRPO_DEFAULTS.loss.clipHigh, min: 0, describe: "PPO ratio clip above at 1 + clip_high (DAPO's clip-higher: 0.28)" },
  ...rolloutIsOption,
  dual_clip: { type: 'number', default: 0, min: 0, describe: 'Dual-clip PPO constant c > 1 (loss capped at -c·A for negative advantages); 0: off' },
  policy_term: { type: 'string', default: GRPO_DEFAULTS.loss.policyTerm, choices: POLICY_TERMS, describe: "Policy term of the loss: ppo (clipped surrogate), cispo (MiniMax-M1's CISPO: the ratio clipped to [1-clip_low, 1+clip_high] and held constant, times -A·log π; no token's gradient is dropped), reinforce (-A·log π, on-policy; verl's gpg)" },
  loss_scale_factor: { type: 'number', default: 0, min: 0, describe: "With --aggregation token-sum-norm: divide the token sum by this constant instead of sequences × max_new_tokens (verl's loss_scale_factor of seq-mean-token-sum-norm); 0: off" },
  ratio: { type: 'string', default: GRPO_DEFAULTS.loss.ratio, choices: ['token', 'sequence'], describe: 'Importance ratio per token (PPO, GRPO) or per sequence (GSPO; use small clip ranges such as 3e-4/4e-4)' },
  kl_coef: { type: 'number', default: 0.04, min: 0, describe: 'β of the KL to the frozen reference (the starting model; with LoRA the base itself); 0: no reference' },
  kl_mode: { type: 'string', default: GRPO_DEFAULTS.kl.mode, choices: ['loss', 'reward'], describe: 'KL as a loss term (GRPO) or as a per-token reward penalty before the advantages (PPO-RLHF, REINFORCE++)' },
  kl_target: { type: 'number', default: 0, min: 0, describe: "With --kl_mode reward: adapt β after each step towards this KL per token, starting from --kl_coef (verl's adaptive KL controller); 0: β fixed" },
  kl_horizon: { type: 'number', default: GRPO_DEFAULTS.kl.horizon, min: 1, describe: 'The adaptive KL controller’s horizon in completions (verl’s default 10000)' },
  kl_estimator: { type: 'string', default: 'auto', choices: ['auto', 'k1', 'k2', 'k3'], describe: "KL estimator: k1 = log ratio, k2 = half its square, k3 = exp(-x) - 1 + x (low variance, unbiased); auto: verl's defaults, k3 with --kl_mode loss and k1 with --kl_mode reward" },
  entropy_coef: { type: 'number', default: GRPO_DEFAULTS.loss.entropyCoef, describe: 'Entropy bonus coefficient (subtracted from the loss)' },
  // off-policy traces (LUFFY)
  preset: {
    type: 'string',
    default: 'none',
    choices: ['none', 'luffy', 'luffy-on-policy', 'sft-then-rl', 'rl-sft-loss'],
    describe:
      "Named settings applied under the config file and flags (see GRPO_PRESETS): luffy (LUFFY's recipe: 7 samples + 1 off-policy trace per group, advantages over the mixed group without std, the shaped off-policy term, no clip, sum over tokens / max length, entropy 0.001, no KL), and its baselines: luffy-on-policy (the same without traces), sft-then-rl (the same, meant for a model SFT-trained on the traces), rl-sft-loss (on-policy RL plus an SFT loss on the traces); none: nothing",
  },
  off_policy_field: {
    type: 'string',
    default: '',
    describe:
      "Field of a data row holding its off-policy traces (LUFFY): a completion's text, a list of token ids, {\"tokens\": ids, \"logprobs\": the writer's log-prob of each} (the shaped term then reads π/π_writer), or a list of those (Parquet or JSONL); text is tokenised once with the policy's tokenizer, EOS appended, and never re-tokenised; with the built-in data, 'answer' is each problem's solution; '': none",
  },
  off_policy_traces: { type: 'number', default: 0, integer: true, min: 0, describe: "Off-policy traces per group (n_off): each prompt's group is group_size − n_off samples plus n_off of its traces; a prompt with fewer trains on fewer (counted as off_policy/missing_groups); 0: on-policy only" },
  off_policy_term: { type: 'string', default: GRPO_DEFAULTS.offPolicy.term, choices: ['shaped', 'sft'], describe: "Loss on the traces' tokens: shaped (LUFFY: -f(π)·A, f(p) = p/(p + gamma), no clip; π/π_b when a trace carries behaviour log-probs) or sft (-coef·log π, no advantage: the RL + SFT loss baseline)" },
  off_policy_gamma: { type: 'number', default: GRPO_DEFAULTS.offPolicy.gamma, min: 1e-9, describe: 'γ of the shaping f(p) = p/(p + γ) (LUFFY: 0.1)' },
  off_policy_sft_coef: { type: 'number', default: GRPO_DEFAULTS.offPolicy.sftCoef, min: 0, describe: 'Weight of the SFT loss on the traces (--off_policy_term sft)' },
  off_policy_adv_stats: { type: 'string', default: GRPO_DEFAULTS.offPolicy.advantageStats, choices: ['group', 'on-policy'], describe: "Whose rewards give a group's advantage mean and std (estimators grpo, dr_grpo): the whole mixed group (LUFFY) or the sampled completions alone" },
  off_policy_overlong: { type: 'string', default: 'truncate', choices: ['truncate', 'skip'], describe: 'A trace longer than --max_new_tokens: cut to it (flagged and counted as off_policy/truncated_traces, and no longer ending in a stop token) or left out (counted at the start of the run)' },
  old_logprobs: { type: 'string', default: GRPO_DEFAULTS.oldLogprobs, choices: ['rescore', 'generation'], describe: "Old log-probs: re-scored by the training policy's forward before the updates, or taken from generation (one forward pass fewer; the same values up to rounding, see logp_parity)" },
  epochs: { type: 'number', default: GRPO_DEFAULTS.epochs, integer: true, min: 1, describe: 'PPO epochs: passes over each step’s batch' },
  n_minibatches: { type: 'number', default: GRPO_DEFAULTS.minibatches, integer: true, min: 1, describe: 'Optimizer steps per epoch: the batch (prompts_per_step × group_size completions) is shuffled and split into this many minibatches' },
  micro_batches: { ...microBatchesOption, default: GRPO_DEFAULTS.microBatches },
  grad_reduce_dtype: gradReduceDtypeOption,
  grad_bucket_mb: gradBucketMbOption,
  // optimizer
  ...optimizerOptions({ lr: 1e-6, schedule: 'constant', warmup_steps: 0, weight_decay: GRPO_DEFAULTS.optimizer.weightDecay, max_grad_norm: GRPO_DEFAULTS.optimizer.maxGradNorm }),
  ...loraOptions,
  quantize_base: quantizeBaseOption,
  seed: { ...seedOption('prompt order, the held-out split, sampling noise, minibatch shuffles and LoRA init'), default: GRPO_DEFAULTS.seed },
  // bookkeeping (these may change on --resume without --force)
  ...resumableOptions({
    eval_sampled: { type: 'boolean', default: false, describe: 'At each evaluation also sample group_size completions per held-out prompt as rollouts are sampled, and report the fraction correct (eval_sampled_accuracy, mean@G) beside the greedy accuracy' },
    eval_every: { type: 'number', default: 10, integer: true, min: 0, describe: 'Evaluate on the held-out prompts every N steps (also before the first and after the last; 0: only then)' },
    ...trainEvalOptions,
    ...checkpointOptions(50),
    log_every: { type: 'number', default: 1, integer: true, min: 1, describe: 'Write metrics.jsonl every N steps' },
    ...reportOptions,
    ...serveTrainingOptions("from the trainer's own device weights (no copy, no reload; needs the KV-cache generation engine)"),
  }),
  ...resumeOptions('metrics, rollouts and evaluations'),
} as const satisfies OptionSchema;

/** A resolved GRPO config. */
export type GrpoConfig = ConfigOf<typeof grpoSchema>;

/**
 * The trainer's options from a config (all but the policy, tokenizer, rewards, device, LoRA and a
 * resume, which the run loads): flags that encode "off" as 0 or 1 become absent options, and
 * `--kl_estimator auto` leaves the estimator to the trainer's per-mode default.
 */
export function grpoTrainerOptions(cfg: GrpoConfig): GrpoAlgorithmOptions {
  if (cfg.rollout_is_threshold > 0 && cfg.rollout_is_threshold < 1) throw new Error(`--rollout_is_threshold ${cfg.rollout_is_threshold}: must be 0 (off) or ≥ 1 (a weight cap below 1 would scale down tokens whose sampling and training log-probs agree)`);
  return {
    groupSize: cfg.group_size,
    maxNewTokens: cfg.max_new_tokens,
    sampling: { temperature: cfg.temperature, topK: cfg.top_k || undefined, topP: cfg.top_p < 1 ? cfg.top_p : undefined, minP: cfg.min_p || undefined },
    estimator: cfg.estimator,
    ...(cfg.estimator === 'gae'
      ? { valueModel: { trunk: cfg.value_trunk, coef: cfg.value_coef, gamma: cfg.gae_gamma, lambda: cfg.gae_lambda, clip: cfg.value_clip, lrScale: cfg.value_lr > 0 ? cfg.value_lr / cfg.lr : 1, warmupSteps: cfg.value_warmup_steps } }
      : {}),
    loss: {
      aggregation: cfg.aggregation,
      clipLow: cfg.clip_low,
      clipHigh: cfg.clip_high,
      dualClip: cfg.dual_clip > 0 ? cfg.dual_clip : undefined,
      ratio: cfg.ratio,
      entropyCoef: cfg.entropy_coef,
      policyTerm: cfg.policy_term,
      lossScaleFactor: cfg.loss_scale_factor > 0 ? cfg.loss_scale_factor : undefined,
      rolloutIsThreshold: cfg.rollout_is_threshold,
    },
    ...(cfg.off_policy_traces > 0
      ? { offPolicy: { traces: cfg.off_policy_traces, term: cfg.off_policy_term, gamma: cfg.off_policy_gamma, sftCoef: cfg.off_policy_sft_coef, advantageStats: cfg.off_policy_adv_stats } }
      : {}),
    kl: {
      coef: cfg.kl_coef,
      mode: cfg.kl_mode,
      ...(cfg.kl_estimator !== 'auto' ? { estimator: cfg.kl_estimator } : {}),
      ...(cfg.kl_target > 0 ? { target: cfg.kl_target, horizon: cfg.kl_horizon } : {}),
    },
    epochs: cfg.epochs,
    minibatches: cfg.n_minibatches,
    microBatches: cfg.micro_batches,
    optimizer: { weightDecay: cfg.weight_decay, maxGradNorm: cfg.max_grad_norm },
    oldLogprobs: cfg.old_logprobs,
    dynamicSampling: cfg.dynamic_sampling ? { maxRounds: cfg.max_sampling_rounds } : undefined,
    compute: cfg.compute_dtype,
    gradientCheckpointing: cfg.gradient_checkpointing,
    // 'kernels' attends as flash attention through the kernel that runGrpo adds once the device is open
    attention: cfg.attention === 'kernels' ? 'flash' : cfg.attention,
    promptsPerRun: cfg.prompts_per_run,
    generationEngine: cfg.generation_engine,
    seed: cfg.seed,
  };
}

/** LUFFY's recipe (Yan et al. 2025) as option values: the settings its baselines share. */
const LUFFY_SHARED: Partial<GrpoConfig> = {
  group_size: 8,
  temperature: 1,
  estimator: 'dr_grpo',
  aggregation: 'token-sum-norm',
  policy_term: 'unclipped',
  entropy_coef: 0.001,
  kl_coef: 0,
};

/**
 * `--preset`'s settings, applied over the schema's defaults and under a config file and the flags
 * (so any of them can still be changed). `luffy` is the published recipe — not the original
 * repository's config defaults, which differ — and the others are the paper's baselines over the
 * same pieces.
 */
export const GRPO_PRESETS: Record<Exclude<GrpoConfig['preset'], 'none'>, Partial<GrpoConfig>> = {
  luffy: { ...LUFFY_SHARED, off_policy_traces: 1, off_policy_term: 'shaped', off_policy_gamma: 0.1, off_policy_adv_stats: 'group' },
  'luffy-on-policy': { ...LUFFY_SHARED, off_policy_traces: 0 },
  'sft-then-rl': { ...LUFFY_SHARED, off_policy_traces: 0 },
  'rl-sft-loss': { ...LUFFY_SHARED, off_policy_traces: 1, off_policy_term: 'sft', off_policy_sft_coef: 1, off_policy_adv_stats: 'on-policy' },
};

/** A preset as a config source (for `resolveConfig`: defaults ← preset ← config file ← flags); none for 'none'. */
export function grpoPresetSource(preset: GrpoConfig['preset']): { name: string; values: Record<string, unknown> } | undefined {
  return preset === 'none' ? undefined : { name: `--preset ${preset}`, values: { ...GRPO_PRESETS[preset], preset } };
}

/**
 * Options that may change between a checkpoint and its resume without --force (they do not change
 * what is trained; the generation engine draws the same samples either way, up to rounding).
 */
export const RESUMABLE_KEYS: readonly (keyof GrpoConfig)[] = ['resume', 'force', 'overwrite', 'eval_every', 'eval_sampled', 'save_every', 'keep_last', 'log_every', 'generation_engine', 'gradient_checkpointing', 'attention', 'logprob_kernel', 'rope_kernel', 'swiglu_kernel', 'report_to', 'wandb_project', 'serve_port', 'serve_host', 'serve_max_rows', 'grad_reduce_dtype', 'grad_bucket_mb', ...TRAIN_EVAL_KEYS];

/**
 * `lathe demo`'s GRPO stage: the SFT stage's final checkpoint on the same task and held-out split,
 * rewarded by exact match. Sized for two CPU cores.
 */
export const DEMO_GRPO_OVERRIDES: Partial<GrpoConfig> = {
  tokenizer: BUILTIN_TOKENIZER,
  data: BUILTIN_DATA,
  run_dir: 'runs/demo-grpo',
  reward: 'exact',
  steps: 400,
  prompts_per_step: 64,
  group_size: 8,
  max_new_tokens: 6,
  lr: 3e-4,
  warmup_steps: 10,
  kl_coef: 0.001,
  clip_high: 0.28,
  n_minibatches: 4,
  eval_every: 50,
  eval_sampled: true,
  save_every: 100,
};

/**
 * What a `GrpoTrainer` is built from, and every default it applies: `GRPO_DEFAULTS` holds them and
 * `resolveGrpoOptions` applies them (and checks the options), so the trainer, the `lathe grpo`
 * schema and a saved config read one set of values.
 */
import type { CausalLM, LogprobKernel, RopeKernel, TrunkOptions, Weights } from '@lathe/models';
import type { DType, Graph } from '@lathe/onnx';
import type { GenerationEngine, SamplingOptions } from '@lathe/rollout';
import { Device, type DeviceKind, type DeviceTensor, type Ptr, type SessionOptions } from '@lathe/runtime';
import type { AdamWConfig, AttentionChoice, LoraConfig, OptimizerState, TrainerOptions } from '@lathe/train';
import { builtinEstimator, type AdvantageFunction, type EstimatorName } from './estimators';
import { DEFAULT_KL_ESTIMATOR, type KlEstimator, type KlMode } from './kl';
import { DEFAULT_ROLLOUT_IS_THRESHOLD, OFF_POLICY_LOSS_DEFAULTS, POLICY_LOSS_DEFAULTS, type LossAggregation, type OffPolicyLossConfig, type PolicyLossConfig } from './policy-loss';
import type { RewardScorer } from './rewards';
import type { RlObjective } from './rl-loss';

/** The KL to the reference. */
export interface KlOptions {
  /** β. 0: no reference at all. */
  coef: number;
  /** 'loss': a term of the policy loss (GRPO); 'reward': a per-token reward penalty before the advantages (PPO-RLHF, REINFORCE++). Default 'loss'. */
  mode?: KlMode;
  /** Default by mode (`DEFAULT_KL_ESTIMATOR`, verl's): 'k3' in the loss, 'k1' as a reward penalty. */
  estimator?: KlEstimator;
  /**
   * Adapt β towards this KL per token after every step (`AdaptiveKlController`, as verl's
   * `kl_ctrl.type: adaptive`), starting from `coef`. With mode 'reward' only. Default: β fixed.
   */
  target?: number;
  /** The adaptive controller's horizon in completions. Needs `target`. Default 10,000 (verl's). */
  horizon?: number;
}

/**
 * The policy loss's hyperparameters as the trainer takes them: the KL is set through {@link KlOptions}, the off-policy term through {@link OffPolicyOptions}.
 * `rolloutIsThreshold` (truncated importance sampling) defaults to `DEFAULT_ROLLOUT_IS_THRESHOLD` (4, the
 * classmate method's); 0 turns it off.
 */
export type GrpoLossConfig = Omit<PolicyLossConfig, 'klCoef' | 'klEstimator' | 'offPolicy'>;

/**
 * Off-policy traces mixed into the groups (LUFFY, Yan et al. 2025): each prompt's group is
 * G − `traces` samples plus up to `traces` of its own traces (`RlPrompt.offPolicy`), rewarded by the
 * same scorer; advantages are taken over the mixed group and the traces' tokens take the off-policy
 * term of the loss (`OffPolicyLossConfig`: f(π_θ)·A, f(p) = p/(p + γ), no clip). A prompt with fewer
 * traces trains on a smaller group (counted as `off_policy/missing_groups`).
 */
export interface OffPolicyOptions extends OffPolicyLossConfig {
  /** Traces per group (n_off), 1 … G − 1. */
  traces: number;
  /**
   * Whose rewards give each group's advantage mean and std (estimators 'grpo' and 'dr_grpo'):
   * 'group' — the whole mixed group (LUFFY's recipe) — or 'on-policy' — the sampled completions
   * alone. With term 'sft' the traces take no advantage, so it is always 'on-policy'. Default 'group'.
   */
  advantageStats?: 'group' | 'on-policy';
}

/** A custom loss and what the loop must feed it. */
export interface CustomObjective {
  objective: RlObjective;
  /** The aggregation whose batch-level normaliser the loop feeds as `loss_normaliser`. Default 'token-mean'. */
  aggregation?: LossAggregation;
  /** The objective reads `refLogp`: the reference is scored each step. Default false. */
  readsReference?: boolean;
}

/**
 * PPO's value model (critic) for `estimator: 'gae'`: separate weights — the policy's trunk (or
 * `init`) with a per-token value head starting at zero (value-model.ts) — trained each step on the
 * GAE returns with the clipped value loss, before the policy's updates, over the same epochs and
 * minibatches, with AdamW settings of the policy's.
 */
export interface ValueModelOptions {
  /**
   * 'separate' (default): its own weights, scored in a pass of its own and trained by its own step.
   * 'shared': a value head on the policy's trunk — values come from the policy's re-scoring pass
   * (one forward, two heads) and the train step's loss is the policy's plus `coef` × the value
   * loss; no warm-up (the trunk is the policy's), no lr of its own, no `init`.
   */
  trunk?: 'separate' | 'shared';
  /** With a shared trunk: the value loss's weight in the joint loss. Default 0.5. */
  coef?: number;
  /** γ of GAE. Default 1. */
  gamma?: number;
  /** λ of GAE. Default 0.95. */
  lambda?: number;
  /** ε of the value clip (v stays within ±ε of the value the returns were computed with); 0: no clip. Default 0.2. */
  clip?: number;
  /** The value model's learning rate as a multiple of the step's (the policy's) lr. Default 1. */
  lrScale?: number;
  /** RL steps that train the value model alone, the policy frozen (its updates skipped), so advantages start from a fitted critic. Default 0. */
  warmupSteps?: number;
  /** Starting weights by HF name (e.g. a reward model's); missing ones come from the policy, the head from zero. */
  init?: ReadonlyMap<string, Float32Array>;
}

/** Where a resumed trainer continues from: trained values and AdamW moments, optimizer steps, RL steps and the adaptive β. */
export interface GrpoResumeState extends OptimizerState {
  optimizerStep: number;
  rlStep: number;
  klCoef?: number;
  /** The value model's weights, AdamW moments and optimizer steps (PPO with a critic). */
  valueModel?: OptimizerState & { step: number };
}

/** Everything a GRPO-family run needs. Defaults are in {@link GRPO_DEFAULTS}. */
export interface GrpoTrainerOptions<M> {
  /**
   * The starting policy, also the frozen reference (e.g. `await CausalLM.fromPretrained(dir)`). The
   * trainer reads its weights once into float32 master weights on `device` and keeps no reference
   * to its device tensors, so a model loaded onto a device may be disposed after `create`.
   */
  model: CausalLM;
  /** Completions are decoded for reward functions only. */
  tokenizer: { decode(ids: readonly number[]): string; readonly padId: number };
  /** Token ids that end a completion (EOS, `<|im_end|>`). */
  stopIds: readonly number[];
  /** Scores completions (see `combineRewards`). */
  rewards: RewardScorer<M & { completionTokens: number; stopped: boolean }>;
  /** Completions per prompt (G). */
  groupSize: number;
  /** Generation limit per completion. */
  maxNewTokens: number;
  /** Sampling for rollouts (temperature > 0). Default temperature 1, no filters. */
  sampling?: SamplingOptions;
  /** A built-in estimator or your own function. Default 'grpo'. */
  estimator?: EstimatorName | AdvantageFunction;
  /** Generate each prompt's greedy completion and pass its reward as `greedyRewards` (set by 'remax'). */
  greedyBaseline?: boolean;
  /** The policy loss: a `policyLoss` config (clip ranges, aggregation, entropy, …) or a custom objective. */
  loss?: GrpoLossConfig | CustomObjective;
  /** KL to the frozen reference. Default none (β 0). */
  kl?: KlOptions;
  /** Passes over each batch. Default 1. */
  epochs?: number;
  /** Optimizer steps per epoch (the batch split into this many minibatches). Default 1. */
  minibatches?: number;
  /** Micro-batches per minibatch (gradient accumulation). Default 1. */
  microBatches?: number;
  /** Shuffle rows before splitting into minibatches (seeded by step and epoch). Default true. */
  shuffle?: boolean;
  /** AdamW settings. Default weight decay 0, gradient clipping at 1. */
  optimizer?: AdamWConfig;
  /**
   * Train LoRA adapters over a frozen base instead of every weight: a side branch on each targeted
   * projection (merged into the base for generation); `dropout` applies in the train step only.
   */
  lora?: LoraConfig;
  /**
   * With `lora`: the frozen base the adapters train over, instead of the model's own weights (bound
   * in the compute dtype, `loraBaseDtype`) — QLoRA's quantized base (`@lathe/recipes`'
   * `quantizedFrozenBase`). The train step, scoring, the KL reference and generation (either
   * engine: the quantized projections plus the adapters' side branches) all read it; checkpoints
   * merge the adapters into its dense weights.
   */
  frozenBase?: FrozenBase;
  /** PPO's value model: required by, and only used with, `estimator: 'gae'`. */
  valueModel?: ValueModelOptions;
  /** Off-policy traces in every group (LUFFY; the "RL + SFT loss" baseline with term 'sft'). Default none. */
  offPolicy?: OffPolicyOptions;
  /** Where old log-probs come from. Default 'rescore'. */
  oldLogprobs?: 'rescore' | 'generation';
  /** DAPO dynamic sampling: drop groups with all-equal rewards and sample more prompts, at most `maxRounds` rounds per step. */
  dynamicSampling?: { maxRounds: number };
  /**
   * Compute the policy's entropy on the batch (a metric; also needed for an entropy bonus). Default
   * true. It costs a second pass over the LM head, so it is computed where it is cheapest: in the
   * re-scoring pass (the entropy of π_old) unless the loss reads it (an entropy bonus, a custom
   * objective) or old log-probs come from generation — then in the train step.
   */
  entropy?: boolean;
  /** Where everything lives. Default the model's device, else the CPU. */
  device?: Device;
  /** Options for every session the trainer compiles (profiling, optimization level, …; CPU fallback stays off on CUDA). */
  session?: SessionOptions;
  /** Forward/backward dtype (master weights and AdamW state stay float32). Default float32. */
  compute?: DType;
  /** Vocabulary chunk of log-prob computations. */
  chunk?: number;
  /** Recompute each decoder layer in the train step's backward pass instead of keeping its activations. Default false. */
  gradientCheckpointing?: boolean;
  /**
   * Attention of the scoring and training graphs: 'composed' (MatMul/Softmax), 'flash' (ONNX
   * Runtime's GroupQueryAttention — flash attention on CUDA — with a backward pass that recomputes
   * each layer's probabilities, so no [B, heads, T, T] activation is kept) or 'auto' (default):
   * flash on a CUDA device with a half-precision compute dtype, composed elsewhere. The RL batch is
   * right-padded, as 'flash' requires. Generation always uses GroupQueryAttention.
   */
  attention?: AttentionChoice;
  /**
   * Attend through this kernel (Lathe's flash-attention forward and backward) in the policy's train
   * step, the value model's, and the scoring passes (policy, reference, values) instead of
   * GroupQueryAttention: the graphs attend as 'flash' (right-padded rows), so `attention` must not
   * be 'composed'. Generation keeps GroupQueryAttention.
   */
  attentionKernel?: GrpoAttentionKernel;
  /** Prompts per generation run (0, the default: all of a round). */
  promptsPerRun?: number;
  /**
   * Free generation's device memory after each generation phase — the KV engines (caches, their
   * prefill and decode sessions) and the compute-dtype weight copy they read — and rebuild them at
   * the next one. Default false: they are built once and kept, which is fastest. True trades a
   * rebuild per phase (session compilation, a CUDA-graph capture, a weight materialisation) for
   * memory during scoring and training. That memory is reusable by the scoring and training
   * sessions only with one shared arena (`Device.cuda({ sharedArena: true })`); with per-session
   * arenas it returns to the arena device tensors come from, which only later tensors (the next
   * phase's caches) reuse. No effect with the 'graph' engine, which holds no caches between runs.
   */
  releaseGenerationMemory?: boolean;
  /**
   * What generates rollouts (and greedy completions): 'kv-cache' — `KvCacheGenerator`, a prefill
   * then a loop of bound decode-step runs over GroupQueryAttention with in-place KV caches (much
   * faster on GPU; needs head_dim a multiple of 16 and, on CUDA, compute bfloat16/float16) — or
   * 'graph' — the in-graph generation loop (any model, any dtype). Both draw the same noise per
   * sample, so they give the same samples up to rounding. Default 'auto': 'kv-cache' where it runs,
   * else 'graph'; an explicit 'kv-cache' where it cannot run is an error saying why.
   */
  generationEngine?: 'auto' | GenerationEngine;
  /** Seed of sampling noise, LoRA init and minibatch shuffles. Default 0. */
  seed?: number;
  /** Continue from a checkpoint (see `GrpoTrainer.snapshot`). */
  resume?: GrpoResumeState;
  /**
   * Data parallelism (`lathe launch`): this rank's place in the job. Each rank's `step` gets its
   * share of the step's prompts (whole groups); the advantage estimator runs on every rank's rows
   * gathered (so batch-level statistics are the whole batch's), the loss normalisers count the
   * whole minibatch, and gradients are summed over the ranks by `trainerOptions`.
   */
  dataParallel?: GrpoDataParallel;
}

/** A flash-attention kernel for the RL graphs ({@link GrpoTrainerOptions.attentionKernel}). */
export interface GrpoAttentionKernel {
  /** The decoder's attention through the kernel: `flashAttentionOps(...).attend` of @lathe/kernels (`TrunkOptions.attentionKernel`). */
  attend: NonNullable<TrunkOptions['attentionKernel']>;
  /** The custom-op domains the sessions that run it register (the kernels' `domain.handle`, and the log-prob, RoPE and SwiGLU kernels' with `logprobKernel` / `ropeKernel` / `swigluKernel`). */
  customOpDomains: Ptr[];
  /**
   * Also take the LM head's log-partition (and entropy) through this fused kernel (`crossEntropyOps`
   * of @lathe/kernels) in the policy's train step and the scoring passes (policy and reference);
   * the value model has no vocabulary head. Default: the composed head.
   */
  logprobKernel?: LogprobKernel;
  /**
   * Also rotate queries and keys through this kernel (`ropeOps(...).rotate` of @lathe/kernels,
   * `TrunkOptions.ropeKernel`) instead of RotaryEmbedding, in every graph that attends through
   * `attend`: the policy's train step, the scoring passes and the value model. Default: RotaryEmbedding.
   */
  ropeKernel?: RopeKernel;
  /**
   * Also take each MLP's silu(gate)·up through this kernel (`swigluOps(...).apply` of @lathe/kernels,
   * `TrunkOptions.swigluKernel`) instead of QuickGelu and Mul, in every graph that attends through
   * `attend`: the policy's train step, the scoring passes and the value model. Default: QuickGelu·Mul.
   */
  swigluKernel?: TrunkOptions['swigluKernel'];
}

/** A rank's place in a data-parallel RL job (structurally what @lathe/distributed and `joinDataParallel` give). */
export interface GrpoDataParallel {
  rank: number;
  worldSize: number;
  /** Every rank's bytes, in rank order. */
  allGatherBytes(data: Uint8Array): Promise<Uint8Array[]>;
  /** `Trainer.create`'s data-parallel options: the gradient all-reduce hook. */
  trainerOptions: { onGradients?: TrainerOptions['onGradients']; zero?: TrainerOptions['zero']; gradReduceDtype?: TrainerOptions['gradReduceDtype'] };
}

/**
 * The options that choose the algorithm and its schedule: everything but the policy, tokenizer,
 * stop ids, rewards, device, sessions and a resume (what a command's config maps to).
 */
export type GrpoAlgorithmOptions = Omit<GrpoTrainerOptions<unknown>, 'model' | 'tokenizer' | 'stopIds' | 'rewards' | 'device' | 'session' | 'resume' | 'attentionKernel'>;

/** The options whose default is a plain value of the option's own type. */
type PlainDefaultKey =
  | 'greedyBaseline'
  | 'epochs'
  | 'minibatches'
  | 'microBatches'
  | 'shuffle'
  | 'optimizer'
  | 'oldLogprobs'
  | 'entropy'
  | 'compute'
  | 'gradientCheckpointing'
  | 'attention'
  | 'promptsPerRun'
  | 'releaseGenerationMemory'
  | 'generationEngine'
  | 'seed';

/** Those options, each with its default applied. */
type PlainDefaults = Required<Pick<GrpoTrainerOptions<unknown>, PlainDefaultKey>>;

/**
 * A frozen base for LoRA other than the model's own weights (QLoRA: a quantized base), as the
 * graphs read it: its inputs are named `base/<…>`, quantized projections read through the
 * weights' `matmul` hook.
 */
export interface FrozenBase {
  /** The base's weights in graph `g` in `compute` (declaring its `base/…` inputs). */
  weights(g: Graph, compute: DType): Weights;
  /** The tensors {@link weights} declares, by input name, uploaded to `device`; the trainer disposes them. */
  upload(device: Device, compute: DType): Record<string, DeviceTensor>;
  /** Every weight as float32 by HF name (quantized layers dequantized): what checkpoints merge the adapters into. */
  dense(): Map<string, Float32Array>;
  /** For logs and errors, e.g. 'nf4'. */
  describe: string;
}

/**
 * Every default of {@link GrpoTrainerOptions}, the one place they are written: the trainer applies
 * them through {@link resolveGrpoOptions}, and `lathe grpo`'s option schema reads its defaults from
 * here. `temperature` is `sampling.temperature`'s, `device` the kind opened when the model is on
 * the host, and the KL estimator's default depends on the mode (`DEFAULT_KL_ESTIMATOR`).
 */
export const GRPO_DEFAULTS = {
  temperature: 1,
  estimator: 'grpo',
  greedyBaseline: false,
  loss: { ...POLICY_LOSS_DEFAULTS, rolloutIsThreshold: DEFAULT_ROLLOUT_IS_THRESHOLD },
  kl: { coef: 0, mode: 'loss', estimator: DEFAULT_KL_ESTIMATOR, horizon: 10000 },
  offPolicy: { ...OFF_POLICY_LOSS_DEFAULTS, advantageStats: 'group' },
  valueModel: { trunk: 'separate', coef: 0.5, gamma: 1, lambda: 0.95, clip: 0.2, lrScale: 1, warmupSteps: 0 },
  epochs: 1,
  minibatches: 1,
  microBatches: 1,
  shuffle: true,
  optimizer: { weightDecay: 0, maxGradNorm: 1 },
  oldLogprobs: 'rescore',
  entropy: true,
  device: 'cpu',
  compute: 'float32',
  gradientCheckpointing: false,
  attention: 'auto',
  promptsPerRun: 0,
  releaseGenerationMemory: false,
  generationEngine: 'auto',
  seed: 0,
} as const satisfies PlainDefaults & {
  temperature: number;
  estimator: EstimatorName;
  device: DeviceKind;
  loss: Required<Omit<GrpoLossConfig, 'dualClip' | 'lossScaleFactor'>>;
  kl: Omit<ResolvedKlOptions, 'target' | 'estimator'> & { estimator: Readonly<Record<KlMode, KlEstimator>> };
  offPolicy: Omit<ResolvedOffPolicyOptions, 'traces'>;
  valueModel: Omit<ResolvedValueModelOptions, 'init'>;
};

/** Value-model options with their defaults applied. */
export type ResolvedValueModelOptions = Required<Omit<ValueModelOptions, 'init'>> & Pick<ValueModelOptions, 'init'>;

/** Off-policy options with their defaults applied. */
export type ResolvedOffPolicyOptions = Required<OffPolicyOptions>;

/** The KL with its defaults applied: the estimator is the mode's. */
export interface ResolvedKlOptions {
  coef: number;
  mode: KlMode;
  estimator: KlEstimator;
  target?: number;
  horizon: number;
}

/** A built-in loss config with its defaults applied. */
export type ResolvedLossConfig = GrpoLossConfig & Required<Omit<GrpoLossConfig, 'dualClip' | 'lossScaleFactor' | 'rolloutIsThreshold'>>;

/** A custom objective with its defaults applied. */
export type ResolvedCustomObjective = Required<CustomObjective>;

/**
 * {@link GrpoTrainerOptions} with every default applied (what the trainer reads). `greedyBaseline`
 * is also true when the built-in estimator needs greedy rewards ('remax').
 */
export type ResolvedGrpoOptions<M> = Omit<GrpoTrainerOptions<M>, PlainDefaultKey | 'sampling' | 'estimator' | 'device' | 'loss' | 'kl' | 'offPolicy' | 'valueModel'> &
  PlainDefaults & {
    sampling: SamplingOptions & { temperature: number };
    estimator: EstimatorName | AdvantageFunction;
    device: Device;
    loss: ResolvedLossConfig | ResolvedCustomObjective;
    kl: ResolvedKlOptions;
    offPolicy?: ResolvedOffPolicyOptions;
    valueModel?: ResolvedValueModelOptions;
  };

/** `given` over `defaults`, where a key set to undefined keeps its default. */
function withDefaults<D extends object, G extends object>(defaults: D, given: G | undefined): D & G {
  const out = { ...defaults } as Record<string, unknown>;
  for (const [k, v] of Object.entries(given ?? {})) if (v !== undefined) out[k] = v;
  return out as D & G;
}

/** Whether a loss option is a custom objective rather than a `policyLoss` config. */
export function isCustomObjective(loss: GrpoLossConfig | CustomObjective | undefined): loss is CustomObjective {
  return loss !== undefined && 'objective' in loss;
}

/**
 * Applies {@link GRPO_DEFAULTS} to `opts` and checks the values that can be checked without
 * compiling anything; an invalid option is an error naming it.
 */
export function resolveGrpoOptions<M>(opts: GrpoTrainerOptions<M>): ResolvedGrpoOptions<M> {
  const d = GRPO_DEFAULTS;
  const sampling = withDefaults({ temperature: d.temperature as number }, opts.sampling);
  check(sampling.temperature > 0, `sampling.temperature must be > 0 for RL rollouts (got ${sampling.temperature}); greedy generation is for evaluation`);
  check(Number.isInteger(opts.groupSize) && opts.groupSize >= 1, `groupSize must be a positive integer, got ${opts.groupSize}`);
  check(Number.isInteger(opts.maxNewTokens) && opts.maxNewTokens >= 1, `maxNewTokens must be a positive integer, got ${opts.maxNewTokens}`);
  for (const [k, v] of [['epochs', opts.epochs], ['minibatches', opts.minibatches], ['microBatches', opts.microBatches]] as const) {
    check(v === undefined || (Number.isInteger(v) && v >= 1), `${k} must be a positive integer, got ${v}`);
  }
  const oldLogprobs = opts.oldLogprobs ?? d.oldLogprobs;
  const filtered = Boolean(sampling.topK) || (sampling.topP !== undefined && sampling.topP < 1) || Boolean(sampling.minP);
  check(!(filtered && oldLogprobs === 'generation'), "oldLogprobs 'generation' with top_k/top_p/min_p: generation's log-probs are of the filtered distribution, not the policy's; use 'rescore'");
  check(opts.attention === undefined || ['auto', 'composed', 'flash'].includes(opts.attention), `attention must be 'auto', 'composed' or 'flash', got ${String(opts.attention)}`);
  check(!opts.attentionKernel || opts.attention !== 'composed', "attentionKernel with attention 'composed': the kernel replaces flash attention (right-padded rows); use attention 'flash' or 'auto'");
  const estimator = opts.estimator ?? d.estimator;

  const given = opts.kl ?? { coef: d.kl.coef };
  check(given.coef >= 0, `kl.coef must be ≥ 0, got ${given.coef}`);
  check(given.target === undefined || (given.coef > 0 && given.mode === 'reward'), `kl.target (an adaptive coefficient) needs kl.mode 'reward' and kl.coef > 0 to start from, got mode '${given.mode ?? d.kl.mode}', coef ${given.coef}`);
  check(given.horizon === undefined || given.target !== undefined, 'kl.horizon needs kl.target');
  const mode = given.mode ?? d.kl.mode;
  const kl: ResolvedKlOptions = { coef: given.coef, mode, estimator: given.estimator ?? d.kl.estimator[mode], horizon: given.horizon ?? d.kl.horizon, ...(given.target !== undefined ? { target: given.target } : {}) };

  let offPolicy: ResolvedOffPolicyOptions | undefined;
  if (opts.offPolicy) {
    const op = withDefaults({ ...d.offPolicy } as ResolvedOffPolicyOptions, opts.offPolicy);
    check(Number.isInteger(op.traces) && op.traces >= 1 && op.traces < opts.groupSize, `offPolicy.traces must be an integer in 1 … groupSize − 1 = ${opts.groupSize - 1} (some samples must be on-policy), got ${op.traces}`);
    check(['shaped', 'sft'].includes(op.term), `offPolicy.term must be 'shaped' or 'sft', got '${op.term}'`);
    check(op.gamma > 0, `offPolicy.gamma must be > 0, got ${op.gamma}`);
    check(['group', 'on-policy'].includes(op.advantageStats), `offPolicy.advantageStats must be 'group' or 'on-policy', got '${op.advantageStats}'`);
    check(!opts.greedyBaseline && !(typeof estimator === 'string' && builtinEstimator(estimator).greedyBaseline), "offPolicy with a greedy baseline (ReMax): the baseline is one greedy sample per prompt, not a group's; use grpo, dr_grpo or rloo");
    offPolicy = op;
  }
  let valueModel: ResolvedValueModelOptions | undefined;
  check((estimator === 'gae') === Boolean(opts.valueModel), estimator === 'gae' ? "estimator 'gae' needs a value model (valueModel options)" : `valueModel options are read by estimator 'gae' only, got estimator '${typeof estimator === 'string' ? estimator : 'custom'}'`);
  if (opts.valueModel) {
    const v = withDefaults({ ...d.valueModel } as ResolvedValueModelOptions, opts.valueModel);
    check(v.gamma >= 0 && v.gamma <= 1, `valueModel.gamma must be in [0, 1], got ${v.gamma}`);
    check(v.lambda >= 0 && v.lambda <= 1, `valueModel.lambda must be in [0, 1], got ${v.lambda}`);
    check(v.clip >= 0, `valueModel.clip must be ≥ 0, got ${v.clip}`);
    check(v.lrScale > 0, `valueModel.lrScale must be > 0, got ${v.lrScale}`);
    check(Number.isInteger(v.warmupSteps) && v.warmupSteps >= 0, `valueModel.warmupSteps must be a non-negative integer, got ${v.warmupSteps}`);
    check(!opts.lora, 'valueModel with LoRA: the value model trains every weight of its own trunk; LoRA on the critic is not supported yet');
    check(['separate', 'shared'].includes(v.trunk), `valueModel.trunk must be 'separate' or 'shared', got '${v.trunk}'`);
    if (v.trunk === 'shared') {
      check(v.coef > 0, `valueModel.coef must be > 0, got ${v.coef}`);
      check(v.warmupSteps === 0, `valueModel.warmupSteps ${v.warmupSteps} with a shared trunk: warming the critic up would move the policy's trunk; use trunk 'separate'`);
      check(v.lrScale === 1 && !v.init, "valueModel with a shared trunk trains with the policy's step: no lrScale of its own, no init");
      check((opts.oldLogprobs ?? d.oldLogprobs) === 'rescore', "valueModel with a shared trunk reads its values from the re-scoring pass: oldLogprobs must be 'rescore'");
      check(!isCustomObjective(opts.loss), 'valueModel with a shared trunk adds its value loss to the built-in policy loss, not to a custom objective');
    }
    valueModel = v;
  }
  check(!opts.frozenBase || opts.lora !== undefined, `frozenBase (${opts.frozenBase?.describe}) trains LoRA adapters over it: set lora`);
  if (opts.dataParallel && opts.dataParallel.worldSize > 1) {
    // each rank would keep a different number of groups, and its controller would read its own KL
    check(!opts.dynamicSampling, 'dynamicSampling with data parallelism: the ranks would keep different numbers of groups (not supported yet)');
    check(given.target === undefined, 'kl.target (an adaptive KL coefficient) with data parallelism: not supported yet (each rank would adapt it to its own rows)');
    check(!opts.dataParallel.trainerOptions.zero, 'ZeRO-1 with the RL loop: not supported yet (its checkpoints would need every rank)');
  }
  const loss = isCustomObjective(opts.loss) ? withDefaults({ aggregation: d.loss.aggregation as LossAggregation, readsReference: false }, opts.loss) : withDefaults({ ...d.loss } as ResolvedLossConfig, opts.loss);
  if (!isCustomObjective(loss)) {
    // 0: no truncated importance sampling (the loss then reads no sampling log-probs)
    if (loss.rolloutIsThreshold === 0) delete loss.rolloutIsThreshold;
    else check(loss.rolloutIsThreshold === undefined || loss.rolloutIsThreshold >= 1, `loss.rolloutIsThreshold must be 0 (off) or ≥ 1, got ${loss.rolloutIsThreshold}`);
  }
  return {
    ...opts,
    sampling,
    estimator,
    greedyBaseline: (opts.greedyBaseline ?? d.greedyBaseline) || (typeof estimator === 'string' && builtinEstimator(estimator).greedyBaseline),
    loss,
    kl,
    offPolicy,
    valueModel,
    epochs: opts.epochs ?? d.epochs,
    minibatches: opts.minibatches ?? d.minibatches,
    microBatches: opts.microBatches ?? d.microBatches,
    shuffle: opts.shuffle ?? d.shuffle,
    optimizer: { ...d.optimizer, ...opts.optimizer },
    oldLogprobs,
    entropy: opts.entropy ?? d.entropy,
    device: opts.device ?? opts.model.device ?? Device.open(d.device),
    compute: opts.compute ?? d.compute,
    gradientCheckpointing: opts.gradientCheckpointing ?? d.gradientCheckpointing,
    attention: opts.attention ?? d.attention,
    promptsPerRun: opts.promptsPerRun ?? d.promptsPerRun,
    releaseGenerationMemory: opts.releaseGenerationMemory ?? d.releaseGenerationMemory,
    generationEngine: opts.generationEngine ?? d.generationEngine,
    seed: opts.seed ?? d.seed,
  };
}

function check(ok: boolean, message: string): void {
  if (!ok) throw new Error(`GrpoTrainer: ${message}`);
}

/**
 * `GrpoTrainer`: the RL loop of the GRPO family, one step at a time. `step()` reads top to bottom:
 *
 *   1. rollouts — G completions per prompt from a generator bound to the trainer's current weight
 *      buffers (`generationEngine`: the KV-cache engine — prefill, then bound decode-step runs over
 *      in-place caches — where it runs, else the in-graph generation loop); with dynamic sampling,
 *      more rounds until enough groups have differing rewards; with `releaseGenerationMemory` the
 *      KV engines and the compute-dtype weight copy are freed once the phase is over;
 *   2. rewards — the reward scorer (`combineRewards`: graders, format rewards, user functions) on the
 *      decoded completions; the token ids themselves are kept and trained on, never re-tokenised;
 *   3. the token batch — prompt ids + sampled ids as generated, each row contiguous from column 0
 *      and right-padded (the layout fused attention takes; see rollout-batch.ts);
 *   4. old log-probs — re-scored by the training policy's forward (`oldLogprobs: 'rescore'`, the
 *      default) or taken from generation (`'generation'`); reference log-probs from the frozen
 *      initial weights (a device copy in the compute dtype; with LoRA the base itself) when the KL
 *      needs them;
 *   5. advantages — a built-in estimator or the user's function;
 *   6. `epochs` × `minibatches` optimizer steps through `Trainer` with the RL loss;
 *   7. metrics.
 * The next step's generation reads the weights the last update wrote: the trainer's buffers are
 * bound by name, nothing is copied.
 *
 * Log-prob parity (`logp_parity`): the mean over response tokens of exp(|log π_train − log π_rollout|),
 * where π_rollout is the generator's log-prob of each sampled token and π_train the training
 * policy's (`decoderPolicy`, the loss's own builder) at the same weights. With re-scoring it is
 * computed over the whole batch from the scoring pass; with generation log-probs, from the first
 * update's forward (its first minibatch, before any weight changes). 1 up to rounding when
 * generation and training agree; the reference systems treat > 1.05 as a bug. Top-k/top-p/min-p
 * filters make the sampling distribution differ from π_θ, so with filters old log-probs must be
 * re-scored (the parity then shows how far the filtered distribution is from the policy).
 */
import type { DType, Graph, Tensor } from '@lathe/onnx';
import type { DecoderConfig } from '@lathe/models';
import { paramSpecs } from '@lathe/models';
import { kvCacheUnsupported, type SamplingOptions } from '@lathe/rollout';
import { Device, type DeviceTensor, type SessionOptions } from '@lathe/runtime';
import {
  castWeights,
  initLora,
  LORA_DROPOUT_KEY,
  loraAdapters,
  loraDropoutKey,
  loraWeights,
  mergedLoraWeights,
  mergeLora,
  permutation,
  Trainer,
  useFlashAttention,
  type AdamWConfig,
  type AttentionChoice,
  type LoraConfig,
  type TrainableParam,
} from '@lathe/train';
import { advantageMatrix } from './advantages';
import { dynamicSampling } from './dynamic-sampling';
import { builtinEstimator, type AdvantageBatch, type AdvantageFunction, type EstimatorName } from './estimators';
import { AdaptiveKlController, klEstimate, klPenalisedRewards, meanCompletionKl, type KlEstimator } from './kl';
import { decoderPolicy } from './policies';
import { lossNormaliser, type LossAggregation, type PolicyLossConfig } from './policy-loss';
import { ComputeWeights, frozenReference, GenerationRunner, KvGenerationRunner, ScoringRunner, type BoundWeights, type GenerationEngine, type PolicyWeights, type RolloutGenerator } from './policy-sessions';
import type { RewardScorer, ScoredBatch, SourceStats } from './rewards';
import { rlLoss, type RlObjective } from './rl-loss';
import { evenSplit, responseValues, selectRows, tokenBatch, type SampledCompletion, type TokenBatch } from './rollout-batch';

/** A prompt for the RL loop. */
export interface RlPrompt<M = unknown> {
  /** The prompt's token ids, as the model reads them (chat template, BOS). */
  ids: readonly number[];
  /** The prompt text handed to reward functions. */
  text: string;
  /** Per-prompt data for reward functions (e.g. the reference answer). */
  meta: M;
  /**
   * The prompt's random-stream key, unique per occurrence in a run (e.g. its data-stream position):
   * sample j draws its noise from key·G + j, so rollouts are reproducible and resume exactly.
   */
  key: number;
  /** Index of the prompt in its dataset (for logs). */
  index?: number;
}

/** The KL to the reference. */
export interface KlOptions {
  /** β. 0: no reference at all. */
  coef: number;
  /** 'loss': a term of the policy loss (GRPO); 'reward': a per-token reward penalty before the advantages (PPO-RLHF, REINFORCE++). Default 'loss'. */
  mode?: 'loss' | 'reward';
  /** Default 'k3' in the loss, 'k1' as a reward penalty. */
  estimator?: KlEstimator;
  /**
   * Adapt β towards this KL per token after every step (`AdaptiveKlController`, as verl's
   * `kl_ctrl.type: adaptive`), starting from `coef`. With mode 'reward' only. Default: β fixed.
   */
  target?: number;
  /** The adaptive controller's horizon in completions (verl's default 10,000). Needs `target`. */
  horizon?: number;
}

/** A custom loss and what the loop must feed it. */
export interface CustomObjective {
  objective: RlObjective;
  /** The aggregation whose batch-level normaliser the loop feeds as `loss_normaliser`. Default 'token-mean'. */
  aggregation?: LossAggregation;
  /** The objective reads `refLogp`: the reference is scored each step. Default false. */
  readsReference?: boolean;
}

/** Everything a GRPO-family run needs. */
export interface GrpoTrainerOptions<M> {
  /** The decoder's architecture. */
  config: DecoderConfig;
  /** The starting policy's float32 weights by HF name; also the frozen reference. */
  weights: Map<string, Float32Array>;
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
  loss?: PolicyLossConfig | CustomObjective;
  /** KL to the frozen reference. Default none. */
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
   * flash on a CUDA device, composed on the CPU, where each measured faster. The RL batch is
   * right-padded, as 'flash' requires. Generation always uses GroupQueryAttention.
   */
  attention?: AttentionChoice;
  /** Prompts per generation run (0: all of a round). */
  promptsPerRun?: number;
  /**
   * Free generation's device memory after each generation phase — the KV engines (caches, their
   * prefill and decode sessions) and the compute-dtype weight copy they read — and rebuild them at
   * the next one. Default false: they are built once and kept, which is fastest. True trades a
   * rebuild per phase (session compilation: 1.6–1.9 s per KV engine at the 0.6B shape on an H100,
   * plus a CUDA-graph capture and a weight materialisation) for memory during scoring and training:
   * at the 0.6B shape in bf16 the caches of 64 rows × 768 positions are 5.7 GB and the weight copy
   * 1.2 GB. That memory is reusable by the scoring and training sessions only with one shared arena
   * (`Device.cuda({ sharedArena: true })`); with per-session arenas it returns to the arena device
   * tensors come from, which only later tensors (the next phase's caches) reuse. No effect with the
   * 'graph' engine, which holds no caches between runs.
   */
  releaseGenerationMemory?: boolean;
  /**
   * What generates rollouts (and greedy completions): 'kv-cache' — `KvCacheGenerator`, a prefill
   * then a loop of bound decode-step runs over GroupQueryAttention with in-place KV caches (much
   * faster on GPU; needs head_dim a multiple of 16 and, on CUDA, compute bfloat16/float16) — or
   * 'graph' — the in-graph generation loop (any model, any dtype). Both draw the same noise per
   * sample, so they give the same samples up to rounding. Default: 'kv-cache' where it runs, else
   * 'graph'; an explicit 'kv-cache' where it cannot run is an error saying why.
   */
  generationEngine?: GenerationEngine;
  /** Seed of sampling noise, LoRA init and minibatch shuffles. Default 0. */
  seed?: number;
  /** Continue from a checkpoint: trained values, AdamW moments, optimizer steps, RL steps. */
  resume?: { params: Map<string, Float32Array>; m: Map<string, Float32Array>; v: Map<string, Float32Array>; optimizerStep: number; rlStep: number; klCoef?: number };
}

/** One completion of a step, for logs and rollout stores. */
export interface RolloutRecord {
  promptIndex: number | undefined;
  promptText: string;
  /** Sample j of its prompt's group. */
  sample: number;
  /** Response token ids (stop token included). */
  tokens: number[];
  completion: string;
  stopped: boolean;
  reward: number;
  bySource: Record<string, number>;
  /** The sequence advantage, or the mean of its token advantages. */
  advantage: number;
}

/** Metrics of one RL step (one line of metrics.jsonl). Times are milliseconds. */
export interface GrpoStepMetrics {
  rl_step: number;
  lr: number;
  prompts: number;
  samples: number;
  reward_mean: number;
  reward_std: number;
  /** Per reward source: `reward/<name>/mean`, `/std`, `/failures`. */
  [perSource: `reward/${string}`]: number;
  /** A custom objective's own metrics: `objective/<name>`, the mean over the step's updates. */
  [custom: `objective/${string}`]: number;
  /**
   * Failed reward calls (each replaced by the scorer's fallback): the sampled completions' and, with
   * a greedy baseline (ReMax), the greedy completions'; also per source in `reward/<name>/failures`.
   */
  reward_failures: number;
  /**
   * Groups whose outcome rewards were all equal (zero advantage under a group baseline), counted by
   * the loop before any KL penalty and whatever the estimator.
   */
  uniform_groups: number;
  zero_advantage_fraction: number;
  advantage_abs_mean: number;
  response_length_mean: number;
  response_length_max: number;
  /** Completions that hit the token limit without a stop id. */
  truncated_fraction: number;
  /** KL(π_old‖π_ref) per response token (the KL estimator on the sampled tokens); NaN without a reference. */
  kl_ref: number;
  /** β this step used (it moves under an adaptive `kl.target`); 0 without a KL term. */
  kl_coef: number;
  loss: number;
  pg_loss: number;
  grad_norm: number;
  clip_fraction: number;
  clip_low_fraction: number;
  /** k3 estimate of KL(π_old‖π_θ) per token, over every update. */
  approx_kl: number;
  /** Entropy per response token, over every update (NaN when not computed). */
  entropy: number;
  logp_parity: number;
  /** Largest |log π_train − log π_rollout| over the tokens the parity was measured on. */
  logp_max_abs_diff: number;
  updates: number;
  nonfinite_updates: number;
  sampling_rounds: number;
  dropped_groups: number;
  /**
   * Dynamic sampling: groups missing from the batch when the last sampling round ended with fewer
   * informative groups than prompts asked for (the step trains on fewer); 0 otherwise.
   */
  dynamic_sampling_shortfall: number;
  generation_ms: number;
  scoring_ms: number;
  rewards_ms: number;
  training_ms: number;
  host_ms: number;
  step_ms: number;
}

/** What `step()` returns. */
export interface GrpoStepResult {
  metrics: GrpoStepMetrics;
  rollouts: RolloutRecord[];
}

/** A group: one prompt's G completions and their rewards. */
interface SampledGroup<M> {
  prompt: RlPrompt<M>;
  completions: SampledCompletion[];
  texts: string[];
  rewards: number[];
  bySource: Record<string, number[]>;
  /** Failed reward calls per source (each replaced by the scorer's fallback), the greedy completion's included. */
  failures: Record<string, number>;
  greedyReward?: number;
}

/** Where time goes in a step. */
class PhaseClock {
  readonly ms = { generation: 0, scoring: 0, rewards: 0, training: 0 };
  private readonly start = performance.now();
  async time<T>(phase: keyof PhaseClock['ms'], fn: () => Promise<T> | T): Promise<T> {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      this.ms[phase] += performance.now() - t0;
    }
  }
  get total(): number {
    return performance.now() - this.start;
  }
}

const mean = (xs: readonly number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN);
const std = (xs: readonly number[]) => {
  const m = mean(xs);
  return xs.length ? Math.sqrt(xs.reduce((a, x) => a + (x - m) ** 2, 0) / xs.length) : NaN;
};

/** The GRPO-family RL loop over a decoder policy on one device. */
export class GrpoTrainer<M = unknown> {
  private rlStep: number;
  /** The KL reward penalty's coefficient controller, when `kl.target` adapts it. */
  private readonly klController: AdaptiveKlController | undefined;
  private disposed = false;

  private constructor(
    private readonly opts: GrpoTrainerOptions<M>,
    /** The compiled train step and the device-resident parameters and AdamW state. */
    readonly trainer: Trainer,
    private readonly frozen: Record<string, DeviceTensor>,
    private readonly reference: BoundWeights | undefined,
    private readonly sampler: RolloutGenerator,
    private readonly greedy: () => RolloutGenerator,
    /** Frees generation's device memory between phases (`releaseGenerationMemory`); undefined: keep it. */
    private readonly releaseGeneration: (() => void) | undefined,
    private readonly policyScorer: () => ScoringRunner,
    private readonly refScorer: ScoringRunner | undefined,
    private readonly estimate: AdvantageFunction,
    private readonly greedyBaseline: boolean,
    private readonly toMerged: () => Map<string, Float32Array>,
    private readonly owned: { dispose(): void }[],
    /** The backend that generates rollouts and greedy completions. */
    readonly generationEngine: GenerationEngine,
  ) {
    this.rlStep = opts.resume?.rlStep ?? 0;
    const kl = opts.kl;
    this.klController = kl?.target !== undefined ? new AdaptiveKlController(opts.resume?.klCoef ?? kl.coef, kl.target, kl.horizon ?? 10000) : undefined;
  }

  /** Compiles the train step, generation and scoring sessions and uploads the weights. */
  static create<M>(opts: GrpoTrainerOptions<M>): GrpoTrainer<M> {
    const { config, weights } = opts;
    const device = opts.device ?? Device.cpu();
    const compute = opts.compute ?? 'float32';
    const sampling: SamplingOptions = { temperature: 1, ...opts.sampling };
    const temperature = sampling.temperature ?? 1;
    check(temperature > 0, `sampling.temperature must be > 0 for RL rollouts (got ${temperature}); greedy generation is for evaluation`);
    check(Number.isInteger(opts.groupSize) && opts.groupSize >= 1, `groupSize must be a positive integer, got ${opts.groupSize}`);
    check(Number.isInteger(opts.maxNewTokens) && opts.maxNewTokens >= 1, `maxNewTokens must be a positive integer, got ${opts.maxNewTokens}`);
    for (const [k, v] of [['epochs', opts.epochs], ['minibatches', opts.minibatches], ['microBatches', opts.microBatches]] as const) {
      check(v === undefined || (Number.isInteger(v) && v >= 1), `${k} must be a positive integer, got ${v}`);
    }
    const filtered = Boolean(sampling.topK) || (sampling.topP !== undefined && sampling.topP < 1) || Boolean(sampling.minP);
    check(!(filtered && opts.oldLogprobs === 'generation'), "oldLogprobs 'generation' with top_k/top_p/min_p: generation's log-probs are of the filtered distribution, not the policy's; use 'rescore'");
    const engine = GrpoTrainer.chooseGenerationEngine(opts.generationEngine, config, device, compute);

    // What is trained: every weight, or LoRA adapters over the frozen base (bound as `base/<name>`).
    const specs = paramSpecs(config);
    const lora = opts.lora;
    const adapters = lora ? loraAdapters(config, lora) : [];
    const trainable = GrpoTrainer.trainableParams(config, lora);
    // With LoRA the adapters are a side branch (scoring reads the train step's forward, without
    // dropout), merged into the base for generation, which reads whole weights.
    const baseInputs = (g: Graph) => {
      const base = new Map(specs.map((s) => [s.name, g.input(`base/${s.name}`, 'float32', s.shape)]));
      return (n: string) => base.get(n)!;
    };
    const policyWeights: PolicyWeights = lora
      ? {
          trainable,
          weights: (g, t) => loraWeights(baseInputs(g), t, adapters, lora, compute),
          merged: (g, t) => mergedLoraWeights(baseInputs(g), t, adapters, lora, compute),
        }
      : { trainable, weights: (_g, t) => castWeights(t, compute) };
    // the train step's: LoRA dropout (when configured) applies here only
    const trainWeights = lora ? (g: Graph, t: Map<string, Tensor>) => loraWeights(baseInputs(g), t, adapters, lora, compute, { training: true }) : policyWeights.weights;
    for (const s of specs) check(weights.has(s.name), `weights: missing '${s.name}'`);
    const frozen: Record<string, DeviceTensor> = lora ? Object.fromEntries(specs.map((s) => [`base/${s.name}`, device.upload({ data: weights.get(s.name)!, dims: s.shape })])) : {};

    // The train step with the RL loss over the same policy builder the scoring graph uses.
    const kl = opts.kl ?? { coef: 0 };
    check(kl.coef >= 0, `kl.coef must be ≥ 0, got ${kl.coef}`);
    check(kl.target === undefined || (kl.coef > 0 && kl.mode === 'reward'), `kl.target (an adaptive coefficient) needs kl.mode 'reward' and kl.coef > 0 to start from, got mode '${kl.mode ?? 'loss'}', coef ${kl.coef}`);
    check(kl.horizon === undefined || kl.target !== undefined, 'kl.horizon needs kl.target');
    const klInLoss = kl.coef > 0 && (kl.mode ?? 'loss') === 'loss';
    const lossSpec = opts.loss ?? {};
    const custom = 'objective' in lossSpec ? lossSpec : undefined;
    const objective: PolicyLossConfig | RlObjective = custom ? custom.objective : { ...lossSpec, klCoef: klInLoss ? kl.coef : 0, klEstimator: kl.estimator ?? (lossSpec as PolicyLossConfig).klEstimator };
    const wantEntropy = opts.entropy ?? true;
    const lossReadsEntropy = custom !== undefined || ((lossSpec as PolicyLossConfig).entropyCoef ?? 0) !== 0;
    const entropyInStep = wantEntropy && (lossReadsEntropy || opts.oldLogprobs === 'generation');
    check(opts.attention === undefined || ['auto', 'composed', 'flash'].includes(opts.attention), `attention must be 'auto', 'composed' or 'flash', got ${String(opts.attention)}`);
    const flashAttention = useFlashAttention(opts.attention, device.kind, compute);
    const policy = decoderPolicy(config, { compute, chunk: opts.chunk, temperature, entropy: entropyInStep, weights: trainWeights, recompute: opts.gradientCheckpointing, flashAttention });
    const readsReference = custom ? Boolean(custom.readsReference) : klInLoss;
    const init = opts.resume
      ? { params: opts.resume.params, m: opts.resume.m, v: opts.resume.v, step: opts.resume.optimizerStep }
      : { params: lora ? initLora(adapters, opts.seed ?? 0) : weights };
    const trainer = Trainer.create(
      { params: trainable, loss: rlLoss(policy, objective, { reference: readsReference }), optimizer: { weightDecay: 0, maxGradNorm: 1, ...opts.optimizer } },
      init,
      { device, microBatches: opts.microBatches ?? 1, frozen, session: opts.session },
    );

    // Generation and scoring sessions, fed the trainer's buffers by binding.
    const padId = opts.tokenizer.padId;
    // one compute-dtype copy of the weights for both KV runners (rollouts and greedy evaluation)
    const computeWeights = engine === 'kv-cache' ? new ComputeWeights(device, config, policyWeights, compute, opts.session) : undefined;
    const generator = (groupSize: number, s: SamplingOptions): RolloutGenerator =>
      computeWeights
        ? KvGenerationRunner.create(device, config, { groupSize, sampling: s, padId, promptsPerRun: opts.promptsPerRun, weights: computeWeights, session: opts.session })
        : GenerationRunner.create(device, config, policyWeights, { groupSize, sampling: s, padId, promptsPerRun: opts.promptsPerRun, session: opts.session });
    const sampler = generator(opts.groupSize, sampling);
    const owned: { dispose(): void }[] = [sampler, ...(computeWeights ? [computeWeights] : [])];
    const lazy = <T extends { dispose(): void }>(make: () => T) => {
      let v: T | undefined;
      return () => {
        if (!v) owned.push((v = make()));
        return v;
      };
    };
    let greedyRunner: RolloutGenerator | undefined;
    const greedy = () => {
      if (!greedyRunner) owned.push((greedyRunner = generator(1, { temperature: 0 })));
      return greedyRunner;
    };
    // the runners first: their engines read the compute-dtype weights
    const releaseGeneration = opts.releaseGenerationMemory
      ? () => {
          sampler.release();
          greedyRunner?.release();
          computeWeights?.release();
        }
      : undefined;
    const policyScorer = lazy(() => ScoringRunner.create(device, config, policyWeights, { temperature, compute, chunk: opts.chunk, entropy: wantEntropy && !entropyInStep, flashAttention, session: opts.session }));

    // The frozen reference: the initial weights, stored once in the compute dtype (it is never
    // trained, so a float32 copy would only be cast on every scoring run); with LoRA, the float32
    // base itself — no copy, cast when scored, as the train step reads it.
    const needsReference = kl.coef > 0 || readsReference;
    let reference: BoundWeights | undefined;
    let refScorer: ScoringRunner | undefined;
    if (needsReference) {
      let refPolicy: PolicyWeights;
      if (lora) {
        refPolicy = { trainable: specs.map((s) => ({ name: s.name, shape: s.shape, decay: false })), weights: (_g, t) => castWeights(t, compute) };
        reference = specs.map((s) => [s.name, frozen[`base/${s.name}`]] as const);
      } else {
        // before any update (no resume) the trainer's parameters are these weights, already on the device
        const ref = frozenReference(device, config, weights, compute, { onDevice: opts.resume ? undefined : trainer.params(), session: opts.session });
        owned.push(ref);
        refPolicy = ref.policy;
        reference = [...ref.weights];
      }
      refScorer = ScoringRunner.create(device, config, refPolicy, { temperature, compute, chunk: opts.chunk, flashAttention, session: opts.session });
      owned.push(refScorer);
    }
    owned.push({ dispose: () => Object.values(frozen).forEach((t) => t.dispose()) });

    const est = typeof opts.estimator === 'function' ? { estimate: opts.estimator, greedyBaseline: false } : builtinEstimator(opts.estimator ?? 'grpo');
    const toMerged = () => {
      const snap = trainer.downloadParams();
      return lora ? mergeLora(weights, snap, adapters, lora) : snap;
    };
    return new GrpoTrainer(opts, trainer, frozen, reference, sampler, greedy, releaseGeneration, policyScorer, refScorer, est.estimate, est.greedyBaseline || Boolean(opts.greedyBaseline), toMerged, owned, engine);
  }

  /**
   * The generation backend for `config` in `compute` on `device`: `requested`, or by default
   * 'kv-cache' where it runs (head_dim a multiple of 16; CPU, or a bfloat16/float16 compute dtype)
   * and 'graph' elsewhere. An explicit 'kv-cache' where it cannot run is an error naming the reason.
   */
  static chooseGenerationEngine(requested: GenerationEngine | undefined, config: DecoderConfig, device: Pick<Device, 'kind'>, compute: DType): GenerationEngine {
    check(requested === undefined || requested === 'kv-cache' || requested === 'graph', `generationEngine must be 'kv-cache' or 'graph', got '${String(requested)}'`);
    const why = kvCacheUnsupported(config, device.kind, compute);
    if (requested === 'kv-cache' && why) throw new Error(`GrpoTrainer: generationEngine 'kv-cache' cannot run this policy: ${why}; use 'graph'`);
    return requested ?? (why ? 'graph' : 'kv-cache');
  }

  /** RL steps taken. */
  get steps(): number {
    return this.rlStep;
  }

  /** The policy's weights now, as sessions bind them: the trainer's buffers (and a LoRA base). */
  private policyWeights(): BoundWeights[] {
    return [this.trainer.params(), Object.entries(this.frozen)];
  }

  /**
   * One RL step at learning rate `lr`. `prompts` gives each sampling round's prompts (round 0, and
   * more rounds with dynamic sampling); an array is round 0's prompts.
   */
  async step(prompts: readonly RlPrompt<M>[] | ((round: number) => readonly RlPrompt<M>[]), lr: number): Promise<GrpoStepResult> {
    if (this.disposed) throw new Error('GrpoTrainer: disposed');
    const o = this.opts;
    const G = o.groupSize;
    const clock = new PhaseClock();
    const next = typeof prompts === 'function' ? prompts : (round: number) => (round === 0 ? prompts : []);

    // 1–2. Rollouts from the current weights, scored by the reward functions.
    const first = next(0);
    let groups: SampledGroup<M>[];
    let rounds = 1;
    let dropped = 0;
    let shortfall = 0;
    if (o.dynamicSampling) {
      const r = await dynamicSampling((round) => this.sampleGroups(round === 0 ? first : next(round), clock), { targetGroups: first.length, maxRounds: o.dynamicSampling.maxRounds });
      ({ groups, rounds, dropped } = r);
      shortfall = first.length - groups.length;
      if (groups.length === 0) throw new Error(`dynamic sampling: every group of ${rounds} round(s) had all-equal rewards; nothing to train on (raise maxRounds or check the rewards)`);
    } else groups = await this.sampleGroups(first, clock);
    // the generation phase is over (every sampling round, ReMax's greedy baseline)
    this.releaseGeneration?.();

    // 3. The token batch: prompt ids + sampled ids exactly as generated, rows right-padded.
    const rows = groups.flatMap((g) => g.completions.map((c) => ({ prompt: g.prompt.ids, c })));
    const batch = tokenBatch(
      rows.map((r) => r.prompt),
      rows.map((r) => r.c),
      o.tokenizer.padId,
    );
    const rowChunks = evenSplit([...Array(batch.rows).keys()], this.minibatchCount(batch.rows) * this.trainer.microBatches);

    // 4. Old log-probs (re-scored by the training policy, or generation's) and the reference's.
    let oldLogp = batch.rolloutLogp;
    let parity: { mean: number; maxAbs: number } | undefined;
    let scoredEntropy: number | undefined;
    if ((o.oldLogprobs ?? 'rescore') === 'rescore') {
      const scored = await clock.time('scoring', () => this.scoreRows(this.policyScorer(), this.policyWeights(), batch, rowChunks));
      oldLogp = scored.logp;
      if (scored.entropy) scoredEntropy = mean(responseValues(batch, scored.entropy).flat());
      parity = logpParity(batch, oldLogp);
    }
    const refLogp = this.refScorer ? (await clock.time('scoring', () => this.scoreRows(this.refScorer!, [this.reference!], batch, rowChunks))).logp : undefined;

    // 5. Advantages (a KL reward penalty first shapes the rewards per token; uniform groups are
    // still decided on the outcome rewards — the estimators get them as `rewards`).
    const outcome = groups.flatMap((g) => g.rewards);
    const logpRows = responseValues(batch, oldLogp);
    const refRows = refLogp && responseValues(batch, refLogp);
    const klMode = o.kl && o.kl.coef > 0 ? (o.kl.mode ?? 'loss') : undefined;
    const klCoef = klMode ? (this.klController?.value ?? o.kl!.coef) : 0;
    const tokenRewards = klMode === 'reward' ? klPenalisedRewards({ rewards: outcome, logp: logpRows, refLogp: refRows! }, { coef: klCoef, estimator: o.kl!.estimator ?? 'k1' }).tokenPenalties : undefined;
    this.klController?.update(meanCompletionKl(logpRows, refRows!, o.kl!.estimator ?? 'k1'), batch.rows);
    const advBatch: AdvantageBatch = {
      rewards: outcome,
      groupSize: G,
      lengths: batch.lengths,
      tokenRewards,
      greedyRewards: this.greedyBaseline ? groups.map((g) => g.greedyReward!) : undefined,
      logp: logpRows,
      refLogp: refRows,
    };
    const adv = this.estimate(advBatch);
    const advantages = advantageMatrix(adv, batch.responseMask, [batch.rows, batch.width]);

    // 6. epochs × minibatches optimizer steps on the stored batch.
    const aggregation: LossAggregation = (o.loss && o.loss.aggregation) || 'token-mean';
    const sums: Record<string, number> = {};
    let updates = 0;
    let nonfinite = 0;
    let gradNorm = 0;
    let lossSum = 0;
    let firstUpdate: Record<string, number> | undefined;
    const extra: Record<string, Float32Array> = { old_logp: oldLogp, advantages, ...(refLogp ? { ref_logp: refLogp } : {}) };
    for (let epoch = 0; epoch < (o.epochs ?? 1); epoch++) {
      const order = (o.shuffle ?? true) ? permutation(batch.rows, hashSeed(o.seed ?? 0, this.rlStep, epoch)) : [...Array(batch.rows).keys()];
      for (const mb of evenSplit(order, this.minibatchCount(batch.rows))) {
        const normaliser = lossNormaliser(aggregation, mb.map((r) => batch.lengths[r]), { maxLength: o.maxNewTokens, lossScaleFactor: o.loss && 'lossScaleFactor' in o.loss ? o.loss.lossScaleFactor : undefined });
        const micro = evenSplit(mb, this.trainer.microBatches).map((part, j) => {
          const t = selectRows(batch, part, extra);
          const fed = (name: string) =>
            name === 'loss_normaliser'
              ? { data: Float32Array.from([normaliser]), dims: [] }
              : name === LORA_DROPOUT_KEY
                ? loraDropoutKey(o.seed ?? 0, this.trainer.step, j) // masks resume exactly: a function of (seed, optimizer step, micro-batch)
                : t[name];
          return Object.fromEntries(this.trainer.batchInputs.map((name) => [name, fed(name)]));
        });
        const r = this.trainer.trainStep(micro, lr);
        clock.ms.training += r.runMs;
        updates++;
        if (!Number.isFinite(r.loss)) {
          nonfinite++;
          continue;
        }
        firstUpdate ??= r.metrics;
        lossSum += r.loss;
        gradNorm += r.gradNorm;
        for (const [k, v] of Object.entries(r.metrics)) sums[k] = (sums[k] ?? 0) + v;
      }
    }
    if (!parity && firstUpdate) parity = { mean: firstUpdate.logp_parity_sum / Math.max(1, firstUpdate.tokens), maxAbs: NaN };
    this.rlStep++;

    // 7. Metrics and the rollouts for logs.
    const good = updates - nonfinite;
    const tokens = sums.tokens ?? 0;
    const per = (k: string) => (k in sums && tokens > 0 ? sums[k] / tokens : NaN);
    const allRewards = outcome;
    const sourceStats = perSourceStats(groups);
    const advPerRow = adv.kind === 'sequence' ? adv.advantages : adv.advantages.map((a) => mean(a));
    const klEst = o.kl?.estimator ?? (klMode === 'reward' ? 'k1' : 'k3');
    const metrics: GrpoStepMetrics = {
      rl_step: this.rlStep,
      lr,
      prompts: groups.length,
      samples: batch.rows,
      reward_mean: mean(allRewards),
      reward_std: std(allRewards),
      reward_failures: Object.values(sourceStats).reduce((s, x) => s + x.failures, 0),
      // the outcome's, not the estimator's: a custom estimator may shape rewards before its groups
      uniform_groups: G > 1 ? groups.filter((g) => g.rewards.every((r) => r === g.rewards[0])).length : 0,
      zero_advantage_fraction: adv.stats.zeroAdvantages / batch.rows,
      advantage_abs_mean: mean(advPerRow.map(Math.abs)),
      response_length_mean: mean(batch.lengths),
      response_length_max: Math.max(...batch.lengths),
      truncated_fraction: rows.filter((r) => !r.c.stopped).length / batch.rows,
      kl_coef: klCoef,
      kl_ref: refRows ? mean(logpRows.flatMap((row, i) => row.map((lp, t) => klEstimate(lp, refRows[i][t], klEst)))) : NaN,
      loss: good ? lossSum / good : NaN,
      pg_loss: good && 'pg_loss' in sums ? sums.pg_loss / good : NaN,
      grad_norm: good ? gradNorm / good : NaN,
      clip_fraction: per('clipped_tokens'),
      clip_low_fraction: per('clipped_low_tokens'),
      approx_kl: per('approx_kl_sum'),
      // π_old's entropy from re-scoring, or the mean over the updates' train-step passes
      entropy: scoredEntropy ?? per('entropy_sum'),
      logp_parity: parity?.mean ?? NaN,
      logp_max_abs_diff: parity?.maxAbs ?? NaN,
      updates,
      nonfinite_updates: nonfinite,
      sampling_rounds: rounds,
      dropped_groups: dropped,
      dynamic_sampling_shortfall: shortfall,
      generation_ms: clock.ms.generation,
      scoring_ms: clock.ms.scoring,
      rewards_ms: clock.ms.rewards,
      training_ms: clock.ms.training,
      host_ms: 0,
      step_ms: 0,
    };
    for (const [name, v] of Object.entries(sums)) if (!BUILTIN_METRICS.has(name)) metrics[`objective/${name}`] = v / good;
    for (const [name, s] of Object.entries(sourceStats)) {
      metrics[`reward/${name}/mean`] = s.mean;
      metrics[`reward/${name}/std`] = s.std;
      metrics[`reward/${name}/failures`] = s.failures;
    }
    metrics.step_ms = clock.total;
    metrics.host_ms = metrics.step_ms - clock.ms.generation - clock.ms.scoring - clock.ms.rewards - clock.ms.training;

    let row = 0;
    const rollouts: RolloutRecord[] = groups.flatMap((g) =>
      g.completions.map((c, j) => {
        const rec: RolloutRecord = {
          promptIndex: g.prompt.index,
          promptText: g.prompt.text,
          sample: j,
          tokens: c.tokens,
          completion: g.texts[j],
          stopped: c.stopped,
          reward: g.rewards[j],
          bySource: Object.fromEntries(Object.entries(g.bySource).map(([k, v]) => [k, v[j]])),
          advantage: advPerRow[row],
        };
        row++;
        return rec;
      }),
    );
    return { metrics, rollouts };
  }

  /** Minibatches per epoch for a batch of `rows` (fewer when a dynamic-sampling batch is too small to split). */
  private minibatchCount(rows: number): number {
    const want = this.opts.minibatches ?? 1;
    const fit = Math.floor(rows / this.trainer.microBatches);
    if (fit < 1) throw new Error(`a batch of ${rows} completions cannot fill ${this.trainer.microBatches} micro-batches`);
    return Math.min(want, fit);
  }

  /** G completions of each prompt (one generation run per `promptsPerRun`), decoded and scored. */
  private async sampleGroups(prompts: readonly RlPrompt<M>[], clock: PhaseClock): Promise<SampledGroup<M>[]> {
    if (prompts.length === 0) return [];
    const o = this.opts;
    const G = o.groupSize;
    const completions = await clock.time('generation', () =>
      this.sampler.generate(
        this.policyWeights(),
        prompts.map((p) => p.ids),
        { maxNewTokens: o.maxNewTokens, stopIds: o.stopIds, seed: o.seed ?? 0, keys: prompts.map((p) => p.key), weightsVersion: this.trainer.step },
      ),
    );
    const texts = completions.map((c) => this.textOf(c));
    const samples = completions.map((c, r) => {
      const p = prompts[Math.floor(r / G)];
      return { prompt: p.text, completion: texts[r], meta: { ...p.meta, completionTokens: c.tokens.length, stopped: c.stopped } };
    });
    const scored = await clock.time('rewards', () => o.rewards(samples));
    let greedyRewards: number[] | undefined;
    let greedyFailures: ScoredBatch['failures'] = [];
    if (this.greedyBaseline) {
      const best = await clock.time('generation', () => this.greedyCompletions(prompts));
      const s = await clock.time('rewards', () => o.rewards(best.map((b, i) => ({ prompt: prompts[i].text, completion: b.text, meta: { ...prompts[i].meta, completionTokens: b.tokens.length, stopped: b.stopped } }))));
      // a failed baseline got the scorer's fallback like any sample: count it with its prompt's group
      greedyRewards = s.rewards;
      greedyFailures = s.failures;
    }
    return prompts.map((prompt, k) => {
      const at = (xs: readonly number[]) => xs.slice(k * G, (k + 1) * G);
      return {
        prompt,
        completions: completions.slice(k * G, (k + 1) * G),
        texts: texts.slice(k * G, (k + 1) * G),
        rewards: at(scored.rewards),
        bySource: Object.fromEntries(Object.entries(scored.bySource).map(([name, v]) => [name, at(v)])),
        failures: Object.fromEntries(
          Object.keys(scored.bySource).map((name) => [
            name,
            scored.failures.filter((f) => f.source === name && Math.floor(f.index / G) === k).length + greedyFailures.filter((f) => f.source === name && f.index === k).length,
          ]),
        ),
        greedyReward: greedyRewards?.[k],
      };
    });
  }

  /** Log-probs (and, when the scorer makes them, entropies) of every row, [rows, width] in the batch's layout, scored chunk by chunk. */
  private async scoreRows(scorer: ScoringRunner, weights: BoundWeights[], batch: TokenBatch, chunks: readonly number[][]): Promise<{ logp: Float32Array; entropy?: Float32Array }> {
    const logp = new Float32Array(batch.rows * batch.width);
    let entropy: Float32Array | undefined;
    for (const rows of chunks) {
      if (rows.length === 0) continue;
      const t = selectRows(batch, rows);
      const scored = await scorer.score(weights, { input_ids: t.input_ids, attention_mask: t.attention_mask });
      // place back: rows start at column 0 in the batch and in the selection, which only dropped trailing padding
      const T = t.input_ids.dims[1];
      const place = (from: Float32Array, to: Float32Array) => rows.forEach((r, i) => to.set(from.subarray(i * T, (i + 1) * T), r * batch.width));
      place(scored.logp, logp);
      if (scored.entropy) place(scored.entropy, (entropy ??= new Float32Array(batch.rows * batch.width)));
    }
    return { logp, entropy };
  }

  /**
   * G completions per prompt (the group size) sampled from the current weights as rollouts are —
   * same sampling options — without rewards or training (evaluation at the sampling temperature).
   * `key` picks each prompt's random streams: samples depend only on (seed, key, weights), so an
   * evaluation never moves the training's streams. A generation phase of its own.
   */
  async generateSamples(prompts: readonly { ids: readonly number[]; key: number }[]): Promise<{ tokens: number[]; text: string; stopped: boolean }[][]> {
    const o = this.opts;
    const G = o.groupSize;
    const out = await this.sampler.generate(
      this.policyWeights(),
      prompts.map((p) => p.ids),
      { maxNewTokens: o.maxNewTokens, stopIds: o.stopIds, seed: o.seed ?? 0, keys: prompts.map((p) => p.key), weightsVersion: this.trainer.step },
    );
    this.releaseGeneration?.();
    const decoded = out.map((c) => ({ tokens: c.tokens, stopped: c.stopped, text: this.textOf(c) }));
    return prompts.map((_, k) => decoded.slice(k * G, (k + 1) * G));
  }

  /**
   * Greedy completions of `prompts` from the current weights (evaluation; ReMax's baseline): token
   * ids, the decoded text (without the stop token) and whether a stop id ended it. A generation
   * phase of its own: with `releaseGenerationMemory` its memory is freed afterwards.
   */
  async generateGreedy(prompts: readonly { ids: readonly number[] }[]): Promise<{ tokens: number[]; text: string; stopped: boolean }[]> {
    const out = await this.greedyCompletions(prompts);
    this.releaseGeneration?.();
    return out;
  }

  /** {@link generateGreedy} inside a generation phase (ReMax's baseline): nothing released. */
  private async greedyCompletions(prompts: readonly { ids: readonly number[] }[]): Promise<{ tokens: number[]; text: string; stopped: boolean }[]> {
    const out = await this.greedy().generate(
      this.policyWeights(),
      prompts.map((p) => p.ids),
      { maxNewTokens: this.opts.maxNewTokens, stopIds: this.opts.stopIds, seed: 0, keys: prompts.map(() => 0), weightsVersion: this.trainer.step },
    );
    return out.map((c) => ({ tokens: c.tokens, stopped: c.stopped, text: this.textOf(c) }));
  }

  /** A completion's text: its tokens decoded without the stop token that ended it. */
  private textOf(c: { tokens: readonly number[]; stopped: boolean }): string {
    return this.opts.tokenizer.decode(c.stopped ? c.tokens.slice(0, -1) : c.tokens);
  }

  /**
   * Re-scores `batch` with the training policy's forward at the current weights, and the parity of
   * those log-probs with generation's (used by tests and benchmarks).
   */
  async rescore(batch: TokenBatch): Promise<{ logp: Float32Array; parity: { mean: number; maxAbs: number } }> {
    const { logp } = await this.scoreRows(this.policyScorer(), this.policyWeights(), batch, [[...Array(batch.rows).keys()]]);
    return { logp, parity: logpParity(batch, logp) };
  }

  /**
   * The frozen reference's log-probs of `batch`, [rows, width] like {@link rescore}'s (tests,
   * inspection); undefined when the trainer has no reference (no KL).
   */
  async referenceLogprobs(batch: TokenBatch): Promise<Float32Array | undefined> {
    if (!this.refScorer) return undefined;
    return (await this.scoreRows(this.refScorer, [this.reference!], batch, [[...Array(batch.rows).keys()]])).logp;
  }

  /**
   * The frozen reference's device tensors by HF name — in the compute dtype, or with LoRA the
   * float32 base shared with the train step — for memory accounting and tests; undefined without a
   * reference.
   */
  get referenceWeights(): ReadonlyMap<string, DeviceTensor> | undefined {
    return this.reference && new Map(this.reference);
  }

  /** Samples G completions per prompt from the current weights without training (tests, inspection). */
  async sample(prompts: readonly RlPrompt<M>[]): Promise<TokenBatch> {
    const groups = await this.sampleGroups(prompts, new PhaseClock());
    this.releaseGeneration?.();
    const rows = groups.flatMap((g) => g.completions.map((c) => ({ prompt: g.prompt.ids, c })));
    return tokenBatch(
      rows.map((r) => r.prompt),
      rows.map((r) => r.c),
      this.opts.tokenizer.padId,
    );
  }

  /**
   * Host copies for a checkpoint: the trained tensors (adapters with LoRA), AdamW moments, the
   * model's merged weights, optimizer steps and RL steps.
   */
  /** The adaptive KL controller's current β (`kl.target`), for checkpoints; undefined when β is fixed. */
  get adaptiveKlCoef(): number | undefined {
    return this.klController?.value;
  }

  snapshot(): { values: Map<string, Float32Array>; m: Map<string, Float32Array>; v: Map<string, Float32Array>; model: Map<string, Float32Array>; optimizerStep: number; rlStep: number; klCoef?: number } {
    const s = this.trainer.snapshot();
    return { values: s.params, m: s.m, v: s.v, model: this.toMerged(), optimizerStep: s.step, rlStep: this.rlStep, klCoef: this.klController?.value };
  }

  /** The trained parameters (adapters with LoRA). */
  get trainable(): TrainableParam[] {
    return GrpoTrainer.trainableParams(this.opts.config, this.opts.lora);
  }

  /** What a policy of `config` trains: every weight (decay on matrices and embeddings), or the LoRA adapters. */
  static trainableParams(config: DecoderConfig, lora?: LoraConfig): TrainableParam[] {
    return lora ? loraAdapters(config, lora).flatMap((a) => [a.a, a.b]) : paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
  }

  /** Frees every session and device buffer. */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    for (const x of this.owned) x.dispose();
    this.trainer.dispose();
  }
}

/** Metric outputs of `policyLoss` and `rlLoss` that the step turns into its own metrics. */
const BUILTIN_METRICS = new Set(['pg_loss', 'tokens', 'clipped_tokens', 'clipped_low_tokens', 'approx_kl_sum', 'ref_kl_sum', 'entropy_sum', 'logp_parity_sum']);

/** mean exp(|a − b|) and max |a − b| over response tokens, a = `logp`, b = the batch's rollout log-probs. */
export function logpParity(batch: TokenBatch, logp: ArrayLike<number>): { mean: number; maxAbs: number } {
  let sum = 0;
  let n = 0;
  let maxAbs = 0;
  for (let i = 0; i < batch.responseMask.length; i++) {
    if (batch.responseMask[i] === 0n) continue;
    const d = Math.abs(logp[i] - batch.rolloutLogp[i]);
    sum += Math.exp(d);
    maxAbs = Math.max(maxAbs, d);
    n++;
  }
  return { mean: n ? sum / n : NaN, maxAbs };
}

function perSourceStats<M>(groups: readonly SampledGroup<M>[]): Record<string, SourceStats> {
  const names = groups.length ? Object.keys(groups[0].bySource) : [];
  return Object.fromEntries(
    names.map((name) => {
      const xs = groups.flatMap((g) => g.bySource[name]);
      return [name, { mean: mean(xs), std: std(xs), failures: groups.reduce((s, g) => s + (g.failures[name] ?? 0), 0) }];
    }),
  );
}

function hashSeed(seed: number, step: number, epoch: number): number {
  let h = (seed ^ 0x9e3779b9) >>> 0;
  for (const x of [step, epoch]) h = Math.imul(h ^ (x + 0x7f4a7c15), 0x85ebca6b) >>> 0;
  return h;
}

function check(ok: boolean, message: string): void {
  if (!ok) throw new Error(`GrpoTrainer: ${message}`);
}


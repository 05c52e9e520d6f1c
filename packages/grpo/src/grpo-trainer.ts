/**
 * `GrpoTrainer`: the RL loop of the GRPO family, one step at a time. `step()` is its table of
 * contents, one call per stage:
 *
 *   1. rollouts — G completions per prompt from a generator bound to the trainer's current weight
 *      buffers (`generationEngine`: the KV-cache engine — prefill, then bound decode-step runs over
 *      in-place caches — where it runs, else the in-graph generation loop), scored by the reward
 *      scorer (`combineRewards`: graders, format rewards, user functions) on the decoded
 *      completions; with dynamic sampling, more rounds until enough groups have differing rewards;
 *      with `releaseGenerationMemory` the KV engines and the compute-dtype weight copy are freed
 *      once the phase is over;
 *   2. tokens — prompt ids + sampled ids as generated (never re-tokenised), each row contiguous
 *      from column 0 and right-padded (the layout fused attention takes; see rollout-batch.ts);
 *   3. old log-probs — re-scored by the training policy's forward (`oldLogprobs: 'rescore'`, the
 *      default) or taken from generation (`'generation'`); reference log-probs from the frozen
 *      initial weights (a device copy in the compute dtype; with LoRA the base itself) when the KL
 *      needs them;
 *   4. advantages — a KL reward penalty first where the KL is a reward, then a built-in estimator
 *      or the user's function;
 *   5. optimise — `epochs` × `minibatches` optimizer steps through `Trainer` with the RL loss;
 *   6. metrics (grpo-metrics.ts).
 * The next step's generation reads the weights the last update wrote: the trainer's buffers are
 * bound by name, nothing is copied. Options and their defaults are in grpo-options.ts.
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
import { paramSpecs, permutation, type DecoderConfig, type Weights } from '@lathe/models';
import { chooseGenerationEngine, type GenerationEngine, type SamplingOptions } from '@lathe/rollout';
import type { DeviceTensor } from '@lathe/runtime';
import {
  castWeights,
  fullTrainableParams,
  initLora,
  LORA_DROPOUT_KEY,
  loraAdapters,
  loraBaseDtype,
  loraDropoutKey,
  loraWeights,
  mergedLoraWeights,
  mergeLora,
  Trainer,
  uploadLoraBase,
  useFlashAttention,
  type LoraConfig,
  type TrainableParam,
} from '@lathe/train';
import { advantageMatrix, type SequenceAdvantages, type TokenAdvantages } from './advantages';
import { dynamicSampling } from './dynamic-sampling';
import type { ClassmateModel } from './classmate';
import { textClassmate, type ClassmateTokenizer } from './classmate-models';
import { classmateTokenMask } from './classmate-tokens';
import { builtinEstimator, type AdvantageBatch, type AdvantageFunction } from './estimators';
import { logpParity, mean, PhaseClock, rolloutRecords, stepMetrics, type GrpoStepResult, type OffPolicyCounts, type SamplingRounds, type ScoredGroup, type StepAdvantages, type StepLogprobs, type UpdateTotals } from './grpo-metrics';
import { isCustomObjective, resolveGrpoOptions, type FrozenBase, type GrpoResumeState, type GrpoTrainerOptions, type ResolvedGrpoOptions } from './grpo-options';
import { AdaptiveKlController, klPenalisedRewards, meanCompletionKl } from './kl';
import { decoderPolicy } from './policies';
import { lossNormaliser, type PolicyLossConfig } from './policy-loss';
import { ComputeWeights, frozenReference, GenerationRunner, KvGenerationRunner, ScoringRunner, type BoundWeights, type PolicyWeights, type RolloutGenerator, type WeightsGuard } from './policy-sessions';
import type { ScoredBatch } from './rewards';
import { rlLoss } from './rl-loss';
import { explainedVariance, SHARED_VALUE_HEAD, valueLossBuilder, valueModelInit, valueModelParams, ValueScorer, type ValueGraphOptions } from './value-model';
import { evenSplit, responseValues, selectRows, tokenBatch, tokenMasks, trainedValues, type SampledCompletion, type TokenBatch } from './rollout-batch';

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
  /**
   * Off-policy traces of this prompt (with `offPolicy` options; LUFFY): completions written by
   * another policy, as token ids of this policy's tokenizer. The first `offPolicy.traces` join the group.
   */
  offPolicy?: readonly OffPolicyTrace[];
}

/** A completion of a prompt written by another policy (a stronger model's solution). */
export interface OffPolicyTrace {
  /** Response token ids (the stop token included when the trace ends with one), at most `maxNewTokens`. */
  tokens: readonly number[];
  /** Log-probs of the tokens under the policy that wrote it, when known: the shaped term then reads π_θ/π_b instead of π_θ. */
  logprobs?: readonly number[];
  /** Whether it ends with a stop id. */
  stopped: boolean;
  /** Whether it was cut to the length limit (counted in `off_policy/truncated_traces`). */
  truncated?: boolean;
}

/** A group: one prompt's G completions and their rewards. */
interface SampledGroup<M> extends ScoredGroup {
  prompt: RlPrompt<M>;
  greedyReward?: number;
  /** Traces the group lacks (its prompt had fewer than `offPolicy.traces`). */
  missingTraces?: number;
  /** Of its traces, those cut to the length limit. */
  truncatedTraces?: number;
  /** Each reward source's weight (the scorer's `weights`), for the multi-reward estimators. */
  weights?: Record<string, number>;
  /** Per completion, the characters the classmate reward is credited to (the scorer's `classmateChars`). */
  classmateChars?: (number | undefined)[];
}

/** A group of rollouts made outside the trainer, for {@link GrpoTrainer.stepOnRollouts}. */
export interface RolloutGroup<M = unknown> {
  prompt: RlPrompt<M>;
  /** The prompt's completions: token ids, their log-probs under the policy that sampled them (optional), whether a stop token ended them, and the training mask (`SampledCompletion.mask`). */
  completions: readonly { tokens: readonly number[]; logprobs?: readonly number[]; stopped: boolean; mask?: readonly number[]; offPolicy?: boolean }[];
  /** One reward per completion. */
  rewards: readonly number[];
}

/** A generated completion as evaluation and the greedy baseline read it. */
interface DecodedCompletion {
  tokens: number[];
  text: string;
  stopped: boolean;
  /** Generation's log-prob of each token (greedy: the log-softmax of the logits at the chosen token), where the engine gives them. */
  logprobs?: number[];
}

/** What `create` builds and the trainer holds. */
interface GrpoTrainerParts<M> {
  opts: ResolvedGrpoOptions<M>;
  /** The compiled train step and the device-resident parameters and AdamW state. */
  trainer: Trainer;
  /** A LoRA run's frozen base, bound as `base/<name>`; empty otherwise. */
  frozen: Record<string, DeviceTensor>;
  reference: BoundWeights | undefined;
  sampler: RolloutGenerator;
  greedy: () => RolloutGenerator;
  /** A generator of `k` samples per prompt at the rollout's sampling options (self-play classmates), made on first use per k. */
  samplerOf: (k: number) => RolloutGenerator;
  /** Frees generation's device memory between phases (`releaseGenerationMemory`); undefined: keep it. */
  releaseGeneration: (() => void) | undefined;
  policyScorer: () => ScoringRunner;
  refScorer: ScoringRunner | undefined;
  estimate: AdvantageFunction;
  toMerged: () => Map<string, Float32Array>;
  owned: { dispose(): void }[];
  generationEngine: GenerationEngine;
  /** PPO's value model: its train step and its scoring session (`estimator: 'gae'`). */
  critic?: { trainer: Trainer; scorer: ValueScorer };
  /** The KV-cache engine's compute-dtype copy of the policy (undefined with the graph engine). */
  computeWeights?: ComputeWeights;
}

/**
 * The GRPO-family RL loop over a decoder policy on one device. With LoRA the frozen base is on the
 * device once, in the compute dtype (`loraBaseDtype`: with bfloat16 2 bytes a weight, an 8B base
 * 16.4 GB instead of 32.8 in float32; a merged LM-head target stays float32), and the train step,
 * scoring, the KL reference and generation's merge all read that one copy; only the adapters carry
 * float32 master weights and AdamW state.
 */
export class GrpoTrainer<M = unknown> {
  /** The compiled train step and the device-resident parameters and AdamW state. */
  readonly trainer: Trainer;
  /** The backend that generates rollouts and greedy completions. */
  readonly generationEngine: GenerationEngine;
  private readonly opts: ResolvedGrpoOptions<M>;
  private readonly parts: Omit<GrpoTrainerParts<M>, 'opts' | 'trainer' | 'generationEngine'>;
  private rlStep: number;
  /** The KL reward penalty's coefficient controller, when `kl.target` adapts it. */
  private readonly klController: AdaptiveKlController | undefined;
  private disposed = false;

  private constructor({ opts, trainer, generationEngine, ...parts }: GrpoTrainerParts<M>) {
    this.opts = opts;
    this.trainer = trainer;
    this.generationEngine = generationEngine;
    this.parts = parts;
    this.rlStep = opts.resume?.rlStep ?? 0;
    const kl = opts.kl;
    this.klController = kl.target !== undefined ? new AdaptiveKlController(opts.resume?.klCoef ?? kl.coef, kl.target, kl.horizon) : undefined;
  }

  /** Compiles the train step, generation and scoring sessions and uploads the weights. */
  static create<M>(options: GrpoTrainerOptions<M>): GrpoTrainer<M> {
    const o = resolveGrpoOptions(options);
    const { model, device, compute, lora } = o;
    const config = model.config;
    const engine = chooseGenerationEngine(o.generationEngine, config, device.kind, compute, 'generationEngine').engine;
    // the master weights' start, and with LoRA the frozen base the merged model is built from
    const weights = o.frozenBase ? new Map<string, Float32Array>() : model.float32Weights();
    const adapters = lora ? loraAdapters(config, lora) : [];
    const policy = policyWeightsOf(config, lora, compute, o.frozenBase);
    // a dense LoRA base in each tensor's loraBaseDtype, as every graph declares it (policyWeightsOf, frozenReferenceOf)
    const frozen: Record<string, DeviceTensor> = o.frozenBase
      ? o.frozenBase.upload(device, compute)
      : lora
        ? Object.fromEntries(paramSpecs(config).map((s) => [`base/${s.name}`, uploadLoraBase(device, s.name, { data: weights.get(s.name)!, dims: s.shape }, adapters, compute)]))
        : {};
    // Lathe's attention kernels replace flash attention in the step and scoring graphs, whose sessions register their custom ops
    const kernel = o.attentionKernel;
    const flashAttention = kernel !== undefined || useFlashAttention(o.attention, device.kind, compute);
    const session = kernel ? { ...o.session, customOpDomains: [...(o.session?.customOpDomains ?? []), ...kernel.customOpDomains] } : o.session;
    const attentionKernel = kernel ? { attentionKernel: kernel.attend } : {};
    const logprobKernel = kernel?.logprobKernel ? { logprobKernel: kernel.logprobKernel } : {};
    const ropeKernel = kernel?.ropeKernel ? { ropeKernel: kernel.ropeKernel } : {};
    const swigluKernel = kernel?.swigluKernel ? { swigluKernel: kernel.swigluKernel } : {};

    // The train step with the RL loss over the same policy builder the scoring graph uses.
    const klInLoss = o.kl.coef > 0 && o.kl.mode === 'loss';
    const custom = isCustomObjective(o.loss) ? o.loss : undefined;
    const lossConfig = o.loss as PolicyLossConfig;
    const lossReadsEntropy = custom !== undefined || lossConfig.entropyCoef !== 0;
    const entropyInStep = o.entropy && (lossReadsEntropy || o.oldLogprobs === 'generation');
    const readsReference = custom ? custom.readsReference : klInLoss;
    // PPO's critic on the policy's trunk: a value head trained in the policy's step, scored in its pass
    const shared = o.valueModel?.trunk === 'shared';
    const valueHead = shared ? SHARED_VALUE_HEAD : undefined;
    const loss = rlLoss(
      decoderPolicy(config, { compute, chunk: o.chunk, temperature: o.sampling.temperature, entropy: entropyInStep, weights: policy.train, recompute: o.gradientCheckpointing, flashAttention, ...attentionKernel, ...logprobKernel, ...ropeKernel, ...swigluKernel, valueHead }),
      custom ? custom.objective : { ...lossConfig, klCoef: klInLoss ? o.kl.coef : 0, klEstimator: o.kl.estimator, ...(o.offPolicy ? { offPolicy: { term: o.offPolicy.term, gamma: o.offPolicy.gamma, sftCoef: o.offPolicy.sftCoef } } : {}) },
      { reference: readsReference, offPolicy: Boolean(o.offPolicy), ...(shared ? { value: { coef: o.valueModel!.coef, clip: o.valueModel!.clip } } : {}) },
    );
    const head = { name: SHARED_VALUE_HEAD, shape: [1, config.hiddenSize], decay: true };
    const fresh = lora ? initLora(adapters, o.seed) : shared ? new Map([...weights, [head.name, new Float32Array(config.hiddenSize)]]) : weights;
    const init = o.resume ? { params: o.resume.params, m: o.resume.m, v: o.resume.v, step: o.resume.optimizerStep } : { params: fresh };
    const trainer = Trainer.create({ params: [...policy.weights.trainable, ...(shared ? [head] : [])], loss, optimizer: o.optimizer }, init, { device, microBatches: o.microBatches, frozen, session, ...o.dataParallel?.trainerOptions });

    // Generation and scoring sessions, fed the trainer's buffers by binding.
    const generation = generationRunners(o, engine, policy.weights);
    const owned = generation.owned;
    const scoring = { temperature: o.sampling.temperature, compute, chunk: o.chunk, flashAttention, ...attentionKernel, ...logprobKernel, ...ropeKernel, ...swigluKernel, session };
    let scorer: ScoringRunner | undefined;
    const policyScorer = () => {
      if (!scorer) owned.push((scorer = ScoringRunner.create(device, config, policy.weights, { ...scoring, entropy: o.entropy && !entropyInStep, valueHead })));
      return scorer;
    };
    const reference = o.kl.coef > 0 || readsReference ? frozenReferenceOf(o, trainer, frozen, owned) : undefined;
    const refScorer = reference && ScoringRunner.create(device, config, reference.policy, scoring);
    if (refScorer) owned.push(refScorer);
    owned.push({ dispose: () => Object.values(frozen).forEach((t) => t.dispose()) });

    const estimate = typeof o.estimator === 'function' ? o.estimator : builtinEstimator(o.estimator, { gae: o.valueModel }).estimate;
    const critic = o.valueModel && !shared ? criticOf({ ...o, session }, weights, { flashAttention, ...attentionKernel, ...ropeKernel, ...swigluKernel }) : undefined;
    if (critic) owned.push(critic.scorer, critic.trainer);
    const toMerged = () => {
      const snap = trainer.downloadParams();
      snap.delete(SHARED_VALUE_HEAD);
      return lora ? mergeLora(o.frozenBase ? o.frozenBase.dense() : weights, snap, adapters, lora) : snap;
    };
    return new GrpoTrainer({ opts: o, trainer, frozen, reference: reference?.weights, ...generation, policyScorer, refScorer, estimate, toMerged, generationEngine: engine, critic });
  }

  /**
   * The policy as its own classmate (the self-play variant): `k` continuations of each text, encoded
   * with `tokenizer` (the policy's), sampled at the rollout's sampling options from the weights the
   * trainer holds when it is called — inside a step's reward scoring, the weights that sampled the
   * step, not yet updated. Pass it to `classmateScorer` before the first step (it reads the trainer
   * only when called).
   */
  static selfPlayClassmate<M>(trainer: () => GrpoTrainer<M>, o: { tokenizer: ClassmateTokenizer; name?: string; maxNewTokens?: number; weight?: number }): ClassmateModel {
    return textClassmate({
      name: o.name ?? 'self',
      tokenizer: o.tokenizer,
      weight: o.weight,
      where: 'self-play',
      sample: async (prompts, k, seed) => {
        const t = trainer();
        const out = await t.parts.samplerOf(k).generate(t.policyWeights(), prompts, { ...t.call(prompts.map((_, i) => i), seed), maxNewTokens: o.maxNewTokens ?? t.opts.maxNewTokens });
        return prompts.map((_, i) => out.slice(i * k, (i + 1) * k));
      },
    });
  }

  /** RL steps taken. */
  get steps(): number {
    return this.rlStep;
  }

  /**
   * One RL step at learning rate `lr`. `prompts` gives each sampling round's prompts (round 0, and
   * more rounds with dynamic sampling); an array is round 0's prompts.
   */
  async step(prompts: readonly RlPrompt<M>[] | ((round: number) => readonly RlPrompt<M>[]), lr: number): Promise<GrpoStepResult> {
    if (this.disposed) throw new Error('GrpoTrainer: disposed');
    const clock = new PhaseClock();
    const rounds = typeof prompts === 'function' ? prompts : (round: number) => (round === 0 ? prompts : []);
    // 1. Rollouts from the current weights, scored by the reward functions.
    const sampled = await this.rollouts(rounds, clock);
    return this.learn(sampled, lr, clock);
  }

  /**
   * One RL step on rollouts made elsewhere — a multi-turn or tool-using loop, or a trajectory file
   * (`rolloutGroups`) — instead of sampled here: generation and the reward functions are skipped,
   * everything after them is {@link step}'s. Each group holds completions of its prompt with their
   * rewards, `groupSize` of them or any other number (the estimator then groups them by id); a completion's `mask` marks the tokens the policy did not sample (tool or
   * environment output), which condition the rest but get no loss. Completions without `logprobs`
   * need `oldLogprobs: 'rescore'` (the default).
   */
  async stepOnRollouts(groups: readonly RolloutGroup<M>[], lr: number): Promise<GrpoStepResult> {
    if (this.disposed) throw new Error('GrpoTrainer: disposed');
    if (groups.length === 0) throw new Error('stepOnRollouts: no groups');
    if (this.opts.greedyBaseline) throw new Error("stepOnRollouts: ReMax's greedy baseline is sampled by the trainer; rollouts made elsewhere cannot carry it (turn greedyBaseline off)");
    const scored = groups.map((g, i): SampledGroup<M> => {
      if (g.completions.length === 0) throw new Error(`stepOnRollouts: group ${i} has no completions`);
      if (g.rewards.length !== g.completions.length) throw new Error(`stepOnRollouts: group ${i} has ${g.rewards.length} rewards for ${g.completions.length} completions`);
      const bad = g.rewards.findIndex((r) => !Number.isFinite(r));
      if (bad >= 0) throw new Error(`stepOnRollouts: group ${i}, completion ${bad}: reward ${g.rewards[bad]} is not a finite number`);
      const offPolicy = g.completions.map((c, j) => {
        if (c.offPolicy && !this.opts.offPolicy) throw new Error(`stepOnRollouts: group ${i}, completion ${j} is off-policy, which needs the trainer's offPolicy options (the loss's off-policy term)`);
        return Boolean(c.offPolicy);
      });
      const completions = g.completions.map((c, j) => {
        if (!c.logprobs && !offPolicy[j] && this.opts.oldLogprobs === 'generation') throw new Error(`stepOnRollouts: group ${i}, completion ${j} has no logprobs, which oldLogprobs 'generation' trains against (leave oldLogprobs at 'rescore')`);
        return { tokens: [...c.tokens], logprobs: c.logprobs ? [...c.logprobs] : c.tokens.map(() => 0), stopped: c.stopped, ...(c.mask ? { mask: c.mask } : {}), ...(c.logprobs || offPolicy[j] ? {} : { logprobsUnknown: true }) };
      });
      return { prompt: g.prompt, completions, texts: completions.map((c) => this.textOf(c)), rewards: [...g.rewards], bySource: { reward: [...g.rewards] }, failures: { reward: 0 }, ...(offPolicy.some(Boolean) ? { offPolicy } : {}) };
    });
    const given = groups.every((g) => g.completions.every((c) => c.logprobs || c.offPolicy));
    return this.learn({ groups: scored, rounds: 1, dropped: 0, shortfall: 0 }, lr, new PhaseClock(), given);
  }

  /** Steps 2–6 of {@link step} on scored rollouts: `rolloutLogprobs` false when the rollouts carry no generation log-probs to compare with. */
  private async learn(sampled: SamplingRounds<SampledGroup<M>>, lr: number, clock: PhaseClock, rolloutLogprobs = true): Promise<GrpoStepResult> {
    // 2. The token batch: prompt ids + sampled ids exactly as generated, rows right-padded.
    const batch = this.tokens(sampled.groups);
    // 3. Old log-probs (re-scored by the training policy, or generation's) and the reference's.
    const logps = await this.oldAndReferenceLogprobs(batch, sampled.groups, clock);
    if (!rolloutLogprobs) logps.parity = undefined;
    // …and the value model's values (PPO), for GAE.
    const values = logps.values ?? (this.parts.critic && (await clock.time('scoring', () => this.criticValues(batch))));
    // 4. Advantages, after the KL penalty where the KL is a reward.
    const share = await this.rowShare(batch);
    const advantages = await this.advantages(sampled.groups, batch, logps, values, share);
    // 5. epochs × minibatches optimizer steps on the stored batch: the value model's first (a NaN
    // value loss refuses the step before the policy moves), then the policy's unless the critic is warming up.
    const returns = values && advantageMatrix({ ...(advantages.estimate as TokenAdvantages), advantages: (advantages.estimate as TokenAdvantages).returns }, batch.responseMask, [batch.rows, batch.width]);
    let critic = values && this.parts.critic ? await this.optimiseCritic(batch, values, returns!, lr, clock, share) : undefined;
    const frozen = this.rlStep < (this.opts.valueModel?.warmupSteps ?? 0);
    const shared = values && !this.parts.critic ? { old_values: values, returns: returns! } : undefined;
    const updates = frozen ? { updates: 0, nonfinite: 0, lossSum: 0, gradNormSum: 0, sums: {} } : await this.optimise(batch, sampled.groups, logps, advantages.matrix, lr, clock, share, shared);
    if (values) critic = { ...criticFit(batch, values, advantages.estimate as TokenAdvantages), ...(critic ?? sharedCriticMetrics(updates, lr)) };
    this.rlStep++;

    // 6. Metrics and the rollouts for logs.
    const metrics = stepMetrics({ rlStep: this.rlStep, lr, groupSize: this.opts.groupSize, sampled, batch, logps, advantages, updates, klEstimator: this.opts.kl.estimator, clock, offPolicy: this.opts.offPolicy && offPolicyCounts(sampled.groups) });
    if (critic) Object.assign(metrics, critic, { 'value/policy_frozen': frozen ? 1 : 0 });
    return { metrics, rollouts: rolloutRecords(sampled.groups, advantages.perRow, { logprobs: logps.oldRows, entropies: logps.entropyRows }) };
  }

  /**
   * The step's groups: round 0's prompts sampled and scored, or with dynamic sampling rounds until
   * enough groups have differing rewards. Ends the generation phase.
   */
  private async rollouts(next: (round: number) => readonly RlPrompt<M>[], clock: PhaseClock): Promise<SamplingRounds<SampledGroup<M>>> {
    const first = next(0);
    const dynamic = this.opts.dynamicSampling;
    let sampled: SamplingRounds<SampledGroup<M>>;
    if (dynamic) {
      const r = await dynamicSampling((round) => this.sampleGroups(round === 0 ? first : next(round), clock), { targetGroups: first.length, maxRounds: dynamic.maxRounds });
      if (r.groups.length === 0) throw new Error(`dynamic sampling: every group of ${r.rounds} round(s) had all-equal rewards; nothing to train on (raise maxRounds or check the rewards)`);
      sampled = { groups: r.groups, rounds: r.rounds, dropped: r.dropped, shortfall: first.length - r.groups.length };
    } else sampled = { groups: await this.sampleGroups(first, clock), rounds: 1, dropped: 0, shortfall: 0 };
    // the generation phase is over (every sampling round, ReMax's greedy baseline)
    this.parts.releaseGeneration?.();
    return sampled;
  }

  /** The token batch of `groups`: each prompt's ids then a completion's ids, one row per completion. */
  private tokens(groups: readonly SampledGroup<M>[]): TokenBatch {
    const rows = groups.flatMap((g) => g.completions.map((c) => ({ prompt: g.prompt.ids, c })));
    return tokenBatch(
      rows.map((r) => r.prompt),
      rows.map((r) => r.c),
      this.opts.tokenizer.padId,
    );
  }

  /** Old log-probs (re-scored, or generation's), their parity with generation's, and the reference's, scored in the micro-batches' row chunks. */
  private async oldAndReferenceLogprobs(batch: TokenBatch, groups: readonly SampledGroup<M>[], clock: PhaseClock): Promise<StepLogprobs> {
    const chunks = evenSplit([...Array(batch.rows).keys()], this.minibatchCount(batch.rows) * this.trainer.microBatches);
    let old = batch.rolloutLogp;
    let parity: StepLogprobs['parity'];
    let entropy: number | undefined;
    let entropyRows: number[][] | undefined;
    const off = offPolicyFlags(groups);
    let entropySplit: StepLogprobs['entropySplit'];
    let values: Float32Array | undefined;
    if (this.opts.oldLogprobs === 'rescore') {
      const scored = await clock.time('scoring', () => this.scoreRows(this.parts.policyScorer(), this.scoringWeights(), batch, chunks));
      old = scored.logp;
      values = scored.values;
      if (scored.entropy) {
        const rows = trainedValues(batch, responseValues(batch, scored.entropy));
        entropy = mean(rows.flat());
        entropyRows = responseValues(batch, scored.entropy);
        if (off) entropySplit = { on: mean(rows.filter((_, r) => !off[r]).flat()), off: mean(rows.filter((_, r) => off[r]).flat()) };
      }
      // a trace's old log-prob is its behaviour policy's (0 when unknown: the shaped term then reads π_θ)
      if (off) off.forEach((isOff, r) => isOff && old.set(batch.rolloutLogp.subarray(r * batch.width, (r + 1) * batch.width), r * batch.width));
      parity = logpParity(batch, old, unweightedRows(groups));
    }
    const { refScorer, reference } = this.parts;
    const ref = refScorer ? (await clock.time('scoring', () => this.scoreRows(refScorer, [reference!], batch, chunks))).logp : undefined;
    if (values) {
      const bad = responseValues(batch, values).findIndex((row) => row.some((x) => !Number.isFinite(x)));
      if (bad >= 0) throw new Error(`value model: completion ${bad} has a non-finite value at RL step ${this.rlStep + 1}; the step is refused (nothing was updated)`);
    }
    return { old, ref, oldRows: responseValues(batch, old), refRows: ref && responseValues(batch, ref), parity, entropy, entropySplit, ...(entropyRows ? { entropyRows } : {}), ...(values ? { values } : {}) };
  }

  /**
   * The estimator's advantages as a [rows, width] matrix. A KL reward penalty first shapes the
   * rewards per token (and moves an adaptive β); uniform groups are still decided on the outcome
   * rewards, which the estimators get as `rewards`.
   */
  private async advantages(groups: readonly SampledGroup<M>[], batch: TokenBatch, logps: StepLogprobs, values: Float32Array | undefined, share: RowShare): Promise<StepAdvantages> {
    const { kl } = this.opts;
    const rewards = groups.flatMap((g) => g.rewards);
    const klCoef = kl.coef > 0 ? (this.klController?.value ?? kl.coef) : 0;
    const mask = tokenMasks(batch);
    const penalty = kl.coef > 0 && kl.mode === 'reward' ? klPenalisedRewards({ rewards, logp: logps.oldRows, refLogp: logps.refRows!, mask }, { coef: klCoef, estimator: kl.estimator }) : undefined;
    if (this.klController) this.klController.update(meanCompletionKl(trainedValues(batch, logps.oldRows), trainedValues(batch, logps.refRows!), kl.estimator), batch.rows);
    // groups of other sizes (rollouts made elsewhere) are named by id, in order
    const unequal = groups.some((g) => g.completions.length !== this.opts.groupSize);
    const off = offPolicyFlags(groups);
    const onPolicyStats = off && (this.opts.offPolicy?.advantageStats === 'on-policy' || this.opts.offPolicy?.term === 'sft');
    const estimate = await this.estimateOverRanks(share, {
      ...(off ? { offPolicy: off } : {}),
      ...(onPolicyStats ? { statsFrom: off.map((x) => !x) } : {}),
      ...(values ? { values: responseValues(batch, values) } : {}),
      rewards,
      groupSize: this.opts.groupSize,
      groupIds: unequal ? groups.flatMap((g, k) => g.completions.map(() => k)) : undefined,
      lengths: batch.lengths,
      tokenRewards: penalty?.tokenPenalties,
      greedyRewards: this.opts.greedyBaseline ? groups.map((g) => g.greedyReward!) : undefined,
      logp: logps.oldRows,
      refLogp: logps.refRows,
      ...this.componentRewards(groups),
    }, groups.length);
    return {
      estimate,
      matrix: advantageMatrix(estimate, batch.responseMask, [batch.rows, batch.width]),
      perRow: estimate.kind === 'sequence' ? estimate.advantages : estimate.advantages.map((a) => mean(a)),
      klCoef,
    };
  }

  /** The groups' per-source rewards, weights and classmate token masks, for the multi-reward estimators (classmate.ts, gdpo.ts). */
  private componentRewards(groups: readonly SampledGroup<M>[]): Pick<AdvantageBatch, 'components' | 'componentWeights' | 'classmateMask'> {
    const names = Object.keys(groups[0]?.bySource ?? {});
    const components = Object.fromEntries(names.map((k) => [k, groups.flatMap((g) => g.bySource[k] ?? g.rewards.map(() => 0))]));
    const partial = groups.some((g) => g.classmateChars?.some((c) => c !== undefined));
    const classmateMask = partial
      ? groups.flatMap((g) => g.completions.map((c, j) => classmateTokenMask(c.tokens, g.classmateChars?.[j], (ids) => this.opts.tokenizer.decode(ids))))
      : undefined;
    return { components, ...(groups[0]?.weights ? { componentWeights: groups[0].weights } : {}), ...(classmateMask ? { classmateMask } : {}) };
  }

  /** `epochs` × `minibatches` optimizer steps on the stored batch, each over its micro-batches. */
  private async optimise(batch: TokenBatch, groups: readonly SampledGroup<M>[], logps: StepLogprobs, advantages: Float32Array, lr: number, clock: PhaseClock, share: RowShare, valueTargets?: { old_values: Float32Array; returns: Float32Array }): Promise<UpdateTotals> {
    const o = this.opts;
    const aggregation = o.loss.aggregation;
    const lossScaleFactor = isCustomObjective(o.loss) ? undefined : o.loss.lossScaleFactor;
    const extra: Record<string, Float32Array> = { old_logp: logps.old, advantages, ...(logps.ref ? { ref_logp: logps.ref } : {}), ...(o.offPolicy ? { off_policy: offPolicyMatrix(batch, offPolicyFlags(groups)) } : {}), ...valueTargets };
    // Truncated importance sampling reads the engine's log-probs. Rows with none to read — a trace
    // (its behaviour policy's are its old log-probs) or a rollout made elsewhere without them — are
    // fed their old log-probs, so their weight is exactly 1 (counted in rollout_is_unweighted_tokens).
    if (this.trainer.batchInputs.includes('rollout_logp')) {
      const flags = unweightedRows(groups);
      const rows = flags && offPolicyMatrix(batch, flags);
      extra.rollout_logp = rows ? logps.old.map((x, i) => (rows[i] ? x : batch.rolloutLogp[i])) : batch.rolloutLogp;
    }
    const totals: UpdateTotals = { updates: 0, nonfinite: 0, lossSum: 0, gradNormSum: 0, sums: {} };
    for (let epoch = 0; epoch < o.epochs; epoch++) {
      for (const { mb, global } of this.minibatches(share, batch.rows, o.seed, epoch)) {
        // normalisers count the whole minibatch, every rank's rows of it
        const normaliser = lossNormaliser(aggregation, global.map((r) => share.lengths[r]), { maxLength: o.maxNewTokens, lossScaleFactor });
        // the value loss is a mean over the minibatch's response tokens, whatever the policy's aggregation
        const valueNormaliser = Math.max(1, global.reduce((n, r) => n + share.lengths[r], 0));
        const micro = evenSplit(mb, this.trainer.microBatches).map((part, j) => {
          const t = selectRows(batch, part, extra);
          const fed = (name: string) =>
            name === 'loss_normaliser' || name === 'value_normaliser'
              ? { data: Float32Array.from([name === 'loss_normaliser' ? normaliser : valueNormaliser]), dims: [] }
              : name === LORA_DROPOUT_KEY
                ? loraDropoutKey(o.seed, this.trainer.step, share.rank * this.trainer.microBatches + j) // masks resume exactly: a function of (seed, optimizer step, micro-batch)
                : t[name];
          return Object.fromEntries(this.trainer.batchInputs.map((name) => [name, fed(name)]));
        });
        const r = await this.trainer.trainStepAsync(micro, lr);
        clock.ms.training += r.runMs;
        if (valueTargets && !Number.isFinite(r.metrics.vf_loss)) {
          throw new Error(`value model: the value loss is ${r.metrics.vf_loss} at RL step ${this.rlStep + 1} (epoch ${epoch + 1}, update ${totals.updates + 1}); the step is refused: this update was not applied (a shared trunk's earlier updates of the step were)`);
        }
        totals.updates++;
        if (!Number.isFinite(r.loss)) {
          totals.nonfinite++;
          continue;
        }
        totals.first ??= r.metrics;
        totals.lossSum += r.loss;
        totals.gradNormSum += r.gradNorm;
        for (const [k, v] of Object.entries(r.metrics)) totals.sums[k] = (totals.sums[k] ?? 0) + v;
      }
    }
    return totals;
  }

  /** The value model's V of every row, [rows, width] in the batch's layout; a non-finite value refuses the step. */
  private async criticValues(batch: TokenBatch): Promise<Float32Array> {
    const { trainer, scorer } = this.parts.critic!;
    const out = new Float32Array(batch.rows * batch.width);
    for (const rows of evenSplit([...Array(batch.rows).keys()], this.minibatchCount(batch.rows) * this.trainer.microBatches)) {
      if (rows.length === 0) continue;
      const t = selectRows(batch, rows);
      const v = await scorer.score(trainer.params(), t);
      const T = t.input_ids.dims[1];
      rows.forEach((r, i) => out.set(v.subarray(i * T, (i + 1) * T), r * batch.width));
    }
    const bad = responseValues(batch, out).findIndex((row) => row.some((x) => !Number.isFinite(x)));
    if (bad >= 0) throw new Error(`value model: completion ${bad} has a non-finite value at RL step ${this.rlStep + 1}; the step is refused (nothing was updated)`);
    return out;
  }

  /**
   * `epochs` × `minibatches` steps of the value model towards the GAE returns (clipped around the
   * values they were computed with), at `lrScale` × `lr`. A non-finite value loss refuses the step
   * — an error naming it, thrown before the policy's updates — and is never applied.
   */
  private async optimiseCritic(batch: TokenBatch, values: Float32Array, returns: Float32Array, lr: number, clock: PhaseClock, share: RowShare): Promise<Record<`value/${string}`, number>> {
    const o = this.opts;
    const critic = this.parts.critic!.trainer;
    const extra = { old_values: values, returns };
    let loss = 0;
    let gradNorm = 0;
    let clipped = 0;
    let tokens = 0;
    let updates = 0;
    for (let epoch = 0; epoch < o.epochs; epoch++) {
      for (const { mb, global } of this.minibatches(share, batch.rows, o.seed + 1, epoch)) {
        const normaliser = Math.max(1, global.reduce((n, r) => n + share.lengths[r], 0));
        const micro = evenSplit(mb, critic.microBatches).map((part) => {
          const t = selectRows(batch, part, extra);
          return Object.fromEntries(critic.batchInputs.map((name) => [name, name === 'loss_normaliser' ? { data: Float32Array.from([normaliser]), dims: [] } : t[name]]));
        });
        const r = await critic.trainStepAsync(micro, lr * o.valueModel!.lrScale);
        clock.ms.training += r.runMs;
        if (!Number.isFinite(r.loss)) throw new Error(`value model: the value loss is ${r.loss} at RL step ${this.rlStep + 1} (epoch ${epoch + 1}, update ${updates + 1}); the step is refused: the policy was not updated and the value model keeps its last finite weights`);
        updates++;
        loss += r.loss;
        gradNorm += r.gradNorm;
        clipped += r.metrics.vf_clipped_tokens;
        tokens += r.metrics.vf_tokens;
      }
    }
    return {
      'value/loss': loss / updates,
      'value/grad_norm': gradNorm / updates,
      'value/clip_fraction': tokens ? clipped / tokens : NaN,
      'value/lr': lr * o.valueModel!.lrScale,
    };
  }

  /** The policy's weights now, as sessions bind them: the trainer's buffers (and a LoRA base), less a shared critic's value head. */
  private policyWeights(): BoundWeights[] {
    const params = this.trainer.params();
    if (params.has(SHARED_VALUE_HEAD)) params.delete(SHARED_VALUE_HEAD);
    return [params, Object.entries(this.parts.frozen)];
  }

  /** What the policy's scoring pass binds: the policy's weights, and a shared critic's value head. */
  private scoringWeights(): BoundWeights[] {
    const head = this.trainer.params().get(SHARED_VALUE_HEAD);
    return head ? [...this.policyWeights(), [[SHARED_VALUE_HEAD, head]]] : this.policyWeights();
  }

  /**
   * Where this rank's rows sit among every rank's (a data-parallel step), with every row's trained
   * length: what the minibatches and their normalisers are made of. Alone: this batch's.
   */
  private async rowShare(batch: TokenBatch): Promise<RowShare> {
    const dp = this.opts.dataParallel;
    if (!dp || dp.worldSize === 1) return { rank: 0, offset: 0, counts: [batch.rows], lengths: [...batch.trainedLengths] };
    const parts = (await dp.allGatherBytes(new TextEncoder().encode(JSON.stringify(batch.trainedLengths)))).map((b) => JSON.parse(new TextDecoder().decode(b)) as number[]);
    const counts = parts.map((p) => p.length);
    if (counts.some((n) => n !== counts[0])) throw new Error(`data parallelism: the ranks' batches hold ${counts.join(', ')} completions; every rank needs the same number (an equal share of the prompts, whole groups)`);
    return { rank: dp.rank, offset: counts.slice(0, dp.rank).reduce((a, b) => a + b, 0), counts, lengths: parts.flat() };
  }

  /**
   * The minibatches of an epoch: every row of every rank in one seeded order (the one order of a
   * single process), each rank's rows in that order split evenly into the minibatches. `mb` is this
   * rank's part (its row indices), `global` the whole minibatch (indices into `share.lengths`). On
   * one process this is the order split into minibatches; with one minibatch, every world size's
   * minibatch is the whole batch.
   */
  private minibatches(share: RowShare, rows: number, seed: number, epoch: number): { mb: number[]; global: number[] }[] {
    const total = share.lengths.length;
    const order = this.opts.shuffle ? permutation(total, hashSeed(seed, this.rlStep, epoch)) : [...Array(total).keys()];
    const M = this.minibatchCount(rows);
    let start = 0;
    const perRank = share.counts.map((n) => {
      const from = start;
      start += n;
      return evenSplit(order.filter((g) => g >= from && g < from + n), M);
    });
    return Array.from({ length: M }, (_, k) => ({ mb: perRank[share.rank][k].map((g) => g - share.offset), global: perRank.flatMap((p) => p[k]) }));
  }

  /**
   * The estimator over every rank's rows (gathered in rank order, groups renamed per rank), this
   * rank's rows of the result: batch-level statistics (GDPO's batch normalisation, REINFORCE++'s
   * whitening, GAE's) are the whole batch's, as on one process. `groups` counts this rank's groups.
   */
  private async estimateOverRanks(share: RowShare, batch: AdvantageBatch, groups: number): Promise<SequenceAdvantages | TokenAdvantages> {
    const dp = this.opts.dataParallel;
    if (!dp || dp.worldSize === 1) return this.parts.estimate(batch);
    const parts = (await dp.allGatherBytes(new TextEncoder().encode(JSON.stringify({ ...batch, groups })))).map((b) => JSON.parse(new TextDecoder().decode(b)) as AdvantageBatch & { groups: number });
    const rows = batch.rewards.length;
    const cat = (key: keyof AdvantageBatch) => (parts[0][key] === undefined ? undefined : parts.flatMap((p) => p[key] as unknown[]));
    const all: Record<string, unknown> = { ...parts[0] };
    for (const key of ['rewards', 'lengths', 'tokenRewards', 'logp', 'refLogp', 'offPolicy', 'values', 'classmateMask', 'statsFrom', 'greedyRewards'] as const) all[key] = cat(key);
    // a rank's groups are consecutive runs of groupSize, or named by its own ids: name them per rank
    if (parts.some((p) => p.groupIds)) all.groupIds = parts.flatMap((p, r) => (p.groupIds ?? p.rewards.map((_, i) => Math.floor(i / p.groupSize))).map((id) => `${r}/${id}`));
    if (batch.components) all.components = Object.fromEntries(Object.keys(batch.components).map((k) => [k, parts.flatMap((p) => p.components![k])]));
    delete all.groups;
    const est = this.parts.estimate(all as unknown as AdvantageBatch);
    const mine = <T>(xs: T[]) => xs.slice(share.offset, share.offset + rows);
    return est.kind === 'sequence' ? { ...est, advantages: mine(est.advantages) } : { ...est, advantages: mine(est.advantages), returns: mine(est.returns) };
  }

  /** Minibatches per epoch for a batch of `rows` (fewer when a dynamic-sampling batch is too small to split). */
  private minibatchCount(rows: number): number {
    const fit = Math.floor(rows / this.trainer.microBatches);
    if (fit < 1) throw new Error(`a batch of ${rows} completions cannot fill ${this.trainer.microBatches} micro-batches`);
    return Math.min(this.opts.minibatches, fit);
  }

  /**
   * G completions of each prompt (one generation run per `promptsPerRun`), decoded and scored; with
   * off-policy traces, G − n_off samples followed by up to n_off of the prompt's traces.
   */
  private async sampleGroups(prompts: readonly RlPrompt<M>[], clock: PhaseClock): Promise<SampledGroup<M>[]> {
    if (prompts.length === 0) return [];
    const o = this.opts;
    const n = o.offPolicy?.traces ?? 0;
    const S = o.groupSize - n;
    const sampled = await clock.time('generation', () => this.parts.sampler.generate(this.policyWeights(), prompts.map((p) => p.ids), this.call(prompts.map((p) => p.key))));
    const perPrompt = prompts.map((p, k) => [...sampled.slice(k * S, (k + 1) * S), ...(n ? (p.offPolicy ?? []).slice(0, n).map((t, j) => this.traceCompletion(p, j, t)) : [])]);
    const groupOf = perPrompt.flatMap((cs, k) => cs.map(() => k));
    const starts = perPrompt.map((_, k) => groupOf.indexOf(k));
    const completions = perPrompt.flat();
    const texts = completions.map((c) => this.textOf(c));
    const scored = await clock.time('rewards', () => o.rewards(completions.map((c, r) => this.rewardSample(prompts[groupOf[r]], { ...c, text: texts[r] }))));
    let greedyRewards: number[] | undefined;
    let greedyFailures: ScoredBatch['failures'] = [];
    if (o.greedyBaseline) {
      const best = await clock.time('generation', () => this.greedyCompletions(prompts));
      const s = await clock.time('rewards', () => o.rewards(best.map((b, i) => this.rewardSample(prompts[i], b))));
      // a failed baseline got the scorer's fallback like any sample: count it with its prompt's group
      greedyRewards = s.rewards;
      greedyFailures = s.failures;
    }
    return prompts.map((prompt, k) => {
      const size = perPrompt[k].length;
      const at = <T>(xs: readonly T[]) => xs.slice(starts[k], starts[k] + size);
      return {
        prompt,
        completions: at(completions),
        texts: at(texts),
        rewards: at(scored.rewards),
        bySource: Object.fromEntries(Object.entries(scored.bySource).map(([name, v]) => [name, at(v)])),
        failures: Object.fromEntries(
          Object.keys(scored.bySource).map((name) => [
            name,
            scored.failures.filter((f) => f.source === name && groupOf[f.index] === k).length + greedyFailures.filter((f) => f.source === name && f.index === k).length,
          ]),
        ),
        greedyReward: greedyRewards?.[k],
        ...(scored.weights ? { weights: scored.weights } : {}),
        ...(scored.classmateChars ? { classmateChars: at(scored.classmateChars) } : {}),
        ...(n ? { offPolicy: perPrompt[k].map((_, j) => j >= S), missingTraces: n - (size - S), truncatedTraces: (prompt.offPolicy ?? []).slice(0, n).filter((t) => t.truncated).length } : {}),
      };
    });
  }

  /** Trace `j` of `prompt` as a completion row: its behaviour log-probs, or 0 (the shaped term then reads π_θ). */
  private traceCompletion(prompt: RlPrompt<M>, j: number, t: OffPolicyTrace): SampledCompletion {
    const where = `prompt ${prompt.index ?? prompt.key}, off-policy trace ${j}`;
    if (t.tokens.length === 0) throw new Error(`GrpoTrainer: ${where} has no tokens`);
    if (t.tokens.length > this.opts.maxNewTokens) throw new Error(`GrpoTrainer: ${where} has ${t.tokens.length} tokens, over maxNewTokens ${this.opts.maxNewTokens} (truncate or skip it first)`);
    if (t.logprobs && t.logprobs.length !== t.tokens.length) throw new Error(`GrpoTrainer: ${where} has ${t.tokens.length} tokens but ${t.logprobs.length} log-probs`);
    return { tokens: [...t.tokens], logprobs: t.logprobs ? [...t.logprobs] : t.tokens.map(() => 0), stopped: t.stopped };
  }

  /** What the reward scorer reads of a completion of `prompt`. */
  private rewardSample(prompt: RlPrompt<M>, c: { tokens: readonly number[]; text: string; stopped: boolean }) {
    return { prompt: prompt.text, completion: c.text, meta: { ...prompt.meta, completionTokens: c.tokens.length, stopped: c.stopped } };
  }

  /** A generation call at the current weights with each prompt's noise key. */
  private call(keys: readonly number[], seed = this.opts.seed) {
    return { maxNewTokens: this.opts.maxNewTokens, stopIds: this.opts.stopIds, seed, keys, weightsVersion: this.trainer.step };
  }

  /** Log-probs (and, when the scorer makes them, entropies) of every row, [rows, width] in the batch's layout, scored chunk by chunk. */
  private async scoreRows(scorer: ScoringRunner, weights: BoundWeights[], batch: TokenBatch, chunks: readonly number[][]): Promise<{ logp: Float32Array; entropy?: Float32Array; values?: Float32Array }> {
    const logp = new Float32Array(batch.rows * batch.width);
    let entropy: Float32Array | undefined;
    let values: Float32Array | undefined;
    for (const rows of chunks) {
      if (rows.length === 0) continue;
      const t = selectRows(batch, rows);
      const scored = await scorer.score(weights, { input_ids: t.input_ids, attention_mask: t.attention_mask });
      // place back: rows start at column 0 in the batch and in the selection, which only dropped trailing padding
      const T = t.input_ids.dims[1];
      const place = (from: Float32Array, to: Float32Array) => rows.forEach((r, i) => to.set(from.subarray(i * T, (i + 1) * T), r * batch.width));
      place(scored.logp, logp);
      if (scored.entropy) place(scored.entropy, (entropy ??= new Float32Array(batch.rows * batch.width)));
      if (scored.values) place(scored.values, (values ??= new Float32Array(batch.rows * batch.width)));
    }
    return { logp, entropy, values };
  }

  /**
   * G completions per prompt (the group size, less the off-policy traces) sampled from the current weights as rollouts are —
   * same sampling options — without rewards or training (evaluation at the sampling temperature).
   * `key` picks each prompt's random streams: samples depend only on (seed, key, weights), so an
   * evaluation never moves the training's streams. A generation phase of its own.
   */
  async generateSamples(prompts: readonly { ids: readonly number[]; key: number }[]): Promise<DecodedCompletion[][]> {
    // the sampler draws a group's on-policy rows only: with off-policy traces, G − n_off a prompt
    const G = this.opts.groupSize - (this.opts.offPolicy?.traces ?? 0);
    const out = await this.parts.sampler.generate(this.policyWeights(), prompts.map((p) => p.ids), this.call(prompts.map((p) => p.key)));
    this.parts.releaseGeneration?.();
    const decoded = out.map((c) => ({ tokens: c.tokens, stopped: c.stopped, text: this.textOf(c), ...(c.logprobs ? { logprobs: c.logprobs } : {}) }));
    return prompts.map((_, k) => decoded.slice(k * G, (k + 1) * G));
  }

  /**
   * The policy in the compute dtype on the device, by HF name: the buffers the KV-cache engine
   * generates from, rewritten at the start of each rollout after an update (and by this call), for
   * an engine that serves the policy while it trains (`lathe grpo --serve_port`). `guard` runs
   * around every rewrite. Needs the KV-cache engine, with releaseGenerationMemory off (the buffers
   * must stay where they are).
   */
  async servingWeights(guard: WeightsGuard): Promise<Map<string, DeviceTensor>> {
    const cw = this.parts.computeWeights;
    if (!cw) throw new Error(`servingWeights: the policy is served from the KV-cache engine's weights, and this trainer generates with the '${this.generationEngine}' engine`);
    if (cw.graphWeights) throw new Error('servingWeights: a frozenBase (QLoRA) policy is generated from its quantized base plus the adapters, not from dense weights a server could read');
    if (this.opts.releaseGenerationMemory) throw new Error('servingWeights: releaseGenerationMemory frees the buffers a server would read between steps');
    cw.guard = guard;
    return cw.update(this.policyWeights(), this.trainer.step);
  }

  /**
   * Greedy completions of `prompts` from the current weights (evaluation; ReMax's baseline): token
   * ids, the decoded text (without the stop token) and whether a stop id ended it. A generation
   * phase of its own: with `releaseGenerationMemory` its memory is freed afterwards.
   */
  async generateGreedy(prompts: readonly { ids: readonly number[] }[]): Promise<DecodedCompletion[]> {
    const out = await this.greedyCompletions(prompts);
    this.parts.releaseGeneration?.();
    return out;
  }

  /** {@link generateGreedy} inside a generation phase (ReMax's baseline): nothing released. */
  private async greedyCompletions(prompts: readonly { ids: readonly number[] }[]): Promise<DecodedCompletion[]> {
    const out = await this.parts.greedy().generate(this.policyWeights(), prompts.map((p) => p.ids), this.call(prompts.map(() => 0), 0));
    return out.map((c) => ({ tokens: c.tokens, stopped: c.stopped, text: this.textOf(c), ...(c.logprobs ? { logprobs: c.logprobs } : {}) }));
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
    const { logp } = await this.scoreRows(this.parts.policyScorer(), this.scoringWeights(), batch, [[...Array(batch.rows).keys()]]);
    return { logp, parity: logpParity(batch, logp) };
  }

  /**
   * The frozen reference's log-probs of `batch`, [rows, width] like {@link rescore}'s (tests,
   * inspection); undefined when the trainer has no reference (no KL).
   */
  async referenceLogprobs(batch: TokenBatch): Promise<Float32Array | undefined> {
    const { refScorer, reference } = this.parts;
    if (!refScorer) return undefined;
    return (await this.scoreRows(refScorer, [reference!], batch, [[...Array(batch.rows).keys()]])).logp;
  }

  /**
   * The frozen reference's device tensors by HF name — in the compute dtype, or with LoRA the base
   * shared with the train step (in each tensor's `loraBaseDtype`) — for memory accounting and tests;
   * undefined without a reference.
   */
  get referenceWeights(): ReadonlyMap<string, DeviceTensor> | undefined {
    return this.parts.reference && new Map(this.parts.reference);
  }

  /** Samples G completions per prompt from the current weights without training (tests, inspection). */
  async sample(prompts: readonly RlPrompt<M>[]): Promise<TokenBatch> {
    const groups = await this.sampleGroups(prompts, new PhaseClock());
    this.parts.releaseGeneration?.();
    return this.tokens(groups);
  }

  /** The adaptive KL controller's current β (`kl.target`), for checkpoints; undefined when β is fixed. */
  get adaptiveKlCoef(): number | undefined {
    return this.klController?.value;
  }

  /**
   * Host copies for a checkpoint: the trained tensors (adapters with LoRA), AdamW moments, the
   * model's merged weights, optimizer steps, RL steps and the adaptive β.
   */
  snapshot(): { values: Map<string, Float32Array>; m: Map<string, Float32Array>; v: Map<string, Float32Array>; model: Map<string, Float32Array>; optimizerStep: number; rlStep: number; klCoef?: number; valueModel?: GrpoResumeState['valueModel'] } {
    const s = this.trainer.snapshot();
    const critic = this.parts.critic?.trainer.snapshot();
    return { values: s.params, m: s.m, v: s.v, model: this.parts.toMerged(), optimizerStep: s.step, rlStep: this.rlStep, klCoef: this.klController?.value, ...(critic ? { valueModel: critic } : {}) };
  }

  /** The trained parameters (adapters with LoRA). */
  get trainable(): TrainableParam[] {
    return GrpoTrainer.trainableParams(this.opts.model.config, this.opts.lora);
  }

  /** What a policy of `config` trains: every weight (decay on matrices and embeddings), or the LoRA adapters. */
  static trainableParams(config: DecoderConfig, lora?: LoraConfig): TrainableParam[] {
    return lora ? loraAdapters(config, lora).flatMap((a) => [a.a, a.b]) : fullTrainableParams(config);
  }

  /** Frees every session and device buffer. */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    for (const x of this.parts.owned) x.dispose();
    this.trainer.dispose();
  }
}

/**
 * How the graphs read the policy: `weights` for scoring and generation (with LoRA the adapters as a
 * side branch over the `base/<name>` inputs, merged into the base for generation) and `train` for
 * the train step, where LoRA dropout (when configured) applies.
 */
function policyWeightsOf(config: DecoderConfig, lora: LoraConfig | undefined, compute: DType, frozenBase?: FrozenBase): { weights: PolicyWeights; train: PolicyWeights['weights'] } {
  const trainable = GrpoTrainer.trainableParams(config, lora);
  if (!lora) return { weights: { trainable, weights: (_g, t) => castWeights(t, compute) }, train: (_g, t) => castWeights(t, compute) };
  const specs = paramSpecs(config);
  const adapters = loraAdapters(config, lora);
  if (frozenBase) {
    // QLoRA: the adapters' side branches over the base's own projections (its matmul hook); nothing to merge into for generation
    const over = (g: Graph, t: Map<string, Tensor>, training: boolean): Weights => {
      const base = frozenBase.weights(g, compute);
      const w = loraWeights((n) => base(n), t, adapters, lora, compute, { training });
      const out: Weights = (name) => w(name);
      out.branch = w.branch;
      out.matmul = base.matmul;
      return out;
    };
    return { weights: { trainable, weights: (g, t) => over(g, t, false) }, train: (g, t) => over(g, t, true) };
  }
  const baseInputs = (g: Graph) => {
    const base = new Map(specs.map((s) => [s.name, g.input(`base/${s.name}`, loraBaseDtype(s.name, adapters, compute), s.shape)]));
    return (n: string) => base.get(n)!;
  };
  return {
    weights: {
      trainable,
      weights: (g, t) => loraWeights(baseInputs(g), t, adapters, lora, compute),
      merged: (g, t) => mergedLoraWeights(baseInputs(g), t, adapters, lora, compute),
    },
    train: (g: Graph, t: Map<string, Tensor>) => loraWeights(baseInputs(g), t, adapters, lora, compute, { training: true }),
  };
}

/**
 * The rollout sampler, the greedy generator (made on first use) and what frees their memory between
 * phases; with the KV-cache engine both read one compute-dtype copy of the weights.
 */
function generationRunners<M>(o: ResolvedGrpoOptions<M>, engine: GenerationEngine, policy: PolicyWeights): Pick<GrpoTrainerParts<M>, 'sampler' | 'greedy' | 'samplerOf' | 'releaseGeneration' | 'owned' | 'computeWeights'> {
  const { device, session, promptsPerRun } = o;
  const config = o.model.config;
  const padId = o.tokenizer.padId;
  const computeWeights = engine === 'kv-cache' ? new ComputeWeights(device, config, policy, o.compute, session) : undefined;
  const generator = (groupSize: number, sampling: SamplingOptions): RolloutGenerator =>
    computeWeights
      ? KvGenerationRunner.create(device, config, { groupSize, sampling, padId, promptsPerRun, weights: computeWeights, session })
      : GenerationRunner.create(device, config, policy, { groupSize, sampling, padId, promptsPerRun, session });
  // with off-policy traces each group's last n_off rows are traces, not samples
  const sampler = generator(o.groupSize - (o.offPolicy?.traces ?? 0), o.sampling);
  const owned: { dispose(): void }[] = [sampler, ...(computeWeights ? [computeWeights] : [])];
  let greedyRunner: RolloutGenerator | undefined;
  const greedy = () => {
    if (!greedyRunner) owned.push((greedyRunner = generator(1, { temperature: 0 })));
    return greedyRunner;
  };
  const byK = new Map<number, RolloutGenerator>();
  const samplerOf = (k: number) => {
    let r = byK.get(k);
    if (!r) {
      byK.set(k, (r = generator(k, o.sampling)));
      owned.push(r);
    }
    return r;
  };
  // the runners first: their engines read the compute-dtype weights
  const releaseGeneration = o.releaseGenerationMemory
    ? () => {
        sampler.release();
        greedyRunner?.release();
        for (const r of byK.values()) r.release();
        computeWeights?.release();
      }
    : undefined;
  return { sampler, greedy, samplerOf, releaseGeneration, owned, ...(computeWeights ? { computeWeights } : {}) };
}

/**
 * The frozen reference: the initial weights, stored once in the compute dtype (it is never trained,
 * so a float32 copy would only be cast on every scoring run); with LoRA, the base itself — no copy,
 * bound by HF name in the dtypes the train step reads it in (`loraBaseDtype`).
 */
function frozenReferenceOf<M>(o: ResolvedGrpoOptions<M>, trainer: Trainer, frozen: Record<string, DeviceTensor>, owned: { dispose(): void }[]): { policy: PolicyWeights; weights: BoundWeights } {
  const { model, compute } = o;
  const specs = paramSpecs(model.config);
  if (o.frozenBase) {
    const base = o.frozenBase;
    return { policy: { trainable: [], weights: (g) => base.weights(g, compute) }, weights: Object.entries(frozen) };
  }
  if (o.lora) {
    const adapters = loraAdapters(model.config, o.lora);
    const weights = (g: Graph) => castWeights(new Map(specs.map((s) => [s.name, g.input(s.name, loraBaseDtype(s.name, adapters, compute), s.shape)] as const)), compute);
    return { policy: { trainable: [], weights }, weights: specs.map((s) => [s.name, frozen[`base/${s.name}`]] as const) };
  }
  // before any update (no resume) the trainer's parameters are these weights, already on the device
  const onDevice = trainer.params();
  onDevice.delete(SHARED_VALUE_HEAD);
  const ref = frozenReference(o.device, model, compute, { onDevice: o.resume ? undefined : onDevice, session: o.session });
  owned.push(ref);
  return { policy: ref.policy, weights: [...ref.weights] };
}

/** Which rows of the step's batch are off-policy traces, group by group; undefined when none is. */
function offPolicyFlags(groups: readonly ScoredGroup[]): boolean[] | undefined {
  if (!groups.some((g) => g.offPolicy?.some(Boolean))) return undefined;
  return groups.flatMap((g) => g.completions.map((_, j) => Boolean(g.offPolicy?.[j])));
}

/** Rows whose truncated-IS weight is 1 by rule: off-policy traces and rollouts without sampling log-probs; undefined when none is. */
function unweightedRows(groups: readonly ScoredGroup[]): boolean[] | undefined {
  const flags = groups.flatMap((g) => g.completions.map((c, j) => Boolean(g.offPolicy?.[j] || c.logprobsUnknown)));
  return flags.some(Boolean) ? flags : undefined;
}

/** The loss's `off_policy` input, [rows, width]: 1 at the predicting positions of the traces' tokens. */
function offPolicyMatrix(batch: TokenBatch, flags: readonly boolean[] | undefined): Float32Array {
  const out = new Float32Array(batch.rows * batch.width);
  flags?.forEach((off, r) => {
    if (off) for (let i = r * batch.width; i < (r + 1) * batch.width; i++) out[i] = Number(batch.responseMask[i]);
  });
  return out;
}

/** The step's off-policy bookkeeping: groups short of traces, traces cut to the length limit. */
function offPolicyCounts(groups: readonly SampledGroup<unknown>[]): OffPolicyCounts {
  return {
    missingGroups: groups.filter((g) => (g.missingTraces ?? 0) > 0).length,
    truncatedTraces: groups.reduce((n, g) => n + (g.truncatedTraces ?? 0), 0),
  };
}

/** How well the values the returns were computed with fit them: explained variance, means (over trained response tokens). */
function criticFit(batch: TokenBatch, values: Float32Array, estimate: TokenAdvantages): Record<`value/${string}`, number> {
  const v = trainedValues(batch, responseValues(batch, values)).flat();
  const ret = trainedValues(batch, estimate.returns).flat();
  return { 'value/explained_variance': explainedVariance(ret, v), 'value/mean': mean(v), 'value/returns_mean': mean(ret) };
}

/** A shared critic's update metrics, from the joint step's sums. */
function sharedCriticMetrics(u: UpdateTotals, lr: number): Record<`value/${string}`, number> {
  const good = u.updates - u.nonfinite;
  return { 'value/loss': good ? u.sums.vf_loss / good : NaN, 'value/clip_fraction': u.sums.vf_tokens ? u.sums.vf_clipped_tokens / u.sums.vf_tokens : NaN, 'value/lr': lr };
}

/** PPO's value model: a train step over its own weights (the policy's trunk, or `init`, and a zero head) and its scoring session. */
function criticOf<M>(o: ResolvedGrpoOptions<M>, policyWeights: ReadonlyMap<string, Float32Array>, attention: Pick<ValueGraphOptions, 'flashAttention' | 'attentionKernel' | 'ropeKernel' | 'swigluKernel'>): { trainer: Trainer; scorer: ValueScorer } {
  const v = o.valueModel!;
  const config = o.model.config;
  const graph = { compute: o.compute, ...attention, recompute: o.gradientCheckpointing };
  const resume = o.resume?.valueModel;
  const init = resume ? { params: resume.params, m: resume.m, v: resume.v, step: resume.step } : { params: valueModelInit(config, policyWeights, v.init) };
  const trainer = Trainer.create({ params: valueModelParams(config), loss: valueLossBuilder(config, v.clip, graph), optimizer: o.optimizer }, init, { device: o.device, microBatches: o.microBatches, session: o.session, ...o.dataParallel?.trainerOptions });
  return { trainer, scorer: ValueScorer.create(o.device, config, { compute: o.compute, ...attention, session: o.session }) };
}

function hashSeed(seed: number, step: number, epoch: number): number {
  let h = (seed ^ 0x9e3779b9) >>> 0;
  for (const x of [step, epoch]) h = Math.imul(h ^ (x + 0x7f4a7c15), 0x85ebca6b) >>> 0;
  return h;
}

/** A rank's rows among every rank's in a step (see `GrpoTrainer.rowShare`). */
interface RowShare {
  rank: number;
  /** Where this rank's rows start in the concatenation of every rank's, in rank order. */
  offset: number;
  /** Every rank's row count. */
  counts: number[];
  /** Every row's trained length (response tokens that get loss), in that concatenation. */
  lengths: number[];
}

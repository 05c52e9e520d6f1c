/**
 * The RL policy loss in the tensor DSL: PPO's clipped surrogate (separate low/high clip ranges,
 * optional dual clip), token- or sequence-level importance ratios (GSPO), a KL-to-reference term
 * (k1/k2/k3), an entropy bonus, and four aggregation modes — every one a sum over tokens divided by a
 * normaliser that is a *batch-level input*, so a batch split into micro-batches gives exactly the
 * gradient of the whole batch (the micro-batch losses add up to the batch loss).
 *
 * Tensors are [B, T] in "predicting position" coordinates, as `nextTokenLogprobs` and the scoring
 * graph give them: position t holds log π(ids[t+1] | ids ≤ t), and `mask` is 1 where ids[t+1] is a
 * response token.
 *
 * Per token, with r the ratio π_θ/π_old and A the advantage, the policy term (`policyTerm`):
 *   ppo        pg_t = −min(r·A, clip(r, 1 − clipLow, 1 + clipHigh)·A)   (and, with dual clip c,
 *              for A < 0: min(pg_t, −c·A))
 *   cispo      pg_t = −sg[clip(r, 1 − clipLow, 1 + clipHigh)]·A·log π_θ   (MiniMax-M1's CISPO: the
 *              importance weight is clipped and held constant, so no token's gradient is dropped)
 *   reinforce  pg_t = −A·log π_θ   (the plain policy gradient; verl's `gpg`)
 *   unclipped  pg_t = −r·A   (the importance-weighted surrogate without a clip; LUFFY's on-policy term)
 * On off-policy tokens (`offPolicy` = 1: a trace written by another policy, LUFFY), the policy term
 * is instead (`OffPolicyLossConfig`):
 *   shaped     pg_t = −f(p)·A,  f(p) = p / (p + γ),  p = exp(log π_θ − log π_b)   (no clip; with no
 *              behaviour log-probs the loop feeds log π_b = 0, so p is π_θ(t) itself)
 *   sft        pg_t = −sftCoef·log π_θ   (the "RL + SFT loss" baseline: the trace's NLL, no advantage)
 * then loss_t = pg_t + klCoef·kl_t − entropyCoef·H_t and loss = aggregate(loss_t).
 *
 * Truncated importance sampling (`rolloutIsThreshold` C, with the `rolloutLogp` tensor): the engine
 * that sampled (π_sample, the generation log-probs) and the training forward (π_old, re-scored) are
 * not the same numerically, so each on-policy token's policy term is weighted by
 * w_t = min(π_old(t)/π_sample(t), C), a constant (no gradient through it), as verl's TIS
 * (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training").
 * C ≥ 1, so a token whose two log-probs agree keeps weight exactly 1. π_sample is the distribution
 * the engine drew from: with top-k/top-p/min-p filters it is renormalised over the kept tokens, so
 * w_t ≤ 1 there — the correction for the filter. A row with no sampling log-probs (a rollout made
 * elsewhere without them, an off-policy trace) is fed rolloutLogp = oldLogp by the loop: weight 1.
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';
import { DEFAULT_KL_ESTIMATOR, type KlEstimator } from './kl';

/**
 * How per-token losses become one number. Each is Σ (weighted token losses) / `normaliser`; the
 * modes differ in the per-sequence weight and in what the normaliser counts over the *whole
 * optimizer batch* (compute it with {@link lossNormaliser}):
 *
 * | mode | per-sequence weight | normaliser | reference systems |
 * | --- | --- | --- | --- |
 * | `token-mean` | 1 | response tokens in the batch | verl default; TRL `bnpo`/`dapo`; DAPO |
 * | `seq-mean-token-sum` | 1 | sequences in the batch | verl |
 * | `seq-mean-token-mean` | 1 / its length | sequences in the batch | original GRPO; TRL `grpo`; GSPO |
 * | `token-sum-norm` | 1 | sequences × a constant max length | Dr.GRPO; TRL `dr_grpo` |
 *
 * verl's `seq-mean-token-sum-norm` divides the token sum by its `loss_scale_factor` (a constant
 * length) alone, not by sequences × that length, so its loss is B × `token-sum-norm`'s for B
 * sequences — a constant scale that still acts through the learning rate, clipping and Adam's ε.
 * `lossNormaliser`'s `lossScaleFactor` reproduces it exactly.
 */
export type LossAggregation = 'token-mean' | 'seq-mean-token-sum' | 'seq-mean-token-mean' | 'token-sum-norm';

/** Every aggregation mode, for loops in tests and option validation. */
export const LOSS_AGGREGATIONS: readonly LossAggregation[] = ['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean', 'token-sum-norm'];

/** The tensors of one (micro-)batch. */
export interface PolicyLossTensors {
  /** log π_θ of each sampled token, [B, T] float (differentiable: the gradient flows through it). */
  logp: Tensor;
  /** log π_old (the policy that sampled the batch), [B, T], a constant. */
  oldLogp: Tensor;
  /** Advantages per token, [B, T] (see `advantageMatrix`). */
  advantages: Tensor;
  /** 1 on response tokens, 0 elsewhere, [B, T] (any numeric or bool dtype). */
  mask: Tensor;
  /** The aggregation's batch-level normaliser, a scalar of logp's dtype (see {@link lossNormaliser}). */
  normaliser: Tensor;
  /** log π_ref, [B, T]; required when `klCoef` > 0. */
  refLogp?: Tensor;
  /** Per-token entropy of π_θ, [B, T] (differentiable); required when `entropyCoef` > 0. */
  entropy?: Tensor;
  /** 1 on the tokens of off-policy traces, 0 elsewhere, [B, T] (LUFFY): those tokens take the off-policy term. */
  offPolicy?: Tensor;
  /** log π_sample: the sampling engine's log-prob of each token, [B, T], a constant; required with `rolloutIsThreshold`. */
  rolloutLogp?: Tensor;
}

/** The policy term of off-policy tokens (formulas in the module comment). */
export interface OffPolicyLossConfig {
  /** `'shaped'` (LUFFY, default): −f(p)·A with f(p) = p/(p + γ). `'sft'`: −sftCoef·log π_θ. */
  term?: 'shaped' | 'sft';
  /** γ of the shaping f(p) = p/(p + γ). Default 0.1 (LUFFY's). */
  gamma?: number;
  /** Weight of the SFT term (`term: 'sft'`). Default 1. */
  sftCoef?: number;
}

/** The defaults of {@link OffPolicyLossConfig}. */
export const OFF_POLICY_LOSS_DEFAULTS = { term: 'shaped', gamma: 0.1, sftCoef: 1 } as const satisfies Required<OffPolicyLossConfig>;

/** The policy term of the loss (formulas in the module comment). */
export type PolicyTerm = 'ppo' | 'cispo' | 'reinforce' | 'unclipped';

/** Every policy term, for option validation. */
export const POLICY_TERMS: readonly PolicyTerm[] = ['ppo', 'cispo', 'reinforce', 'unclipped'];

/** Hyperparameters of the policy loss. */
export interface PolicyLossConfig {
  /**
   * `'ppo'` (default): the clipped surrogate. `'cispo'`: the clipped importance weight, held
   * constant, times −A·log π_θ (clipLow/clipHigh bound the weight; verl's `cispo`). `'reinforce'`:
   * −A·log π_θ, no ratio (on-policy; verl's `gpg`). `'unclipped'`: −r·A, no clip (LUFFY's on-policy
   * term with its clip removed). The last three take token ratios and no dual clip.
   */
  policyTerm?: PolicyTerm;
  /** ε_low: the ratio is clipped below at 1 − clipLow. Default 0.2 (PPO, TRL `epsilon`, verl `clip_ratio`). */
  clipLow?: number;
  /** ε_high: the ratio is clipped above at 1 + clipHigh. Default 0.2; DAPO's clip-higher uses 0.28. */
  clipHigh?: number;
  /**
   * Dual-clip PPO (Ye et al. 2020): for negative advantages the loss is capped at −c·A. Off by
   * default; verl's vanilla loss always applies it, with c = 3 (`clip_ratio_c`): pass 3 to match.
   */
  dualClip?: number;
  /**
   * `'token'`: r_t = π_θ(a_t)/π_old(a_t) (PPO, GRPO). `'sequence'` (GSPO): one ratio per sequence,
   * r = exp(mean over its tokens of log π_θ − log π_old), applied to every token. Default `'token'`.
   * Against verl's GSPO: with one advantage per sequence the two agree; with per-token advantages
   * Lathe's gradient at token t is (r/|y|)·Σ_s A_s where verl's (its ratio sg[r]·π_t/sg[π_t]) is r·A_t.
   * Lathe keeps the configured aggregation and dual clip for GSPO; verl forces
   * `seq-mean-token-mean` and has no dual clip there.
   */
  ratio?: 'token' | 'sequence';
  /** Default `'token-mean'`. */
  aggregation?: LossAggregation;
  /** β of the KL-to-reference loss term. Default 0 (no term, no `refLogp` needed). */
  klCoef?: number;
  /** Estimator of the KL term (see kl.ts). Default `DEFAULT_KL_ESTIMATOR.loss`: k3 (GRPO's, TRL's, verl's `low_var_kl`). */
  klEstimator?: KlEstimator;
  /** Coefficient of the entropy bonus (subtracted from the loss). Default 0. */
  entropyCoef?: number;
  /**
   * For `token-sum-norm`: the loss's normaliser is this constant instead of sequences × max length
   * (verl's `loss_scale_factor` of `seq-mean-token-sum-norm`). Read by the loop's `lossNormaliser`.
   */
  lossScaleFactor?: number;
  /** The term of off-policy tokens, when the batch has them (`offPolicy` tensor). Defaults {@link OFF_POLICY_LOSS_DEFAULTS}. */
  offPolicy?: OffPolicyLossConfig;
  /**
   * Truncated importance sampling between the sampling engine and the training policy: each
   * on-policy token's policy term × min(π_old/π_sample, C) with C this threshold (needs the
   * `rolloutLogp` tensor). Off unless set; {@link DEFAULT_ROLLOUT_IS_THRESHOLD} is the method's C.
   */
  rolloutIsThreshold?: number;
}

/** The truncation C of truncated importance sampling used by verl's TIS and the classmate method (`rollout_is_threshold`). */
export const DEFAULT_ROLLOUT_IS_THRESHOLD = 4;

/**
 * The defaults of {@link PolicyLossConfig}'s policy terms. Dual clip and the loss scale factor are
 * off unless set; the KL term is off (`klCoef` 0) and its estimator is `DEFAULT_KL_ESTIMATOR.loss`.
 */
export const POLICY_LOSS_DEFAULTS = {
  policyTerm: 'ppo',
  clipLow: 0.2,
  clipHigh: 0.2,
  ratio: 'token',
  aggregation: 'token-mean',
  entropyCoef: 0,
} as const satisfies Required<Omit<PolicyLossConfig, 'dualClip' | 'lossScaleFactor' | 'klCoef' | 'klEstimator' | 'offPolicy' | 'rolloutIsThreshold'>>;

/**
 * The scalar loss and the metrics, all scalars that add up across micro-batches (sums, or sums
 * divided by the batch-level normaliser): clip fraction = clipped_tokens / tokens, mean approximate
 * KL(π_old‖π_θ) = approx_kl_sum / tokens, and so on.
 */
export interface PolicyLossOutputs {
  loss: Tensor;
  metrics: {
    /** The clipped-surrogate part of the loss, aggregated like the loss. */
    pg_loss: Tensor;
    /** Response tokens in this micro-batch. */
    tokens: Tensor;
    /**
     * Tokens whose clipped branch is active (zero gradient): below 1 − ε_low with A < 0, or above
     * 1 + ε_high with A > 0; with `cispo`, tokens whose weight was clipped; 0 with `reinforce`.
     */
    clipped_tokens: Tensor;
    /**
     * Of those, the ones clipped below. Not verl's `pg_clipfrac_lower`, which counts the tokens
     * where dual clip's cap is active (A < 0 and −c·A below the clipped loss).
     */
    clipped_low_tokens: Tensor;
    /**
     * Σ over tokens of (r − 1) − log r: the k3 estimate of KL(π_old‖π_θ), with token ratios. verl's
     * `ppo_kl` is the k1 estimate, the mean of log π_old − log π_θ: both estimate KL(π_old‖π_θ)
     * without bias on tokens sampled from π_old, k3 with less variance.
     */
    approx_kl_sum: Tensor;
    /** Σ over tokens of the KL-to-reference estimate (present with a reference). */
    ref_kl_sum?: Tensor;
    /** Σ over tokens of the entropy (present when an entropy is given). */
    entropy_sum?: Tensor;
    /** With off-policy tokens: their count; the clip counts and `approx_kl_sum` then cover the on-policy tokens alone. */
    off_tokens?: Tensor;
    /** Σ over off-policy tokens of p (π_θ, or π_θ/π_b with behaviour log-probs). */
    off_prob_sum?: Tensor;
    /** Σ over on-policy tokens of the ratio r (with off-policy tokens in the batch). */
    on_ratio_sum?: Tensor;
    /** Σ over off-policy tokens of the entropy (with an entropy). */
    off_entropy_sum?: Tensor;
    /** With truncated importance sampling: on-policy tokens whose π_old/π_sample exceeded C (weight truncated). */
    rollout_is_clipped_tokens?: Tensor;
    /** With truncated importance sampling: Σ over on-policy tokens of the weight min(π_old/π_sample, C). */
    rollout_is_weight_sum?: Tensor;
  };
}

/**
 * Log-ratios are clamped to ±20 before exp so a wild token cannot overflow: what verl's vanilla PPO
 * loss does to the token log-ratio. verl's GSPO clamps its sequence log-ratio at 10, above only;
 * Lathe keeps ±20 for both ratio levels, and for k3's exponent in {@link klTerm}.
 */
const LOG_RATIO_LIMIT = 20;

/** The PPO-family policy loss; see the module comment for the formula. */
export function policyLoss(t: PolicyLossTensors, config: PolicyLossConfig = {}): PolicyLossOutputs {
  const d = POLICY_LOSS_DEFAULTS;
  const { policyTerm: objective = d.policyTerm, clipLow = d.clipLow, clipHigh = d.clipHigh, dualClip, ratio: ratioLevel = d.ratio, aggregation = d.aggregation, klCoef = 0, klEstimator = DEFAULT_KL_ESTIMATOR.loss, entropyCoef = d.entropyCoef } = config;
  if (!POLICY_TERMS.includes(objective)) throw new Error(`policyLoss: policyTerm must be one of ${POLICY_TERMS.join(', ')}, got '${objective}'`);
  if (objective !== 'ppo' && ratioLevel !== 'token') throw new Error(`policyLoss: policyTerm '${objective}' takes token ratios, got ratio '${ratioLevel}'`);
  const off = { ...OFF_POLICY_LOSS_DEFAULTS, ...config.offPolicy };
  if (!['shaped', 'sft'].includes(off.term)) throw new Error(`policyLoss: offPolicy.term must be 'shaped' or 'sft', got '${off.term}'`);
  if (!(off.gamma > 0)) throw new Error(`policyLoss: offPolicy.gamma must be > 0, got ${off.gamma}`);
  if (objective !== 'ppo' && dualClip !== undefined) throw new Error(`policyLoss: dualClip applies to policyTerm 'ppo' only, got '${objective}'`);
  if (!(clipLow >= 0 && clipLow < 1)) throw new Error(`policyLoss: clipLow must be in [0, 1), got ${clipLow}`);
  if (!(clipHigh >= 0)) throw new Error(`policyLoss: clipHigh must be ≥ 0, got ${clipHigh}`);
  if (dualClip !== undefined && !(dualClip > 1)) throw new Error(`policyLoss: dualClip must be > 1, got ${dualClip}`);
  if (!LOSS_AGGREGATIONS.includes(aggregation)) throw new Error(`policyLoss: aggregation must be one of ${LOSS_AGGREGATIONS.join(', ')}, got '${aggregation}'`);
  if (klCoef > 0 && !t.refLogp) throw new Error('policyLoss: klCoef > 0 needs refLogp (the reference log-probs)');
  if (entropyCoef !== 0 && !t.entropy) throw new Error('policyLoss: entropyCoef ≠ 0 needs the per-token entropy');
  const isThreshold = config.rolloutIsThreshold;
  // C < 1 would scale down even the tokens whose sampling and training log-probs agree (weight 1)
  if (isThreshold !== undefined && !(isThreshold >= 1)) throw new Error(`policyLoss: rolloutIsThreshold must be ≥ 1, got ${isThreshold}`);
  if (isThreshold !== undefined && !t.rolloutLogp) throw new Error('policyLoss: rolloutIsThreshold needs rolloutLogp (the sampling engine\'s log-probs)');

  const dtype = t.logp.dtype;
  const fullMask = L.cast(t.mask, dtype);
  const offMask = t.offPolicy && L.mul(L.cast(t.offPolicy, dtype), fullMask);
  // the on-policy tokens: what the ratio, clip and KL-to-old metrics describe
  const mask = offMask ? L.sub(fullMask, offMask) : fullMask;
  const adv = L.cast(t.advantages, dtype);
  const tokenLogRatio = L.sub(t.logp, t.oldLogp);
  const logRatio =
    ratioLevel === 'sequence'
      ? L.div(L.reduceSum(L.mul(tokenLogRatio, mask), [1], true), L.maximum(L.reduceSum(mask, [1], true), 1)) // [B, 1]
      : tokenLogRatio;
  const ratio = L.exp(L.clip(logRatio, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT));

  const isRatio = isThreshold !== undefined ? L.exp(L.clip(L.sub(t.oldLogp, t.rolloutLogp!), -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)) : undefined;
  const isWeight = isRatio && L.stopGradient(L.minimum(isRatio, isThreshold!));
  const rawPg = policyTermLoss(objective, t.logp, ratio, adv, clipLow, clipHigh, dualClip);
  const onPg = isWeight ? L.mul(rawPg, isWeight) : rawPg;
  const offProb = offMask && L.exp(L.clip(tokenLogRatio, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT));
  const offPg = offProb && (off.term === 'sft' ? L.mul(t.logp, -off.sftCoef) : L.neg(L.mul(L.div(offProb, L.add(offProb, off.gamma)), adv)));
  const pg = offMask ? L.where(L.cast(offMask, 'bool'), offPg!, onPg) : onPg;
  // Clipped tokens: PPO's zero-gradient branch (below with A < 0, above with A > 0); the weights
  // CISPO's clip changed, on either side; none for REINFORCE, which has no ratio.
  const below = L.less(ratio, 1 - clipLow);
  const above = L.greater(ratio, 1 + clipHigh);
  const low = objective === 'cispo' ? below : L.and(L.less(adv, 0), below);
  const high = objective === 'cispo' ? above : L.and(L.greater(adv, 0), above);
  const count = (b: Tensor) => (objective === 'reinforce' || objective === 'unclipped' ? L.mul(L.reduceSum(mask), 0) : L.reduceSum(L.mul(L.cast(b, dtype), mask)));

  const agg = (x: Tensor) => aggregateLoss(x, fullMask, aggregation, t.normaliser);
  const pgLoss = agg(pg);
  let loss = pgLoss;
  const r = L.exp(L.clip(tokenLogRatio, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT));
  const metrics: PolicyLossOutputs['metrics'] = {
    pg_loss: pgLoss,
    tokens: L.reduceSum(fullMask),
    clipped_tokens: count(L.or(low, high)),
    clipped_low_tokens: count(low),
    approx_kl_sum: L.reduceSum(L.mul(L.sub(L.sub(r, 1), tokenLogRatio), mask)),
  };
  if (offMask) {
    metrics.off_tokens = L.reduceSum(offMask);
    metrics.off_prob_sum = L.reduceSum(L.mul(offProb!, offMask));
    metrics.on_ratio_sum = L.reduceSum(L.mul(r, mask));
    if (t.entropy) metrics.off_entropy_sum = L.reduceSum(L.mul(t.entropy, offMask));
  }
  if (isWeight) {
    metrics.rollout_is_clipped_tokens = L.reduceSum(L.mul(L.cast(L.greater(isRatio!, isThreshold!), dtype), mask));
    metrics.rollout_is_weight_sum = L.reduceSum(L.mul(isWeight, mask));
  }
  if (t.refLogp) {
    const kl = klTerm(t.logp, t.refLogp, klEstimator);
    metrics.ref_kl_sum = L.reduceSum(L.mul(kl, fullMask));
    if (klCoef > 0) loss = L.add(loss, L.mul(agg(kl), klCoef));
  }
  if (t.entropy) {
    metrics.entropy_sum = L.reduceSum(L.mul(t.entropy, fullMask));
    if (entropyCoef !== 0) loss = L.sub(loss, L.mul(agg(t.entropy), entropyCoef));
  }
  return { loss, metrics };
}

/** The per-token policy term (formulas in the module comment). */
function policyTermLoss(objective: PolicyTerm, logp: Tensor, ratio: Tensor, adv: Tensor, clipLow: number, clipHigh: number, dualClip: number | undefined): Tensor {
  if (objective === 'reinforce') return L.neg(L.mul(adv, logp));
  if (objective === 'unclipped') return L.neg(L.mul(ratio, adv));
  const clippedRatio = L.clip(ratio, 1 - clipLow, 1 + clipHigh);
  if (objective === 'cispo') return L.neg(L.mul(L.mul(L.stopGradient(clippedRatio), adv), logp));
  // −min(r·A, clip(r)·A) = max(−r·A, −clip(r)·A)
  const pg = L.maximum(L.neg(L.mul(ratio, adv)), L.neg(L.mul(clippedRatio, adv)));
  return dualClip === undefined ? pg : L.where(L.less(adv, 0), L.minimum(pg, L.mul(adv, -dualClip)), pg);
}

/** Per-token KL(π_θ‖π_ref) estimate in the graph, x = logp − refLogp (formulas in kl.ts). */
export function klTerm(logp: Tensor, refLogp: Tensor, estimator: KlEstimator): Tensor {
  const x = L.sub(logp, refLogp);
  switch (estimator) {
    case 'k1':
      return x;
    case 'k2':
      return L.mul(L.mul(x, x), 0.5);
    case 'k3':
      return L.add(L.sub(L.exp(L.neg(L.clip(x, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))), 1), x);
  }
}

/**
 * Σ over the batch of per-token values, weighted per `mode` and divided by `normaliser` (see
 * {@link LossAggregation}). `mask` must already have `perToken`'s dtype.
 */
export function aggregateLoss(perToken: Tensor, mask: Tensor, mode: LossAggregation, normaliser: Tensor): Tensor {
  const masked = L.mul(perToken, mask);
  if (mode === 'seq-mean-token-mean') {
    const lengths = L.maximum(L.reduceSum(mask, [1]), 1);
    return L.div(L.reduceSum(L.div(L.reduceSum(masked, [1]), lengths)), normaliser);
  }
  return L.div(L.reduceSum(masked), normaliser);
}

/**
 * The normaliser of an aggregation mode over the *whole optimizer batch* (feed the same value to
 * every micro-batch of the step): `lengths` are the response lengths of all its sequences.
 * `token-sum-norm` needs `maxLength`, the constant of Dr.GRPO (the generation limit, as TRL's
 * `max_completion_length`): its normaliser is sequences × maxLength. `lossScaleFactor`, for
 * `token-sum-norm` only, replaces that normaliser with the constant itself: verl's
 * `seq-mean-token-sum-norm` with its `loss_scale_factor`.
 */
export function lossNormaliser(mode: LossAggregation, lengths: readonly number[], opts: { maxLength?: number; lossScaleFactor?: number } = {}): number {
  if (opts.lossScaleFactor !== undefined) {
    if (mode !== 'token-sum-norm') throw new Error(`lossNormaliser: lossScaleFactor applies to 'token-sum-norm' only, got '${mode}'`);
    if (!(opts.lossScaleFactor > 0)) throw new Error(`lossNormaliser: lossScaleFactor must be > 0, got ${opts.lossScaleFactor}`);
    return opts.lossScaleFactor;
  }
  const sequences = lengths.filter((n) => n > 0).length;
  let value: number;
  switch (mode) {
    case 'token-mean':
      value = lengths.reduce((a, b) => a + b, 0);
      break;
    case 'seq-mean-token-sum':
    case 'seq-mean-token-mean':
      value = sequences;
      break;
    case 'token-sum-norm':
      if (!(opts.maxLength && opts.maxLength > 0)) throw new Error("lossNormaliser: aggregation 'token-sum-norm' needs maxLength (the constant length, e.g. max new tokens)");
      value = lengths.length * opts.maxLength;
      break;
    default:
      throw new Error(`lossNormaliser: unknown aggregation '${mode as string}'`);
  }
  return Math.max(value, 1);
}

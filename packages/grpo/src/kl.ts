/**
 * KL to the reference policy on the host, as a *reward penalty* (the alternative to the in-loss KL
 * term of `policyLoss`). Estimators from Schulman, "Approximating KL divergence" (2020), with
 * x = log π_θ(a) − log π_ref(a) on tokens a sampled from π_θ:
 *
 * - k1 = x                        (unbiased, high variance, can be negative)
 * - k2 = x² / 2                   (biased, low variance, ≥ 0)
 * - k3 = e^(−x) − 1 + x           (unbiased, low variance, ≥ 0; verl's `low_var_kl`, TRL's only one)
 *
 * The same formulas are used by TRL, verl and OpenRLHF. On the host (this file, the reward
 * penalty) Lathe clamps nothing: verl clamps k3 to [−10, 10] and OpenRLHF every estimate to
 * [−10, 10]; a KL that large is a bug to see, not hide. In the graph (`klTerm`, the loss term) k3's
 * exponent −x is clamped to ±20, as the policy ratio's is, so e^(−x) cannot overflow float32.
 */

/** Which per-token KL estimator. */
export type KlEstimator = 'k1' | 'k2' | 'k3';

/** Where the KL acts: a term of the policy loss, or a per-token penalty on the rewards. */
export type KlMode = 'loss' | 'reward';

/**
 * The default estimator where the KL acts, as verl's defaults: k3 in the loss (`kl_loss_type:
 * low_var_kl`; GRPO's and TRL's too) and k1 as a reward penalty (`kl_penalty: kl`; OpenRLHF's too),
 * which makes a penalised return the classic RLHF reward r − β·log(π/π_ref).
 */
export const DEFAULT_KL_ESTIMATOR: Readonly<Record<KlMode, KlEstimator>> = { loss: 'k3', reward: 'k1' };

/** One token's KL estimate from its log-probs under the policy and the reference. */
export function klEstimate(logp: number, refLogp: number, estimator: KlEstimator): number {
  const x = logp - refLogp;
  switch (estimator) {
    case 'k1':
      return x;
    case 'k2':
      return 0.5 * x * x;
    case 'k3':
      return Math.exp(-x) - 1 + x;
  }
}

/** Inputs of {@link klPenalisedRewards}. */
export interface KlPenaltyInput {
  /** Outcome reward of each completion. */
  rewards: readonly number[];
  /** Per response token log-probs under the policy that sampled (the old policy), one row per completion. */
  logp: readonly (readonly number[])[];
  /** Per response token log-probs under the reference, same shape as `logp`. */
  refLogp: readonly (readonly number[])[];
  /** Per response token, 0 for tokens the policy is not trained on (tool output): no penalty there. Absent: every token. */
  mask?: readonly (readonly number[])[];
}

/** Options of {@link klPenalisedRewards}. */
export interface KlPenaltyOptions {
  /** β: the penalty is −β·KL. */
  coef: number;
  /** Default `DEFAULT_KL_ESTIMATOR.reward` (k1, the classic RLHF reward penalty). */
  estimator?: KlEstimator;
}

/** Rewards with the KL penalty applied. */
export interface KlPenalisedRewards {
  /** Outcome reward − β·Σ_t kl_t per completion (for outcome estimators such as GRPO). */
  sequenceRewards: number[];
  /** −β·kl_t per response token (for token-level estimators: `TokenRewards.tokenRewards`). */
  tokenPenalties: number[][];
  /** Mean over completions of Σ_t kl_t (the sequence KL), for logging. */
  meanSequenceKl: number;
}

/**
 * The KL penalty as reward shaping: per-token penalties −β·kl_t and penalised outcome rewards
 * r − β·Σ_t kl_t. Computed from stored log-probs (no gradient flows through a reward penalty).
 */
export function klPenalisedRewards(input: KlPenaltyInput, options: KlPenaltyOptions): KlPenalisedRewards {
  const { coef, estimator = DEFAULT_KL_ESTIMATOR.reward } = options;
  if (!(coef >= 0)) throw new Error(`klPenalisedRewards: coef must be ≥ 0, got ${coef}`);
  const n = input.rewards.length;
  if (input.logp.length !== n || input.refLogp.length !== n) {
    throw new Error(`klPenalisedRewards: ${n} rewards but ${input.logp.length} logp rows and ${input.refLogp.length} refLogp rows`);
  }
  let klTotal = 0;
  const tokenPenalties = input.logp.map((row, i) => {
    const ref = input.refLogp[i];
    if (ref.length !== row.length) throw new Error(`klPenalisedRewards: completion ${i} has ${row.length} logp but ${ref.length} refLogp`);
    const mask = input.mask?.[i];
    return row.map((lp, t) => {
      if (mask && mask[t] === 0) return 0;
      const k = klEstimate(lp, ref[t], estimator);
      klTotal += k;
      return -coef * k;
    });
  });
  const sequenceRewards = input.rewards.map((r, i) => r + tokenPenalties[i].reduce((a, b) => a + b, 0));
  return { sequenceRewards, tokenPenalties, meanSequenceKl: n ? klTotal / n : 0 };
}

/**
 * The adaptive KL coefficient of Ziegler et al. (2019), as verl's `AdaptiveKLController`: after
 * each batch of n completions whose KL estimate (the per-token mean of each completion, averaged
 * over completions) is `kl`, β ← β · (1 + clip(kl / target − 1, −0.2, 0.2) · n / horizon). The
 * coefficient rises while the KL is above the target and falls below it, by at most 20 % of n/horizon
 * a batch. verl's defaults: target 0.1, horizon 10,000.
 */
export class AdaptiveKlController {
  /** The current coefficient β. */
  value: number;

  constructor(
    initial: number,
    /** The KL per token the coefficient steers towards. */
    readonly target: number,
    /** Completions over which a full proportional correction is applied. */
    readonly horizon: number,
  ) {
    if (!(initial >= 0)) throw new Error(`AdaptiveKlController: the initial coefficient must be ≥ 0, got ${initial}`);
    if (!(target > 0)) throw new Error(`AdaptiveKlController: target must be > 0, got ${target}`);
    if (!(horizon > 0)) throw new Error(`AdaptiveKlController: horizon must be > 0, got ${horizon}`);
    this.value = initial;
  }

  /** Updates β from a batch of `completions` whose KL estimate was `kl`; returns the new β. */
  update(kl: number, completions: number): number {
    const error = Math.min(Math.max(kl / this.target - 1, -0.2), 0.2);
    this.value *= 1 + (error * completions) / this.horizon;
    return this.value;
  }
}

/** The KL an {@link AdaptiveKlController} reads: each completion's mean per-token estimate, averaged over completions. */
export function meanCompletionKl(logp: readonly (readonly number[])[], refLogp: readonly (readonly number[])[], estimator: KlEstimator): number {
  const perCompletion = logp.map((row, i) => (row.length ? row.reduce((a, lp, t) => a + klEstimate(lp, refLogp[i][t], estimator), 0) / row.length : 0));
  return perCompletion.length ? perCompletion.reduce((a, b) => a + b, 0) / perCompletion.length : 0;
}

/**
 * What one `GrpoTrainer.step` reports: the metrics line (`GrpoStepMetrics`, one line of
 * metrics.jsonl) and a record per completion (`RolloutRecord`), assembled from what the step's
 * stages produced.
 */
import type { SequenceAdvantages, TokenAdvantages } from './advantages';
import { klEstimate, type KlEstimator } from './kl';
import type { SourceStats } from './rewards';
import { trainedValues, type SampledCompletion, type TokenBatch } from './rollout-batch';

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
  /** An off-policy trace rather than a sample (LUFFY). */
  offPolicy?: boolean;
  /** log π_old of each response token (as the loss reads it), when the step has them. */
  logprobs?: number[];
  /** π_old's entropy at each response token, when re-scoring computed it. */
  entropies?: number[];
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
   * With off-policy traces (LUFFY), the step split by where completions came from:
   * `on_policy/{reward_mean, advantage_mean, ratio_mean, entropy}` and
   * `off_policy/{reward_mean, advantage_mean, prob_mean, entropy, share, best_fraction,
   * missing_groups, truncated_traces}` (see {@link stepMetrics}).
   */
  [split: `${'on' | 'off'}_policy/${string}`]: number;
  /**
   * With a value model (PPO, estimator 'gae'): `value/{loss, grad_norm, clip_fraction,
   * explained_variance, mean, returns_mean, lr, policy_frozen}` — explained variance is
   * 1 − Var(R − V)/Var(R) over response tokens, of the values the returns were computed with.
   */
  [critic: `value/${string}`]: number;
  /**
   * Failed reward calls (each replaced by the scorer's fallback): the sampled completions' and, with
   * a greedy baseline (ReMax), the greedy completions'; also per source in `reward/<name>/failures`.
   */
  reward_failures: number;
  /** With truncated importance sampling: the fraction of on-policy tokens (over the step's updates) whose weight π_old/π_sample was truncated at C. */
  rollout_is_clip_fraction?: number;
  /** With truncated importance sampling: the mean weight min(π_old/π_sample, C). */
  rollout_is_weight_mean?: number;
  /**
   * With truncated importance sampling: the step's trained tokens of on-policy rollouts that carried
   * no sampling log-probs (rollouts made elsewhere without them), whose weight is 1 by rule.
   */
  rollout_is_unweighted_tokens?: number;
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

/** A prompt's G completions, decoded and scored (what the metrics and records read of a group). */
export interface ScoredGroup {
  prompt: { text: string; index?: number };
  completions: SampledCompletion[];
  texts: string[];
  rewards: number[];
  bySource: Record<string, number[]>;
  /** Failed reward calls per source (each replaced by the scorer's fallback), the greedy completion's included. */
  failures: Record<string, number>;
  /** Per completion, whether it is an off-policy trace (absent: none is). */
  offPolicy?: boolean[];
}

/** The sampling rounds of a step (more than one with dynamic sampling). */
export interface SamplingRounds<G extends ScoredGroup = ScoredGroup> {
  groups: G[];
  rounds: number;
  /** Groups dropped for all-equal rewards. */
  dropped: number;
  /** Groups missing from the batch after the last round. */
  shortfall: number;
}

/** Old and reference log-probs of a step's batch. */
export interface StepLogprobs {
  /** log π_old, [rows, width] in the batch's layout. */
  old: Float32Array;
  /** log π_ref, [rows, width]; undefined without a reference. */
  ref?: Float32Array;
  /** `old` per response token, one row per completion. */
  oldRows: number[][];
  /** `ref` per response token. */
  refRows?: number[][];
  /** Parity of re-scored old log-probs with generation's (undefined when old log-probs are generation's). */
  parity?: { mean: number; maxAbs: number };
  /** π_old's mean entropy per response token, when re-scoring computed it. */
  entropy?: number;
  /** That entropy per response token, one row per completion (for the rollout log). */
  entropyRows?: number[][];
  /** That entropy over the sampled and over the off-policy rows, with traces in the batch. */
  entropySplit?: { on: number; off: number };
  /** V of every position, [rows, width], from the same pass (a critic sharing the policy's trunk). */
  values?: Float32Array;
}

/** Off-policy bookkeeping of a step (with off-policy options). */
export interface OffPolicyCounts {
  /** Groups that had fewer traces than asked for (they trained on a smaller group). */
  missingGroups: number;
  /** Traces cut to the length limit. */
  truncatedTraces: number;
}

/** A step's advantages. */
export interface StepAdvantages {
  estimate: SequenceAdvantages | TokenAdvantages;
  /** [rows, width], at the predicting positions of response tokens. */
  matrix: Float32Array;
  /** One value per row: the sequence advantage, or the mean of its token advantages. */
  perRow: number[];
  /** β of the KL this step (before an adaptive controller moves it); 0 without a KL term. */
  klCoef: number;
}

/** The optimizer updates of a step, summed. */
export interface UpdateTotals {
  updates: number;
  /** Updates whose loss was not finite (skipped: the weights kept their last good values). */
  nonfinite: number;
  lossSum: number;
  gradNormSum: number;
  /** The loss's metric outputs, summed over the finite updates. */
  sums: Record<string, number>;
  /** The first finite update's metric outputs (read before any weight changed). */
  first?: Record<string, number>;
}

/** Where time goes in a step. */
export class PhaseClock {
  readonly ms = { generation: 0, scoring: 0, rewards: 0, training: 0 };
  private readonly start = performance.now();

  /** Runs `fn`, adding its time to `phase`. */
  async time<T>(phase: keyof PhaseClock['ms'], fn: () => Promise<T> | T): Promise<T> {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      this.ms[phase] += performance.now() - t0;
    }
  }

  /** Milliseconds since the clock started. */
  get total(): number {
    return performance.now() - this.start;
  }
}

/** Everything {@link stepMetrics} reads. */
export interface StepRecord {
  rlStep: number;
  lr: number;
  groupSize: number;
  sampled: SamplingRounds;
  batch: TokenBatch;
  logps: StepLogprobs;
  advantages: StepAdvantages;
  updates: UpdateTotals;
  /** The estimator of the `kl_ref` metric. */
  klEstimator: KlEstimator;
  clock: PhaseClock;
  /** With off-policy options: the step's counts, and the on/off-policy split is reported. */
  offPolicy?: OffPolicyCounts;
}

/** Metric outputs of `policyLoss` and `rlLoss` that the step turns into its own metrics. */
const BUILTIN_METRICS = new Set(['pg_loss', 'tokens', 'clipped_tokens', 'clipped_low_tokens', 'approx_kl_sum', 'ref_kl_sum', 'entropy_sum', 'logp_parity_sum', 'off_tokens', 'off_prob_sum', 'on_ratio_sum', 'off_entropy_sum', 'vf_loss', 'vf_clipped_tokens', 'vf_tokens', 'rollout_is_clipped_tokens', 'rollout_is_weight_sum']);

/** The step's metrics line. */
export function stepMetrics(s: StepRecord): GrpoStepMetrics {
  const { groups } = s.sampled;
  const { batch, logps, updates: u, clock } = s;
  const good = u.updates - u.nonfinite;
  // with traces in the batch the clip counts and KL-to-old cover the sampled tokens alone
  const tokens = (u.sums.tokens ?? 0) - (u.sums.off_tokens ?? 0);
  const per = (k: string) => (k in u.sums && tokens > 0 ? u.sums[k] / tokens : NaN);
  const rewards = groups.flatMap((g) => g.rewards);
  const sourceStats = perSourceStats(groups);
  // re-scoring measured the parity over the whole batch; else the first update's forward did
  const parity = logps.parity ?? (u.first && { mean: u.first.logp_parity_sum / Math.max(1, u.first.tokens), maxAbs: NaN });
  const refRows = logps.refRows;
  const metrics: GrpoStepMetrics = {
    rl_step: s.rlStep,
    lr: s.lr,
    prompts: groups.length,
    samples: batch.rows,
    reward_mean: mean(rewards),
    reward_std: std(rewards),
    reward_failures: Object.values(sourceStats).reduce((n, x) => n + x.failures, 0),
    // the outcome's, not the estimator's: a custom estimator may shape rewards before its groups
    uniform_groups: s.groupSize > 1 ? groups.filter((g) => g.rewards.every((r) => r === g.rewards[0])).length : 0,
    zero_advantage_fraction: s.advantages.estimate.stats.zeroAdvantages / batch.rows,
    advantage_abs_mean: mean(s.advantages.perRow.map(Math.abs)),
    response_length_mean: mean(batch.lengths),
    response_length_max: Math.max(...batch.lengths),
    truncated_fraction: groups.flatMap((g) => g.completions).filter((c) => !c.stopped).length / batch.rows,
    kl_coef: s.advantages.klCoef,
    kl_ref: refRows ? mean(trainedValues(batch, logps.oldRows.map((row, i) => row.map((lp, t) => klEstimate(lp, refRows[i][t], s.klEstimator)))).flat()) : NaN,
    loss: good ? u.lossSum / good : NaN,
    pg_loss: good && 'pg_loss' in u.sums ? u.sums.pg_loss / good : NaN,
    grad_norm: good ? u.gradNormSum / good : NaN,
    clip_fraction: per('clipped_tokens'),
    clip_low_fraction: per('clipped_low_tokens'),
    approx_kl: per('approx_kl_sum'),
    // π_old's entropy from re-scoring, or the mean over the updates' train-step passes
    entropy: logps.entropy ?? (u.sums.tokens ? u.sums.entropy_sum / u.sums.tokens : NaN),
    logp_parity: parity?.mean ?? NaN,
    logp_max_abs_diff: parity?.maxAbs ?? NaN,
    updates: u.updates,
    nonfinite_updates: u.nonfinite,
    sampling_rounds: s.sampled.rounds,
    dropped_groups: s.sampled.dropped,
    dynamic_sampling_shortfall: s.sampled.shortfall,
    generation_ms: clock.ms.generation,
    scoring_ms: clock.ms.scoring,
    rewards_ms: clock.ms.rewards,
    training_ms: clock.ms.training,
    host_ms: 0,
    step_ms: 0,
  };
  for (const [name, v] of Object.entries(u.sums)) if (!BUILTIN_METRICS.has(name)) metrics[`objective/${name}`] = v / good;
  for (const [name, x] of Object.entries(sourceStats)) {
    metrics[`reward/${name}/mean`] = x.mean;
    metrics[`reward/${name}/std`] = x.std;
    metrics[`reward/${name}/failures`] = x.failures;
  }
  if (s.offPolicy) Object.assign(metrics, offPolicyMetrics(s, s.offPolicy));
  if ('rollout_is_clipped_tokens' in u.sums) {
    metrics.rollout_is_clip_fraction = per('rollout_is_clipped_tokens');
    metrics.rollout_is_weight_mean = per('rollout_is_weight_sum');
    metrics.rollout_is_unweighted_tokens = groups.flatMap((g) => g.completions.map((c, j) => (c.logprobsUnknown && !g.offPolicy?.[j] ? c : undefined))).reduce((n, c) => n + (c ? (c.mask ? c.mask.reduce((a, b) => a + b, 0) : c.tokens.length) : 0), 0);
  }
  metrics.step_ms = clock.total;
  metrics.host_ms = metrics.step_ms - clock.ms.generation - clock.ms.scoring - clock.ms.rewards - clock.ms.training;
  return metrics;
}

/**
 * The on/off-policy split of a step with off-policy traces. `off_policy/prob_mean` is the mean of p
 * (π_θ, or π_θ/π_b with behaviour log-probs) over the traces' tokens, the on-policy counterpart
 * `on_policy/ratio_mean` the mean ratio π_θ/π_old; `share` is the traces' fraction of the batch's
 * rows; `best_fraction` the fraction of groups with a trace where a trace's reward is strictly above
 * every sample's (the trace is what the group learns from).
 */
function offPolicyMetrics(s: StepRecord, counts: OffPolicyCounts): Record<`${'on' | 'off'}_policy/${string}`, number> {
  const { groups } = s.sampled;
  const u = s.updates;
  const flags = groups.flatMap((g) => g.completions.map((_, j) => Boolean(g.offPolicy?.[j])));
  const rewards = groups.flatMap((g) => g.rewards);
  const pick = <T>(xs: readonly T[], off: boolean) => xs.filter((_, r) => flags[r] === off);
  const withTrace = groups.filter((g) => g.offPolicy?.some(Boolean));
  const best = withTrace.filter((g) => {
    const on = g.rewards.filter((_, j) => !g.offPolicy![j]);
    return g.rewards.some((r, j) => g.offPolicy![j] && on.every((x) => r > x));
  }).length;
  const offTokens = u.sums.off_tokens ?? 0;
  const onTokens = (u.sums.tokens ?? 0) - offTokens;
  return {
    'on_policy/reward_mean': mean(pick(rewards, false)),
    'off_policy/reward_mean': mean(pick(rewards, true)),
    'on_policy/advantage_mean': mean(pick(s.advantages.perRow, false)),
    'off_policy/advantage_mean': mean(pick(s.advantages.perRow, true)),
    'on_policy/ratio_mean': onTokens > 0 && 'on_ratio_sum' in u.sums ? u.sums.on_ratio_sum / onTokens : NaN,
    'off_policy/prob_mean': offTokens > 0 ? u.sums.off_prob_sum / offTokens : NaN,
    'on_policy/entropy': s.logps.entropySplit?.on ?? (onTokens > 0 && 'off_entropy_sum' in u.sums ? (u.sums.entropy_sum - u.sums.off_entropy_sum) / onTokens : NaN),
    'off_policy/entropy': s.logps.entropySplit?.off ?? (offTokens > 0 && 'off_entropy_sum' in u.sums ? u.sums.off_entropy_sum / offTokens : NaN),
    'off_policy/share': flags.filter(Boolean).length / Math.max(1, flags.length),
    'off_policy/best_fraction': withTrace.length ? best / withTrace.length : NaN,
    'off_policy/missing_groups': counts.missingGroups,
    'off_policy/truncated_traces': counts.truncatedTraces,
  };
}

/** A record per completion, group by group, with its row's advantage. */
export function rolloutRecords(groups: readonly ScoredGroup[], advantagePerRow: readonly number[], tokenValues: { logprobs?: readonly number[][]; entropies?: readonly number[][] } = {}): RolloutRecord[] {
  let row = 0;
  return groups.flatMap((g) =>
    g.completions.map((c, j) => ({
      ...(tokenValues.logprobs?.[row] ? { logprobs: tokenValues.logprobs[row] } : {}),
      ...(tokenValues.entropies?.[row] ? { entropies: tokenValues.entropies[row] } : {}),
      promptIndex: g.prompt.index,
      promptText: g.prompt.text,
      sample: j,
      tokens: c.tokens,
      completion: g.texts[j],
      stopped: c.stopped,
      reward: g.rewards[j],
      bySource: Object.fromEntries(Object.entries(g.bySource).map(([k, v]) => [k, v[j]])),
      advantage: advantagePerRow[row++],
      ...(g.offPolicy?.[j] ? { offPolicy: true } : {}),
    })),
  );
}

/**
 * mean exp(|a − b|) and max |a − b| over response tokens, a = `logp`, b = the batch's rollout
 * log-probs; rows flagged in `skipRows` (off-policy traces, not generated here) are left out.
 */
export function logpParity(batch: TokenBatch, logp: ArrayLike<number>, skipRows?: readonly boolean[]): { mean: number; maxAbs: number } {
  let sum = 0;
  let n = 0;
  let maxAbs = 0;
  // untrained tokens (tool output) were not sampled by the policy: no generation log-prob to match
  for (let i = 0; i < batch.trainMask.length; i++) {
    if (batch.trainMask[i] === 0n || skipRows?.[Math.floor(i / batch.width)]) continue;
    const d = Math.abs(logp[i] - batch.rolloutLogp[i]);
    sum += Math.exp(d);
    maxAbs = Math.max(maxAbs, d);
    n++;
  }
  return { mean: n ? sum / n : NaN, maxAbs };
}

/** Mean, standard deviation and failures of each reward source over every completion. */
function perSourceStats(groups: readonly ScoredGroup[]): Record<string, SourceStats> {
  const names = groups.length ? Object.keys(groups[0].bySource) : [];
  return Object.fromEntries(
    names.map((name) => {
      const xs = groups.flatMap((g) => g.bySource[name]);
      return [name, { mean: mean(xs), std: std(xs), failures: groups.reduce((n, g) => n + (g.failures[name] ?? 0), 0) }];
    }),
  );
}

/** The mean of `xs` (NaN when empty). */
export function mean(xs: readonly number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN;
}

/** The population standard deviation of `xs` (NaN when empty). */
function std(xs: readonly number[]): number {
  const m = mean(xs);
  return xs.length ? Math.sqrt(xs.reduce((a, x) => a + (x - m) ** 2, 0) / xs.length) : NaN;
}

/**
 * Advantage estimators: pure host-side functions from rewards to advantages, one per method.
 *
 * Layout: completions are ordered prompt by prompt, `groupSize` (G) consecutive completions per
 * prompt, so completions [k·G, (k+1)·G) answer prompt k — or, with `groupIds`, grouped by id in any
 * order and of any sizes (each estimator's minimum group size still applies). Outcome estimators (GRPO, Dr.GRPO, RLOO,
 * ReMax) give one advantage per completion, the same for each of its tokens; token-level estimators
 * (REINFORCE++, GAE) give one per response token. {@link advantageMatrix} lays either out as the
 * [B, T] `advantages` input of the policy loss.
 *
 * The reference systems differ in their constants; each function states Lathe's choice and theirs
 * (TRL = huggingface/trl GRPOTrainer, verl = verl/trainer/ppo/core_algos.py, OpenRLHF =
 * openrlhf/trainer/ppo_utils/experience_maker.py, as of 2026).
 *
 * All-equal rewards in a group: GRPO, Dr.GRPO and RLOO give exactly 0 to every completion of the
 * group (set explicitly, not left to rounding: the float mean of [0.1, 0.1, 0.1] is not 0.1), and
 * every estimator counts such groups in `stats.uniformGroups`. "All equal" is decided on the
 * outcome rewards (`outcomeRewards`, when the rewards were shaped after the outcome, e.g. by a KL
 * penalty): a penalty that differs per completion would otherwise make every group look
 * informative and hide the groups the outcome cannot rank.
 */

/** Rewards of a batch of groups. */
export interface GroupedRewards {
  /** One scalar reward per completion, prompt by prompt (`groupSize` consecutive completions per prompt). */
  rewards: readonly number[];
  /** Completions per prompt (G), consecutive. Ignored when `groupIds` is given. */
  groupSize: number;
  /**
   * The group (prompt) of each completion, when groups are not `groupSize` consecutive completions:
   * completions with equal ids form a group, in any order and of any size (off-policy traces,
   * filtering and dynamic sampling change group sizes). ReMax's `greedyRewards` then follow the
   * groups in order of first appearance.
   */
  groupIds?: readonly (number | string)[];
  /**
   * The outcome rewards before any shaping, one per completion, when `rewards` are shaped (the
   * sequence rewards of `klPenalisedRewards`): groups whose outcome rewards are all equal are the
   * uniform ones — zeroed where the estimator zeroes uniform groups, and counted. Default `rewards`.
   */
  outcomeRewards?: readonly number[];
  /**
   * The completions whose rewards give each group's mean and standard deviation in GRPO and
   * Dr.GRPO (LUFFY's option of statistics over the on-policy samples alone, its off-policy traces
   * still getting advantages against them). Default every completion.
   */
  statsFrom?: readonly boolean[];
}

/** Counters every estimator reports. */
export interface AdvantageStats {
  /** Number of groups (prompts). */
  groups: number;
  /** Groups whose rewards are all equal (no preference among their completions). */
  uniformGroups: number;
  /** Completions whose advantage is exactly 0 (for token-level estimators: on every token). */
  zeroAdvantages: number;
}

/** One advantage per completion, applied to each of its response tokens. */
export interface SequenceAdvantages {
  kind: 'sequence';
  advantages: number[];
  stats: AdvantageStats;
}

/** One advantage per response token: `advantages[i]` has completion i's response length. */
export interface TokenAdvantages {
  kind: 'token';
  advantages: number[][];
  /** The per-token returns the advantages were computed from (REINFORCE++: before whitening; GAE: A + V). */
  returns: number[][];
  stats: AdvantageStats;
}

// ---- GRPO and Dr.GRPO ---------------------------------------------------------------------------

/** Options of {@link grpoAdvantages}. */
export interface GrpoAdvantageOptions {
  /**
   * What the centred reward is divided by: `'group'` the group's standard deviation (GRPO, TRL's
   * `scale_rewards="group"`, verl's `norm_adv_by_std_in_grpo=True`); `'batch'` the standard
   * deviation of all rewards in the batch (TRL's `scale_rewards="batch"`); `'none'` nothing
   * (Dr.GRPO). Default `'group'`.
   */
  scale?: 'group' | 'batch' | 'none';
  /**
   * Added to the standard deviation: A = (r − mean) / (std + eps). Default 1e-6 (verl); TRL uses
   * 1e-4, OpenRLHF's `group_norm` 1e-9.
   */
  stdEpsilon?: number;
  /**
   * Bessel's correction (divide by n − 1). Default true: TRL (`nanstd`), verl (`torch.std`) and
   * OpenRLHF (`Tensor.std`) all use the unbiased estimate.
   */
  unbiasedStd?: boolean;
}

/**
 * GRPO (DeepSeekMath): A_i = (r_i − mean_g) / (std_g + eps), mean and std over the completions of
 * completion i's group g (see {@link GrpoAdvantageOptions} for the std's scope, epsilon and
 * correction). Uniform groups (all-equal outcome rewards) get exactly 0. Needs groupSize ≥ 2.
 * With `statsFrom`, mean and std are those of the flagged completions of each group (every
 * completion still gets r_i − mean over them, divided by their std — or by 1 where their rewards are
 * all equal, since the group as a whole still ranks its completions); a group with no flagged
 * completion takes the statistics of all of its own.
 *
 * Where verl differs (a choice, not an accident): with a KL penalty in the reward, verl's scores
 * are the token rewards summed (outcome + KL), so a group of equal outcomes still gets the advantage
 * of its KL differences; Lathe decides uniformity on the outcome (`outcome`, default the rewards) and
 * gives such a group 0. A group of one is refused here; verl gives it mean 0 and std 1 (A = r).
 */
export function grpoAdvantages(batch: GroupedRewards, options: GrpoAdvantageOptions = {}): SequenceAdvantages {
  const { scale = 'group', stdEpsilon = 1e-6, unbiasedStd = true } = options;
  const { rewards, groups, outcome } = checkGroups(batch, 'grpoAdvantages', 2);
  const from = batch.statsFrom;
  if (from && from.length !== rewards.length) throw new Error(`grpoAdvantages: ${from.length} statsFrom flags for ${rewards.length} rewards`);
  const batchStd = scale === 'batch' ? std(from ? rewards.filter((_, i) => from[i]) : rewards, unbiasedStd) : 1;
  const out = new Array<number>(rewards.length);
  forEachGroup(rewards, groups, outcome, (all, at, uniform) => {
    // statistics over a subset (on-policy samples); a subset of equal rewards only centres (σ 0 would blow up the rest)
    // …and a group with none of them (traces alone) takes its own statistics
    const flagged = from ? all.filter((_, j) => from[at[j]]) : all;
    const group = flagged.length ? flagged : all;
    const mu = mean(group);
    const sigma = scale === 'group' ? (from && std(group, unbiasedStd) === 0 ? 1 - stdEpsilon : std(group, unbiasedStd)) : batchStd;
    all.forEach((r, j) => {
      out[at[j]] = uniform ? 0 : scale === 'none' ? r - mu : (r - mu) / (sigma + stdEpsilon);
    });
  });
  return { kind: 'sequence', advantages: out, stats: stats(outcome, groups, out) };
}

/**
 * Dr.GRPO ("Understanding R1-Zero-like training"): A_i = r_i − mean_g, no division by the std. Its
 * other half, no per-response length normalisation, is the loss's aggregation mode
 * `'token-sum-norm'` (a constant normaliser).
 */
export function drGrpoAdvantages(batch: GroupedRewards): SequenceAdvantages {
  return grpoAdvantages(batch, { scale: 'none' });
}

// ---- RLOO and ReMax -----------------------------------------------------------------------------

/**
 * RLOO (Ahmadian et al. 2024): each completion's baseline is the mean reward of the other G − 1
 * completions of its group: A_i = r_i − (Σ_j r_j − r_i) / (G − 1) = G/(G − 1) · (r_i − mean_g).
 * The same as verl and OpenRLHF. Uniform groups (all-equal outcome rewards) get exactly 0. Needs
 * groupSize ≥ 2.
 */
export function rlooAdvantages(batch: GroupedRewards): SequenceAdvantages {
  const { rewards, groups, outcome } = checkGroups(batch, 'rlooAdvantages', 2);
  const out = new Array<number>(rewards.length);
  forEachGroup(rewards, groups, outcome, (group, at, uniform) => {
    const total = group.reduce((a, b) => a + b, 0);
    group.forEach((r, j) => {
      out[at[j]] = uniform ? 0 : r - (total - r) / (group.length - 1);
    });
  });
  return { kind: 'sequence', advantages: out, stats: stats(outcome, groups, out) };
}

/** Rewards plus the reward of each prompt's greedy completion (ReMax's baseline). */
export interface RemaxRewards extends GroupedRewards {
  /** Reward of the greedy (temperature 0) completion of each prompt: one per group. */
  greedyRewards: readonly number[];
}

/**
 * ReMax (Li et al. 2023): the baseline is the reward of the prompt's greedy completion:
 * A_i = r_i − r_greedy(g). As in verl (`compute_remax_outcome_advantage` with outcome rewards).
 * Works with groupSize 1. A uniform group is not zeroed (its rewards may still differ from the
 * greedy one); it is counted (on the outcome rewards).
 */
export function remaxAdvantages(batch: RemaxRewards): SequenceAdvantages {
  const { rewards, groups, outcome } = checkGroups(batch, 'remaxAdvantages', 1);
  if (batch.greedyRewards.length !== groups.length) {
    throw new Error(`remaxAdvantages: greedyRewards has ${batch.greedyRewards.length} entries; expected one per group (${groups.length})`);
  }
  checkFinite(batch.greedyRewards, 'remaxAdvantages', 'greedyRewards');
  const out = new Array<number>(rewards.length);
  groups.forEach((at, g) => at.forEach((i) => (out[i] = rewards[i] - batch.greedyRewards[g])));
  return { kind: 'sequence', advantages: out, stats: stats(outcome, groups, out) };
}

// ---- REINFORCE++ --------------------------------------------------------------------------------

/** Rewards with response lengths (and optional per-token shaping) for token-level estimators. */
export interface TokenRewards extends GroupedRewards {
  /** Response length in tokens of each completion. */
  lengths: readonly number[];
  /**
   * Per-token rewards added to the outcome reward (e.g. the KL penalty from `klPenalisedRewards`),
   * one array per completion with its response length. The outcome reward is added at the last token.
   */
  tokenRewards?: readonly (readonly number[])[];
}

/** Options of {@link reinforcePlusPlusAdvantages}. */
export interface ReinforcePlusPlusOptions {
  /**
   * `'none'`: REINFORCE++ (no baseline beyond whitening). `'group'`: REINFORCE++-baseline — the
   * group's mean outcome reward is subtracted from each outcome reward before the returns are
   * formed (OpenRLHF's `reinforce_baseline`; uniform groups' outcomes become exactly 0). verl's
   * `reinforce_plus_plus_baseline` agrees without per-token shaping rewards; with a KL penalty in the
   * reward it centres each completion's *total* (outcome + Σ KL) on its group's mean and spreads that
   * one number over every token before whitening, where Lathe centres the outcome alone and forms
   * per-token returns of outcome + KL. Default `'none'`.
   */
  baseline?: 'none' | 'group';
  /** Discount of the returns G_t = Σ_{s≥t} γ^{s−t} r_s. Default 1 (OpenRLHF forces 1 with a baseline). */
  gamma?: number;
  /**
   * Batch whitening over every response token of the batch: `'mean-std'` A = (G − μ) / √(σ² + eps)
   * (verl's `masked_whiten`, OpenRLHF's normalisation); `'std'` divides by √(σ² + eps) without
   * centring (keeps uniform groups at exactly 0 with the group baseline); `'none'`. Default `'mean-std'`.
   */
  whiten?: 'mean-std' | 'std' | 'none';
  /** Added to the variance before the square root. Default 1e-8 (verl adds 1e-8; OpenRLHF clamps at 1e-8). */
  whitenEpsilon?: number;
  /**
   * Bessel's correction of the token variance. Default false, the biased estimate (OpenRLHF divides
   * by the token count); verl's `masked_whiten` uses the unbiased one: set true to match it.
   */
  unbiasedVariance?: boolean;
}

/**
 * REINFORCE++ (Hu 2025): per-token returns of the (optionally group-centred) outcome reward plus any
 * per-token shaping rewards, whitened over all response tokens of the batch (token-weighted, so a
 * long response counts once per token, as in verl and OpenRLHF).
 *
 * Uniform groups (all-equal outcome rewards) are counted but, with the default `'mean-std'`
 * whitening, do not get zero advantage: whitening subtracts the batch's token mean μ, so a uniform
 * group's tokens end up at (x − μ)/σ — x is 0 after the group baseline, the shared reward without
 * one, plus any KL shaping — which is 0 only by coincidence. That is verl's and OpenRLHF's
 * definition, kept on purpose: REINFORCE++'s baseline is the batch's mean, not the group's (the
 * group baseline only removes the prompt's difficulty first). `whiten: 'std'` with
 * `baseline: 'group'` and no shaping keeps uniform groups at exactly 0.
 */
export function reinforcePlusPlusAdvantages(batch: TokenRewards, options: ReinforcePlusPlusOptions = {}): TokenAdvantages {
  const { baseline = 'none', gamma = 1, whiten = 'mean-std', whitenEpsilon = 1e-8, unbiasedVariance = false } = options;
  const { rewards, groups, outcome: uniformBy } = checkGroups(batch, 'reinforcePlusPlusAdvantages', baseline === 'group' ? 2 : 1);
  checkLengths(batch, 'reinforcePlusPlusAdvantages');
  const outcome = rewards.slice();
  if (baseline === 'group') {
    forEachGroup(rewards, groups, uniformBy, (group, at, uniform) => {
      const mu = mean(group);
      group.forEach((r, j) => (outcome[at[j]] = uniform ? 0 : r - mu));
    });
  }
  const returns = outcome.map((r, i) => {
    const n = batch.lengths[i];
    const shaping = batch.tokenRewards?.[i] ?? new Array<number>(n).fill(0);
    const perToken = shaping.map((x, t) => (t === n - 1 ? x + r : x));
    return discountedReturns(perToken, gamma);
  });
  const advantages = whiten === 'none' ? returns.map((r) => r.slice()) : whitenTokens(returns, whiten === 'mean-std', whitenEpsilon, unbiasedVariance);
  return { kind: 'token', advantages, returns, stats: stats(uniformBy, groups, advantages) };
}

/** G_t = Σ_{s≥t} γ^{s−t} r_s. */
export function discountedReturns(tokenRewards: readonly number[], gamma: number): number[] {
  const out = new Array<number>(tokenRewards.length);
  let running = 0;
  for (let t = tokenRewards.length - 1; t >= 0; t--) out[t] = running = tokenRewards[t] + gamma * running;
  return out;
}

function whitenTokens(values: number[][], centre: boolean, eps: number, unbiased: boolean): number[][] {
  const flat = values.flat();
  if (flat.length === 0) return values.map(() => []);
  const mu = mean(flat);
  const ss = flat.reduce((a, x) => a + (x - mu) ** 2, 0);
  const n = unbiased ? flat.length - 1 : flat.length;
  if (n <= 0) throw new Error('reinforcePlusPlusAdvantages: unbiased whitening needs at least 2 response tokens in the batch');
  const inv = 1 / Math.sqrt(ss / n + eps);
  return values.map((row) => row.map((x) => (centre ? x - mu : x) * inv));
}

// ---- GAE (for when a value model exists) --------------------------------------------------------

/** Per-token rewards and value estimates for GAE. */
export interface GaeInput {
  /** Per-token rewards of each completion (the outcome reward on its last token, KL shaping on every token). */
  tokenRewards: readonly (readonly number[])[];
  /** V(s_t) from a value model at each response token, same lengths as `tokenRewards`. */
  values: readonly (readonly number[])[];
  /** Completions per prompt; only used to count uniform groups. Default 1. */
  groupSize?: number;
}

/** Options of {@link gaeAdvantages}. */
export interface GaeOptions {
  /** Discount γ. Default 1 (verl's default, as for LLMs generally). */
  gamma?: number;
  /** GAE λ. Default 0.95 (TRL's PPO `lam`); verl's default is 1.0 — pass `lambda: 1` to match it. */
  lambda?: number;
  /**
   * Whiten the advantages over all tokens of the batch (verl and OpenRLHF do), with the biased
   * variance; verl's `masked_whiten` uses the unbiased one. Default true.
   */
  whiten?: boolean;
}

/**
 * Generalised advantage estimation (Schulman et al. 2016): δ_t = r_t + γ·V_{t+1} − V_t (V past the
 * last token is 0), A_t = δ_t + γλ·A_{t+1}; returns A + V (the value model's regression target);
 * advantages whitened over the batch's tokens (biased variance, eps 1e-8) when `whiten`.
 * The trainer's estimator 'gae' calls it with the values of its value model (value-model.ts).
 */
export function gaeAdvantages(input: GaeInput, options: GaeOptions = {}): TokenAdvantages {
  const { gamma = 1, lambda = 0.95, whiten = true } = options;
  const { tokenRewards, values } = input;
  if (tokenRewards.length !== values.length) throw new Error(`gaeAdvantages: ${tokenRewards.length} reward rows but ${values.length} value rows`);
  const adv = tokenRewards.map((r, i) => {
    const v = values[i];
    if (v.length !== r.length) throw new Error(`gaeAdvantages: completion ${i} has ${r.length} rewards but ${v.length} values`);
    checkFinite(r, 'gaeAdvantages', `tokenRewards[${i}]`);
    checkFinite(v, 'gaeAdvantages', `values[${i}]`);
    const a = new Array<number>(r.length);
    let next = 0;
    for (let t = r.length - 1; t >= 0; t--) {
      const delta = r[t] + gamma * (t + 1 < r.length ? v[t + 1] : 0) - v[t];
      a[t] = next = delta + gamma * lambda * next;
    }
    return a;
  });
  const returns = adv.map((a, i) => a.map((x, t) => x + values[i][t]));
  const advantages = whiten ? whitenTokens(adv, true, 1e-8, false) : adv;
  const outcome = tokenRewards.map((r) => r.reduce((a, b) => a + b, 0));
  const groups = consecutiveGroups(outcome.length, input.groupSize ?? 1, 'gaeAdvantages');
  return { kind: 'token', advantages, returns, stats: stats(outcome, groups, advantages) };
}

// ---- layout ---------------------------------------------------------------------------------------

/**
 * The [B, T] float32 `advantages` input of the policy loss: row b's k-th masked position (mask ≠ 0,
 * in column order) gets completion b's advantage (sequence-level) or its k-th token advantage
 * (token-level); unmasked positions get 0. `mask` is the loss's response mask, row-major [B, T].
 */
export function advantageMatrix(adv: SequenceAdvantages | TokenAdvantages, mask: ArrayLike<number | bigint>, dims: readonly [number, number]): Float32Array {
  const [B, T] = dims;
  if (mask.length !== B * T) throw new Error(`advantageMatrix: mask has ${mask.length} entries, expected ${B}×${T}`);
  if (adv.advantages.length !== B) throw new Error(`advantageMatrix: ${adv.advantages.length} completions' advantages for a batch of ${B} rows`);
  const out = new Float32Array(B * T);
  for (let b = 0; b < B; b++) {
    let k = 0;
    for (let t = 0; t < T; t++) {
      if (Number(mask[b * T + t]) === 0) continue;
      if (adv.kind === 'sequence') out[b * T + t] = adv.advantages[b];
      else {
        const row = adv.advantages[b];
        if (k >= row.length) throw new Error(`advantageMatrix: row ${b} has more masked positions than its ${row.length} token advantages`);
        out[b * T + t] = row[k];
      }
      k++;
    }
    if (adv.kind === 'token' && k !== adv.advantages[b].length) {
      throw new Error(`advantageMatrix: row ${b} has ${k} masked positions but ${adv.advantages[b].length} token advantages`);
    }
  }
  return out;
}

// ---- helpers ------------------------------------------------------------------------------------

/** Validated rewards, group size, and the rewards that decide uniform groups (`outcomeRewards` or `rewards`). */
/** The completions' indices, group by group: `groupIds` when given, else runs of `groupSize`. */
function checkGroups(batch: GroupedRewards, fn: string, minGroup: number): { rewards: number[]; groups: number[][]; outcome: number[] } {
  let groups: number[][];
  if (batch.groupIds) {
    if (batch.groupIds.length !== batch.rewards.length) throw new Error(`${fn}: ${batch.groupIds.length} groupIds for ${batch.rewards.length} rewards`);
    const byId = new Map<number | string, number[]>();
    batch.groupIds.forEach((id, i) => byId.set(id, [...(byId.get(id) ?? []), i]));
    groups = [...byId.values()];
    const small = [...byId].find(([, at]) => at.length < minGroup);
    if (small) throw new Error(`${fn}: group '${String(small[0])}' has ${small[1].length} completion(s); this estimator needs ≥ ${minGroup}`);
  } else {
    const G = batch.groupSize;
    if (!Number.isInteger(G) || G < minGroup) throw new Error(`${fn}: groupSize must be an integer ≥ ${minGroup}, got ${G}`);
    groups = consecutiveGroups(batch.rewards.length, G, fn);
  }
  checkFinite(batch.rewards, fn, 'rewards');
  const outcome = batch.outcomeRewards;
  if (outcome) {
    if (outcome.length !== batch.rewards.length) throw new Error(`${fn}: ${outcome.length} outcomeRewards for ${batch.rewards.length} rewards`);
    checkFinite(outcome, fn, 'outcomeRewards');
  }
  return { rewards: [...batch.rewards], groups, outcome: [...(outcome ?? batch.rewards)] };
}

function consecutiveGroups(n: number, G: number, fn: string): number[][] {
  if (n % G !== 0) throw new Error(`${fn}: ${n} rewards do not split into groups of groupSize ${G}`);
  return Array.from({ length: n / G }, (_, g) => Array.from({ length: G }, (_x, j) => g * G + j));
}

function checkFinite(xs: readonly number[], fn: string, field: string): void {
  const i = xs.findIndex((x) => !Number.isFinite(x));
  if (i >= 0) throw new Error(`${fn}: ${field}[${i}] is ${xs[i]}; rewards must be finite (combineRewards replaces failures with its fallback)`);
}

function checkLengths(batch: TokenRewards, fn: string): void {
  if (batch.lengths.length !== batch.rewards.length) throw new Error(`${fn}: ${batch.lengths.length} lengths for ${batch.rewards.length} rewards`);
  batch.lengths.forEach((n, i) => {
    if (!Number.isInteger(n) || n < 1) throw new Error(`${fn}: lengths[${i}] must be a positive integer, got ${n}`);
    const shaping = batch.tokenRewards?.[i];
    if (shaping && shaping.length !== n) throw new Error(`${fn}: tokenRewards[${i}] has ${shaping.length} entries for a response of ${n} tokens`);
    if (shaping) checkFinite(shaping, fn, `tokenRewards[${i}]`);
  });
  if (batch.tokenRewards && batch.tokenRewards.length !== batch.rewards.length) {
    throw new Error(`${fn}: ${batch.tokenRewards.length} tokenRewards rows for ${batch.rewards.length} rewards`);
  }
}

/** Calls `fn` with each group's rewards and indices, uniform when its `uniformBy` values are all equal. */
function forEachGroup(rewards: readonly number[], groups: readonly number[][], uniformBy: readonly number[], fn: (group: number[], at: number[], uniform: boolean) => void): void {
  for (const at of groups) fn(at.map((i) => rewards[i]), at, at.every((i) => uniformBy[i] === uniformBy[at[0]]));
}

/** `uniformBy`: the outcome rewards, which decide which groups are uniform. */
function stats(uniformBy: readonly number[], groups: readonly number[][], adv: readonly (number | readonly number[])[]): AdvantageStats {
  let uniformGroups = 0;
  forEachGroup(uniformBy, groups, uniformBy, (group, _at, uniform) => {
    if (uniform && group.length > 1) uniformGroups++;
  });
  const zeroAdvantages = adv.filter((a) => (typeof a === 'number' ? a === 0 : a.every((x) => x === 0))).length;
  return { groups: groups.length, uniformGroups, zeroAdvantages };
}

function mean(xs: readonly number[]): number {
  return xs.reduce((a, b) => a + b, 0) / xs.length;
}

function std(xs: readonly number[], unbiased: boolean): number {
  const mu = mean(xs);
  const n = unbiased ? xs.length - 1 : xs.length;
  if (n <= 0) return 0;
  return Math.sqrt(xs.reduce((a, x) => a + (x - mu) ** 2, 0) / n);
}

/**
 * DAPO's dynamic sampling: groups whose rewards are all equal carry no signal under a group baseline
 * (every advantage is 0), so they are dropped and more prompts are sampled until the batch is full.
 */

/** Anything with a group's rewards. */
export interface RewardedGroup {
  rewards: readonly number[];
}

/** Splits groups into those with differing rewards (kept, in order) and the number dropped. */
export function dropUniformGroups<G extends RewardedGroup>(groups: readonly G[]): { kept: G[]; dropped: number } {
  const kept = groups.filter((g) => g.rewards.some((r) => r !== g.rewards[0]));
  return { kept, dropped: groups.length - kept.length };
}

/** Options of {@link dynamicSampling}. */
export interface DynamicSamplingOptions {
  /** Groups wanted (the optimizer batch's prompts). */
  targetGroups: number;
  /** Most sampling rounds (DAPO/verl `max_num_gen_batches`); the last round's shortfall is reported, not hidden. */
  maxRounds: number;
}

/** What {@link dynamicSampling} collected. */
export interface DynamicSamplingResult<G> {
  /** At most `targetGroups` informative groups, in sampling order. */
  groups: G[];
  /** Whether `targetGroups` were reached. */
  complete: boolean;
  /** Sampling rounds run. */
  rounds: number;
  /** Groups sampled in all rounds. */
  sampled: number;
  /** Groups dropped for uniform rewards. */
  dropped: number;
  /** Informative groups beyond the target, discarded (DAPO trims the batch to its size). */
  surplus: number;
}

/**
 * Calls `sample(round)` (round 0, 1, …) and keeps its informative groups until `targetGroups` are
 * collected or `maxRounds` rounds have run. Deterministic given `sample`.
 */
export async function dynamicSampling<G extends RewardedGroup>(
  sample: (round: number) => Promise<readonly G[]> | readonly G[],
  options: DynamicSamplingOptions,
): Promise<DynamicSamplingResult<G>> {
  const { targetGroups, maxRounds } = options;
  if (!Number.isInteger(targetGroups) || targetGroups < 1) throw new Error(`dynamicSampling: targetGroups must be a positive integer, got ${targetGroups}`);
  if (!Number.isInteger(maxRounds) || maxRounds < 1) throw new Error(`dynamicSampling: maxRounds must be a positive integer, got ${maxRounds}`);
  const kept: G[] = [];
  let rounds = 0;
  let sampled = 0;
  let dropped = 0;
  while (kept.length < targetGroups && rounds < maxRounds) {
    const groups = await sample(rounds);
    rounds++;
    sampled += groups.length;
    const split = dropUniformGroups(groups);
    dropped += split.dropped;
    kept.push(...split.kept);
  }
  const surplus = Math.max(0, kept.length - targetGroups);
  return { groups: kept.slice(0, targetGroups), complete: kept.length >= targetGroups, rounds, sampled, dropped, surplus };
}

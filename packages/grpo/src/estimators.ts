/**
 * Advantage estimators as the RL loop calls them: one signature, `(batch) => advantages`, for the
 * built-in estimators (by name) and for a user's own. The batch carries everything an estimator
 * may read — outcome rewards, group size, response lengths, per-token shaping rewards (the KL
 * penalty when the KL is a reward), greedy-baseline rewards (ReMax), and the per-token old and
 * reference log-probs.
 */
import { CLASSMATE_SOURCE, gdpoAdvantages, mainClassmateSeparatedAdvantages } from './gdpo';
import { drGrpoAdvantages, gaeAdvantages, grpoAdvantages, reinforcePlusPlusAdvantages, remaxAdvantages, rlooAdvantages, type GroupedRewards, type SequenceAdvantages, type TokenAdvantages, type TokenRewards } from './advantages';

/** What an estimator gets for one RL step. Rows are prompt by prompt, `groupSize` per prompt. */
export interface AdvantageBatch extends TokenRewards {
  /** The reward of each prompt's greedy completion, when the loop was asked for it (ReMax). */
  greedyRewards?: readonly number[];
  /** Per response token log-probs of the policy that sampled (old log-probs), one row per completion. */
  logp: readonly (readonly number[])[];
  /** Per response token reference log-probs, when the reference was scored. */
  refLogp?: readonly (readonly number[])[];
  /** Which completions are off-policy traces (LUFFY), when the batch has any. */
  offPolicy?: readonly boolean[];
  /** The value model's V at each response token (PPO with a critic), one row per completion. */
  values?: readonly (readonly number[])[];
  /** Each reward source's unweighted value per completion (multi-reward estimators: 'gdpo', 'grpo_main_classmate_separated'). */
  components?: Readonly<Record<string, readonly number[]>>;
  /** Each reward source's weight in `rewards` (a source not named: 1). */
  componentWeights?: Readonly<Record<string, number>>;
  /** Per completion, per response token: 1 where the classmate reward is credited (absent: every token). */
  classmateMask?: readonly (readonly number[])[];
}

/** An advantage estimator: the extension point for new algorithms. */
export type AdvantageFunction = (batch: AdvantageBatch) => SequenceAdvantages | TokenAdvantages;

/** Names of the built-in estimators. */
export type EstimatorName = 'grpo' | 'dr_grpo' | 'rloo' | 'remax' | 'reinforce_pp' | 'reinforce_pp_baseline' | 'gae' | 'gdpo' | 'grpo_main_classmate_separated';

/** Every built-in estimator name (for option validation). */
export const ESTIMATOR_NAMES: readonly EstimatorName[] = ['grpo', 'dr_grpo', 'rloo', 'remax', 'reinforce_pp', 'reinforce_pp_baseline', 'gae', 'gdpo', 'grpo_main_classmate_separated'];

/**
 * PPO's advantages from a value model: per-token rewards (the outcome reward on the last token plus
 * any per-token shaping, the KL penalty) and the batch's `values`, through `gaeAdvantages`
 * (whitened over the batch's tokens).
 */
export function gaeEstimate(batch: AdvantageBatch, options: { gamma?: number; lambda?: number } = {}): TokenAdvantages {
  if (!batch.values) throw new Error("estimator 'gae': the batch has no values (the loop must score it with a value model)");
  const lengths = batch.lengths;
  const tokenRewards = batch.rewards.map((r, i) => {
    const n = lengths[i];
    const shaping = batch.tokenRewards?.[i] ?? new Array<number>(n).fill(0);
    return shaping.map((x, t) => (t === n - 1 ? x + r : x));
  });
  return gaeAdvantages({ tokenRewards, values: batch.values, groupSize: batch.groupIds ? 1 : batch.groupSize }, { ...options, whiten: true });
}

/**
 * Outcome reward plus the sum of the per-token shaping rewards: how sequence-level estimators see a
 * KL reward penalty (token-level ones get the per-token values).
 */
export function sequenceRewards(batch: AdvantageBatch): number[] {
  const shaping = batch.tokenRewards;
  return shaping ? batch.rewards.map((r, i) => r + shaping[i].reduce((a, b) => a + b, 0)) : [...batch.rewards];
}

/**
 * What a sequence-level estimator reads: the {@link sequenceRewards} as `rewards`, and the outcome
 * rewards as `outcomeRewards`, so groups whose outcomes are all equal stay uniform (zeroed where the
 * estimator zeroes them, and counted) whatever the KL penalty adds per completion.
 */
export function sequenceRewardBatch(batch: AdvantageBatch): GroupedRewards {
  return { rewards: sequenceRewards(batch), groupSize: batch.groupSize, groupIds: batch.groupIds, outcomeRewards: batch.rewards, statsFrom: batch.statsFrom };
}

/** A built-in estimator (with its defaults; see advantages.ts for each formula and constant) and whether it needs greedy-completion rewards. */
export function builtinEstimator(name: EstimatorName, options: { gae?: { gamma?: number; lambda?: number } } = {}): { estimate: AdvantageFunction; greedyBaseline: boolean } {
  switch (name) {
    case 'grpo':
      return { estimate: (b) => grpoAdvantages(sequenceRewardBatch(b)), greedyBaseline: false };
    case 'dr_grpo':
      return { estimate: (b) => drGrpoAdvantages(sequenceRewardBatch(b)), greedyBaseline: false };
    case 'rloo':
      return { estimate: (b) => rlooAdvantages(sequenceRewardBatch(b)), greedyBaseline: false };
    case 'remax':
      return {
        estimate: (b) => {
          if (!b.greedyRewards) throw new Error("estimator 'remax': the batch has no greedyRewards (the loop must generate greedy baselines)");
          return remaxAdvantages({ ...sequenceRewardBatch(b), greedyRewards: b.greedyRewards });
        },
        greedyBaseline: true,
      };
    case 'reinforce_pp':
      return { estimate: (b) => reinforcePlusPlusAdvantages(b), greedyBaseline: false };
    case 'gae':
      return { estimate: (b) => gaeEstimate(b, options.gae), greedyBaseline: false };
    case 'reinforce_pp_baseline':
      return { estimate: (b) => reinforcePlusPlusAdvantages(b, { baseline: 'group' }), greedyBaseline: false };
    case 'gdpo':
      return { estimate: (b) => gdpoAdvantages({ components: componentsOf(b, name), weights: b.componentWeights, groupSize: b.groupSize, groupIds: b.groupIds, lengths: b.lengths }), greedyBaseline: false };
    case 'grpo_main_classmate_separated':
      return {
        estimate: (b) => mainClassmateSeparatedAdvantages({ components: componentsOf(b, name), weights: b.componentWeights, groupSize: b.groupSize, groupIds: b.groupIds, lengths: b.lengths, classmateMask: b.classmateMask }),
        greedyBaseline: false,
      };
    default:
      throw new Error(`unknown advantage estimator '${name as string}' (built in: ${ESTIMATOR_NAMES.join(', ')})`);
  }
}

/** The batch's per-source rewards, which the multi-reward estimators need. */
function componentsOf(b: AdvantageBatch, name: EstimatorName): Readonly<Record<string, readonly number[]>> {
  if (!b.components || Object.keys(b.components).length === 0) throw new Error(`estimator '${name}': the batch has no per-source rewards (components); the scorer must report bySource`);
  if (name === 'grpo_main_classmate_separated' && !b.components[CLASSMATE_SOURCE]) throw new Error(`estimator '${name}': no '${CLASSMATE_SOURCE}' reward source (turn classmate rewards on)`);
  return b.components;
}

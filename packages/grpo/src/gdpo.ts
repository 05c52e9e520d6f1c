/**
 * Multi-reward advantages: estimators that read each reward component (reward source) separately
 * instead of their weighted sum.
 *
 * GDPO (Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for
 * Multi-reward RL Optimization", arXiv 2601.05242): each component k is normalised within its group
 * on its own, A_k = (r_k − mean_g r_k) / (std_g r_k + ε_std); the normalised components are summed
 * with the sources' weights, A = Σ_k w_k·A_k; that sum is whitened over the batch,
 * Â = (A − μ) / √(σ² + ε_w). Why: GRPO normalises the *sum*, so distinct combinations of component
 * values that add up to the same total (correct-but-badly-formatted vs wrong-but-well-formatted)
 * get the same advantage — "advantage collapse", fewer distinct advantage values per group.
 *
 * Constants, as in the authors' verl implementation (verl-GDPO's `compute_advantage`, 'gdpo'):
 * ε_std = 1e-6 added to the unbiased group std (verl's `compute_grpo_outcome_advantage`; a
 * component all-equal within a group gives exactly 0 there), ε_w = 1e-8 added to the variance, and
 * the batch statistics token-weighted with the unbiased variance (`masked_whiten` over the response
 * mask: a completion counts once per response token). The authors' code sums the components
 * unweighted; Lathe applies the sources' weights (weight 1 each reproduces it; weight 0 leaves a
 * logged source out of the advantage).
 *
 * grpo_main_classmate_separated (the classmate chain-of-thought method's verl fork): two GRPO
 * advantages, the main one over the base reward (Σ of every non-classmate component, weighted) on
 * every response token, and the classmate one over the weighted classmate reward, added on the
 * tokens the classmate part is credited to (`classmateMask`: the chain of thought the classmate
 * read, or every token).
 */
import { grpoAdvantages, type AdvantageStats, type SequenceAdvantages, type TokenAdvantages } from './advantages';

/** GDPO's constants (see the module comment). */
export const GDPO_DEFAULTS = { stdEpsilon: 1e-6, whitenEpsilon: 1e-8, unbiasedStd: true, whiten: 'token' } as const;

/** The reward source whose values are the classmate reward (classmate.ts writes it; the separated estimator reads it). */
export const CLASSMATE_SOURCE = 'classmate';

/** Per-component rewards of a batch, grouped like {@link GroupedRewards}. */
export interface ComponentRewards {
  /** Each component's unweighted value per completion (`ScoredBatch.bySource`). */
  components: Readonly<Record<string, readonly number[]>>;
  /** Each component's weight; a component not named has weight 1. */
  weights?: Readonly<Record<string, number>>;
  /** Completions per prompt, consecutive (ignored with `groupIds`). */
  groupSize: number;
  /** The group of each completion, when groups are not consecutive runs of `groupSize`. */
  groupIds?: readonly (number | string)[];
  /** Response lengths in tokens: the weights of the token-weighted batch whitening. */
  lengths?: readonly number[];
}

/** Options of {@link gdpoAdvantages} (defaults {@link GDPO_DEFAULTS}). */
export interface GdpoOptions {
  /** Added to each component's group std. Default 1e-6. */
  stdEpsilon?: number;
  /** Added to the batch variance before the square root. Default 1e-8. */
  whitenEpsilon?: number;
  /** Bessel's correction of the group std and the batch variance. Default true (verl's `torch.std` and `masked_whiten`). */
  unbiasedStd?: boolean;
  /** Batch whitening: `'token'` weighted by response length (verl-GDPO), `'sequence'` one count per completion, `'none'`. Default `'token'`. */
  whiten?: 'token' | 'sequence' | 'none';
}

/** GDPO's advantages (formula and constants in the module comment): one per completion. */
export function gdpoAdvantages(batch: ComponentRewards, options: GdpoOptions = {}): SequenceAdvantages & { componentAdvantages: Record<string, number[]> } {
  const { stdEpsilon, whitenEpsilon, unbiasedStd, whiten } = { ...GDPO_DEFAULTS, ...options };
  const names = activeComponents(batch, 'gdpoAdvantages');
  const n = batch.components[names[0]].length;
  const componentAdvantages: Record<string, number[]> = {};
  const summed = new Array<number>(n).fill(0);
  let uniformIn: boolean[] | undefined;
  let groups = 0;
  for (const name of names) {
    const a = grpoAdvantages({ rewards: batch.components[name], groupSize: batch.groupSize, groupIds: batch.groupIds }, { stdEpsilon, unbiasedStd });
    componentAdvantages[name] = a.advantages;
    const w = weightOf(batch, name);
    a.advantages.forEach((x, i) => (summed[i] += w * x));
    groups = a.stats.groups;
    const uniform = groupUniformity(batch.components[name], batch.groupSize, batch.groupIds);
    uniformIn = uniformIn ? uniformIn.map((u, g) => u && uniform[g]) : uniform;
  }
  let out = summed;
  if (whiten !== 'none') {
    const lengths = whiten === 'token' ? batch.lengths : undefined;
    if (whiten === 'token' && !lengths) throw new Error("gdpoAdvantages: whiten 'token' needs the response lengths");
    if (lengths && lengths.length !== n) throw new Error(`gdpoAdvantages: ${lengths.length} lengths for ${n} completions`);
    const w = lengths ?? new Array<number>(n).fill(1);
    const count = w.reduce((a, b) => a + b, 0);
    const mu = summed.reduce((a, x, i) => a + w[i] * x, 0) / count;
    const ss = summed.reduce((a, x, i) => a + w[i] * (x - mu) ** 2, 0);
    const dof = unbiasedStd ? count - 1 : count;
    if (dof <= 0) throw new Error('gdpoAdvantages: batch whitening needs at least 2 response tokens (or completions) in the batch');
    const inv = 1 / Math.sqrt(ss / dof + whitenEpsilon);
    out = summed.map((x) => (x - mu) * inv);
  }
  const stats: AdvantageStats = { groups, uniformGroups: (uniformIn ?? []).filter(Boolean).length, zeroAdvantages: out.filter((x) => x === 0).length };
  return { kind: 'sequence', advantages: out, stats, componentAdvantages };
}

/** Inputs of {@link mainClassmateSeparatedAdvantages}: the components, and where the classmate part is credited. */
export interface SeparatedRewards extends ComponentRewards {
  /**
   * Per completion, per response token: 1 where the classmate advantage is added (the chain of
   * thought the classmate read, `classmate_partial`), 0 elsewhere. Absent: every token (`all`).
   */
  classmateMask?: readonly (readonly number[])[];
  /** Response lengths in tokens (required: the advantages are per token). */
  lengths: readonly number[];
}

/**
 * grpo_main_classmate_separated: A_t = GRPO(main)_i + mask_t·GRPO(w_c·classmate)_i for completion
 * i's token t (module comment). GRPO's constants: unbiased group std, ε 1e-6, uniform groups 0.
 */
export function mainClassmateSeparatedAdvantages(batch: SeparatedRewards): TokenAdvantages & { main: number[]; classmate: number[] } {
  const fn = 'mainClassmateSeparatedAdvantages';
  const cm = batch.components[CLASSMATE_SOURCE];
  if (!cm) throw new Error(`${fn}: no '${CLASSMATE_SOURCE}' reward component (turn classmate rewards on, or use estimator 'grpo'/'gdpo')`);
  const mainNames = Object.keys(batch.components).filter((k) => k !== CLASSMATE_SOURCE && weightOf(batch, k) !== 0);
  const n = cm.length;
  const main = new Array<number>(n).fill(0);
  for (const k of mainNames) batch.components[k].forEach((x, i) => (main[i] += weightOf(batch, k) * x));
  const wc = weightOf(batch, CLASSMATE_SOURCE);
  const grouping = { groupSize: batch.groupSize, groupIds: batch.groupIds };
  const aMain = grpoAdvantages({ rewards: main, ...grouping });
  const aCm = grpoAdvantages({ rewards: cm.map((x) => wc * x), ...grouping });
  if (batch.lengths.length !== n) throw new Error(`${fn}: ${batch.lengths.length} lengths for ${n} completions`);
  if (batch.classmateMask && batch.classmateMask.length !== n) throw new Error(`${fn}: ${batch.classmateMask.length} classmate masks for ${n} completions`);
  const advantages = batch.lengths.map((len, i) => {
    const m = batch.classmateMask?.[i];
    if (m && m.length !== len) throw new Error(`${fn}: classmateMask[${i}] has ${m.length} entries for a response of ${len} tokens`);
    return Array.from({ length: len }, (_, t) => aMain.advantages[i] + (m ? m[t] : 1) * aCm.advantages[i]);
  });
  const uniformMain = groupUniformity(main, batch.groupSize, batch.groupIds);
  const uniformCm = groupUniformity(cm, batch.groupSize, batch.groupIds);
  const stats: AdvantageStats = {
    groups: aMain.stats.groups,
    uniformGroups: uniformMain.filter((u, g) => u && uniformCm[g]).length,
    zeroAdvantages: advantages.filter((row) => row.every((x) => x === 0)).length,
  };
  return { kind: 'token', advantages, returns: advantages.map((r) => r.slice()), stats, main: aMain.advantages, classmate: aCm.advantages };
}

/** Distinct advantage values within each group (rounded to 1e-9): GDPO's measure of advantage collapse. */
export function distinctAdvantagesPerGroup(advantages: readonly number[], groupSize: number): number[] {
  const out: number[] = [];
  for (let s = 0; s < advantages.length; s += groupSize) out.push(new Set(advantages.slice(s, s + groupSize).map((x) => Math.round(x * 1e9))).size);
  return out;
}

function weightOf(batch: ComponentRewards, name: string): number {
  return batch.weights?.[name] ?? 1;
}

/** The components with a non-zero weight, checked for equal lengths. */
function activeComponents(batch: ComponentRewards, fn: string): string[] {
  const all = Object.keys(batch.components);
  if (all.length === 0) throw new Error(`${fn}: no reward components (the batch carries no per-source rewards)`);
  const n = batch.components[all[0]].length;
  for (const k of all) if (batch.components[k].length !== n) throw new Error(`${fn}: component '${k}' has ${batch.components[k].length} values, '${all[0]}' has ${n}`);
  const names = all.filter((k) => weightOf(batch, k) !== 0);
  if (names.length === 0) throw new Error(`${fn}: every reward component has weight 0`);
  return names;
}

/** Per group (in order of first appearance), whether `values` are all equal in it. */
function groupUniformity(values: readonly number[], groupSize: number, groupIds?: readonly (number | string)[]): boolean[] {
  const ids = groupIds ?? values.map((_, i) => Math.floor(i / groupSize));
  const first = new Map<number | string, number>();
  const uniform = new Map<number | string, boolean>();
  ids.forEach((id, i) => {
    if (!first.has(id)) {
      first.set(id, values[i]);
      uniform.set(id, true);
    } else if (values[i] !== first.get(id)) uniform.set(id, false);
  });
  return [...uniform.values()];
}

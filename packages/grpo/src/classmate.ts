/**
 * Classmate chain-of-thought rewards: after the rollout, each completion's chain of thought (CoT) is
 * handed to one or more "classmate" models, which sample K continuations of it; how well they do
 * (graded by the same reward functions as the policy) becomes part of the policy's reward, so
 * reasoning another model can follow is rewarded.
 *
 * Text is exchanged, never token ids: a classmate reads `prompt + completion[0, cut)` as text and
 * returns text, so it may have another tokenizer (a resident model of another family, or a server).
 *
 * Per completion, with cut the end of the CoT region in the completion's text:
 *   - `vanilla_reward`: the classmate reads the whole CoT (cut = the end of the CoT, its closing tag
 *     included) and writes the rest; classmate reward c = mean over its K samples of the grade of
 *     completion[0, cut) + continuation;
 *   - `random_truncate`: cut is drawn uniformly in [CoT start, CoT end] first;
 *   - `remove_wo_cot`: c = (vanilla's mean) − (the mean grade of K continuations of the prompt
 *     alone, without the CoT): only reasoning that helps the classmate is rewarded.
 * Several classmates: c = Σ_m w_m·c_m / Σ_m w_m.
 * Conditions on the main completion's correctness: `always`; `no_classmate_when_main_incorrect`
 * (c = 0 for an incorrect completion — and no classmate is asked); `neg_classmate_when_main_incorrect`
 * (c → −c for an incorrect completion).
 * The step's reward: (1 − λ)·base + λ·c, λ = `weight` — as reward sources, the base sources with
 * their weights × (1 − λ) and the source 'classmate' with weight λ, so the multi-reward estimators
 * ('gdpo', 'grpo_main_classmate_separated') see the classmate part as a component of its own.
 * `classmate_partial` credits the classmate part to the tokens of completion[0, cut) only
 * (`ScoredBatch.classmateChars`); `all` to every token.
 *
 * A completion with no CoT (no closing tag / no marker) is not shown to any classmate: its
 * classmate reward is `noCotReward` (default 0: reasoning that is not there helps no reader), and it
 * is counted (source 'classmate_no_cot', weight 0: logged, not trained on). A classmate call that
 * fails throws (the step fails, naming the classmate and its error) unless `fallbackReward` is set:
 * then the whole batch's classmate reward is that value, each sample counted as a failure of source
 * 'classmate' — never a silent 0.
 */
import type { RewardFailure, RewardSample, RewardScorer, ScoredBatch, SourceStats } from './rewards';
import { CLASSMATE_SOURCE } from './gdpo';

/** Classmate reward types (module comment). */
export type ClassmateRewardType = 'vanilla_reward' | 'random_truncate' | 'remove_wo_cot';
/** Every classmate reward type, for option validation. */
export const CLASSMATE_REWARD_TYPES: readonly ClassmateRewardType[] = ['vanilla_reward', 'random_truncate', 'remove_wo_cot'];
/** Conditions on the main completion's correctness (module comment). */
export type ClassmateCondition = 'always' | 'no_classmate_when_main_incorrect' | 'neg_classmate_when_main_incorrect';
/** Every condition, for option validation. */
export const CLASSMATE_CONDITIONS: readonly ClassmateCondition[] = ['always', 'no_classmate_when_main_incorrect', 'neg_classmate_when_main_incorrect'];
/** Which tokens the classmate part of the reward is credited to. */
export type ClassmateTokenMode = 'classmate_partial' | 'all';
/** Every token mode, for option validation. */
export const CLASSMATE_TOKEN_MODES: readonly ClassmateTokenMode[] = ['classmate_partial', 'all'];

/** The weight-0 sources the classmate scorer logs beside 'classmate'. */
export const CLASSMATE_LOG_SOURCES = {
  /** 1 where the completion had no CoT (its mean: the fraction of such completions). */
  noCot: 'classmate_no_cot',
  /** The classmates' mean grade continuing the policy's CoT, before any condition or subtraction: the classmate accuracy. */
  accuracy: 'classmate_accuracy',
} as const;

/** A model that continues text: resident in this process or behind a server. */
export interface ClassmateModel {
  /** Name in metrics and errors. */
  name: string;
  /** Weight among the classmates. Default 1. */
  weight?: number;
  /** Where it runs, for error messages (a URL, 'resident', 'self-play'). */
  where?: string;
  /**
   * `k` continuations of each text, `seed` fixing the sampling (the same seed and texts give the same
   * continuations). Row i answers texts[i] and has k strings.
   */
  continueTexts(texts: readonly string[], k: number, seed: number): Promise<string[][]>;
  /**
   * The text this classmate continues, from the prompt text and the completion's prefix — e.g. the
   * prompt rendered with its own tokenizer's chat template. Default: the scorer's `formatText`.
   */
  formatText?: (prompt: string, prefix: string) => string;
}

/** Where a completion's chain of thought is. */
export interface CotFormat {
  /** Opening tag. Default '<think>'. */
  open?: string;
  /** Closing tag. Default '</think>'. */
  close?: string;
  /** Instead of tags: the CoT is the text before the first occurrence of this marker (e.g. 'Answer:'). */
  marker?: string;
}

/** Options of {@link classmateScorer}. */
export interface ClassmateOptions<M> {
  classmates: readonly ClassmateModel[];
  /** Continuations per classmate per completion (K). Default 4. */
  samples?: number;
  /** λ: the classmate part's weight in the step's reward, (1 − λ)·base + λ·classmate. Default 0.5. */
  weight?: number;
  rewardType?: ClassmateRewardType;
  condition?: ClassmateCondition;
  tokenMode?: ClassmateTokenMode;
  cot?: CotFormat;
  /** Whether the main completion is correct (the conditions read it). Default: its 'correct' source > 0, else its base reward > 0. */
  isCorrect?: (base: ScoredBatch, index: number) => boolean;
  /** Grades a classmate's text (CoT prefix + continuation). Default: the base scorer's reward. */
  grade?: RewardScorer<M>;
  /** The classmate reward of a completion without a CoT. Default 0. */
  noCotReward?: number;
  /** When set, a failed classmate call gives every sample of the batch this classmate reward, counted as failures; unset: the step fails. */
  fallbackReward?: number;
  /** Seed of the truncation points and the classmates' sampling (each call of the scorer advances it). Default 0. */
  seed?: number;
  /** The text a classmate continues, from the prompt text and the completion's prefix, where the classmate has no `formatText` of its own. Default their concatenation. */
  formatText?: (prompt: string, prefix: string) => string;
}

/** The defaults of {@link ClassmateOptions}. */
export const CLASSMATE_DEFAULTS = { samples: 4, weight: 0.5, rewardType: 'vanilla_reward', condition: 'always', tokenMode: 'classmate_partial', noCotReward: 0, seed: 0 } as const;

/** The CoT region of a completion's text: [start, end) the reasoning, `cut` where a full-CoT classmate input ends. */
export interface CotSpan {
  start: number;
  end: number;
  /** End of the region the classmate reads for `vanilla_reward` (after the closing tag, or the marker's start). */
  cut: number;
}

/**
 * The CoT of `completion`, or undefined when it has none. With tags: the text before the first
 * closing tag, from after the last opening tag before it (or from the start: chat templates may
 * open the thinking block in the prompt). With a marker: the text before its first occurrence.
 */
export function findCot(completion: string, format: CotFormat = {}): CotSpan | undefined {
  if (format.marker !== undefined) {
    if (format.marker === '') throw new Error('findCot: marker must not be empty');
    const at = completion.indexOf(format.marker);
    return at > 0 ? { start: 0, end: at, cut: at } : undefined;
  }
  const open = format.open ?? '<think>';
  const close = format.close ?? '</think>';
  const end = completion.indexOf(close);
  if (end < 0) return undefined;
  const o = completion.lastIndexOf(open, end);
  const start = o >= 0 ? o + open.length : 0;
  if (completion.slice(start, end).trim() === '') return undefined;
  return { start, end, cut: end + close.length };
}

/** The counts of a classmate scoring call (also logged as weight-0 sources). */
export interface ClassmateCounts {
  noCot: number;
  /** Completions the condition kept from the classmates (incorrect, with `no_classmate_when_main_incorrect`). */
  skipped: number;
  /** Samples that got `fallbackReward` after a failed classmate call. */
  fallbacks: number;
}

/**
 * A reward scorer that adds classmate rewards to `base`'s (formulas and rules in the module comment).
 * The returned batch's `bySource` holds the base sources, 'classmate' and the logged weight-0 sources;
 * `weights` says how they combine; `classmateChars` is set with `classmate_partial`.
 */
export function classmateScorer<M>(base: RewardScorer<M>, options: ClassmateOptions<M>): RewardScorer<M> & { lastCounts: () => ClassmateCounts | undefined } {
  const o = { ...CLASSMATE_DEFAULTS, ...options };
  if (o.classmates.length === 0) throw new Error('classmateScorer: give at least one classmate');
  const names = new Set<string>();
  for (const c of o.classmates) {
    if (names.has(c.name)) throw new Error(`classmateScorer: two classmates are named '${c.name}'`);
    names.add(c.name);
    if (!(Number.isFinite(c.weight ?? 1) && (c.weight ?? 1) >= 0)) throw new Error(`classmateScorer: classmate '${c.name}' has weight ${c.weight}; weights must be ≥ 0`);
  }
  const totalWeight = o.classmates.reduce((a, c) => a + (c.weight ?? 1), 0);
  if (!(totalWeight > 0)) throw new Error('classmateScorer: the classmates\' weights sum to 0');
  if (!(Number.isInteger(o.samples) && o.samples >= 1)) throw new Error(`classmateScorer: samples must be an integer ≥ 1, got ${o.samples}`);
  if (!(o.weight >= 0 && o.weight <= 1)) throw new Error(`classmateScorer: weight must be in [0, 1], got ${o.weight}`);
  if (!CLASSMATE_REWARD_TYPES.includes(o.rewardType)) throw new Error(`classmateScorer: rewardType must be one of ${CLASSMATE_REWARD_TYPES.join(', ')}, got '${o.rewardType}'`);
  if (!CLASSMATE_CONDITIONS.includes(o.condition)) throw new Error(`classmateScorer: condition must be one of ${CLASSMATE_CONDITIONS.join(', ')}, got '${o.condition}'`);
  if (!CLASSMATE_TOKEN_MODES.includes(o.tokenMode)) throw new Error(`classmateScorer: tokenMode must be one of ${CLASSMATE_TOKEN_MODES.join(', ')}, got '${o.tokenMode}'`);
  if (o.fallbackReward !== undefined && !Number.isFinite(o.fallbackReward)) throw new Error(`classmateScorer: fallbackReward must be finite, got ${o.fallbackReward}`);
  const grade = o.grade ?? base;
  const isCorrect = o.isCorrect ?? defaultIsCorrect;
  const formatText = o.formatText ?? ((prompt: string, prefix: string) => prompt + prefix);
  let call = 0;
  let counts: ClassmateCounts | undefined;

  const scorer = async (samples: readonly RewardSample<M>[]): Promise<ScoredBatch> => {
    const seed = mix(o.seed, call++);
    const scored = await base(samples);
    const n = samples.length;
    const spans = samples.map((s) => findCot(s.completion, o.cot));
    const correct = samples.map((_, i) => isCorrect(scored, i));
    const ask = samples.map((_, i) => spans[i] !== undefined && !(o.condition === 'no_classmate_when_main_incorrect' && !correct[i]));
    // the cut of each completion shown to the classmates
    const cuts = spans.map((sp, i) => (sp === undefined ? undefined : o.rewardType === 'random_truncate' ? sp.start + Math.floor(uniform(mix(seed, i)) * (sp.end - sp.start + 1)) : sp.cut));
    const asked = samples.map((_, i) => i).filter((i) => ask[i]);
    const failures: RewardFailure[] = [];
    let withCot: number[] = new Array<number>(n).fill(0);
    let classmate: number[];
    let fallbacks = 0;
    try {
      withCot = await meanGrade(o.classmates, totalWeight, asked.map((i) => ({ sample: samples[i], prefix: samples[i].completion.slice(0, cuts[i]) })), o.samples, seed, grade, n, asked, formatText);
      const without = o.rewardType === 'remove_wo_cot' ? await meanGrade(o.classmates, totalWeight, asked.map((i) => ({ sample: samples[i], prefix: '' })), o.samples, mix(seed, 0x5bd1e995), grade, n, asked, formatText) : undefined;
      classmate = samples.map((_, i) => {
        if (spans[i] === undefined) return o.noCotReward;
        if (!ask[i]) return 0;
        const c = withCot[i] - (without ? without[i] : 0);
        return o.condition === 'neg_classmate_when_main_incorrect' && !correct[i] ? -c : c;
      });
    } catch (e) {
      if (o.fallbackReward === undefined) throw e;
      const detail = e instanceof Error ? e.message : String(e);
      classmate = samples.map((s, i) => {
        if (spans[i] === undefined) return o.noCotReward;
        fallbacks++;
        failures.push({ source: CLASSMATE_SOURCE, index: i, prompt: s.prompt, kind: 'threw', detail });
        return o.fallbackReward!;
      });
      console.warn(`classmate rewards: ${detail}; using the fallback reward ${o.fallbackReward} for ${fallbacks} sample(s)`);
    }
    counts = { noCot: spans.filter((s) => s === undefined).length, skipped: spans.filter((s, i) => s !== undefined && !ask[i]).length, fallbacks };
    const baseWeights = scored.weights ?? Object.fromEntries(Object.keys(scored.bySource).map((k) => [k, 1]));
    const lambda = o.weight;
    const weights: Record<string, number> = Object.fromEntries(Object.entries(baseWeights).map(([k, w]) => [k, (1 - lambda) * w]));
    weights[CLASSMATE_SOURCE] = lambda;
    weights[CLASSMATE_LOG_SOURCES.noCot] = 0;
    weights[CLASSMATE_LOG_SOURCES.accuracy] = 0;
    const bySource: Record<string, number[]> = {
      ...scored.bySource,
      [CLASSMATE_SOURCE]: classmate,
      [CLASSMATE_LOG_SOURCES.noCot]: spans.map((s) => (s === undefined ? 1 : 0)),
      [CLASSMATE_LOG_SOURCES.accuracy]: withCot,
    };
    const rewards = scored.rewards.map((r, i) => (1 - lambda) * r + lambda * classmate[i]);
    const allFailures = [...scored.failures, ...failures].sort((a, b) => a.index - b.index || a.source.localeCompare(b.source));
    const stats: Record<string, SourceStats> = { ...scored.stats };
    for (const k of [CLASSMATE_SOURCE, CLASSMATE_LOG_SOURCES.noCot, CLASSMATE_LOG_SOURCES.accuracy]) stats[k] = { ...meanStd(bySource[k]), failures: k === CLASSMATE_SOURCE ? failures.length : 0 };
    const classmateChars = o.tokenMode === 'classmate_partial' ? cuts.map((c) => c ?? 0) : undefined;
    return { rewards, bySource, failures: allFailures, stats, weights, ...(classmateChars ? { classmateChars } : {}) };
  };
  return Object.assign(scorer, { lastCounts: () => counts });
}

/**
 * Per asked completion, Σ_m w_m·(mean grade of classmate m's K texts) / Σ_m w_m; 0 for the others.
 * The classmates run concurrently; a classmate's failure is rethrown with its name and place.
 */
async function meanGrade<M>(
  classmates: readonly ClassmateModel[],
  totalWeight: number,
  items: readonly { sample: RewardSample<M>; prefix: string }[],
  k: number,
  seed: number,
  grade: RewardScorer<M>,
  n: number,
  at: readonly number[],
  formatText: (prompt: string, prefix: string) => string,
): Promise<number[]> {
  const out = new Array<number>(n).fill(0);
  if (items.length === 0) return out;
  const perClassmate = await Promise.all(
    classmates.map(async (c, m) => {
      let texts: string[][];
      try {
        texts = await c.continueTexts(
          items.map((it) => (c.formatText ?? formatText)(it.sample.prompt, it.prefix)),
          k,
          mix(seed, m + 1),
        );
      } catch (e) {
        throw new Error(`classmate '${c.name}'${c.where ? ` (${c.where})` : ''} failed: ${e instanceof Error ? e.message : String(e)}`);
      }
      if (texts.length !== items.length || texts.some((row) => row.length !== k)) throw new Error(`classmate '${c.name}' returned ${texts.length} rows for ${items.length} texts (expected ${k} continuations each)`);
      const graded = await grade(items.flatMap((it, j) => texts[j].map((t) => ({ ...it.sample, completion: it.prefix + t }))));
      return items.map((_, j) => graded.rewards.slice(j * k, (j + 1) * k).reduce((a, b) => a + b, 0) / k);
    }),
  );
  at.forEach((i, j) => (out[i] = classmates.reduce((a, c, m) => a + (c.weight ?? 1) * perClassmate[m][j], 0) / totalWeight));
  return out;
}

function defaultIsCorrect(base: ScoredBatch, i: number): boolean {
  return (base.bySource.correct ?? base.rewards)[i] > 0;
}

function meanStd(xs: readonly number[]): { mean: number; std: number } {
  const mean = xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0;
  return { mean, std: xs.length ? Math.sqrt(xs.reduce((a, x) => a + (x - mean) ** 2, 0) / xs.length) : 0 };
}

/** A 32-bit hash of two integers (the truncation points' and classmates' seeds). */
export function mix(a: number, b: number): number {
  let h = Math.imul((a ^ 0x9e3779b9) >>> 0, 0x85ebca6b) >>> 0;
  h = Math.imul((h ^ (b + 0x7f4a7c15)) >>> 0, 0xc2b2ae35) >>> 0;
  return (h ^ (h >>> 16)) >>> 0;
}

/** A uniform number in [0, 1) from a 32-bit seed (one mulberry32 step). */
function uniform(seed: number): number {
  let t = (seed + 0x6d2b79f5) >>> 0;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}

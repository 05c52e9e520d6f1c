/**
 * Rewards: user functions `(prompt, completion, meta) => number | Promise<number>`, several
 * combined with weights. A function that throws or returns a non-finite number (NaN, ±∞) never
 * silently becomes 0: the failure is reported with its prompt, counted per source, and replaced by
 * the configured `fallback`.
 */
import { overlongPenalty, type OverlongOptions } from '@lathe/graders';

/** A reward: any function of the prompt, the completion text and per-sample metadata. */
export type RewardFunction<M = unknown> = (prompt: string, completion: string, meta: M) => number | Promise<number>;

/** A named, weighted reward function. */
export interface RewardSource<M = unknown> {
  /** Name in metrics and failure reports (unique). */
  name: string;
  fn: RewardFunction<M>;
  /** Weight in the sum. Default 1. */
  weight?: number;
}

/** One sample to score. */
export interface RewardSample<M = unknown> {
  prompt: string;
  completion: string;
  meta: M;
}

/** A reward function that failed on one sample. */
export interface RewardFailure {
  source: string;
  /** Index of the sample in the scored batch. */
  index: number;
  prompt: string;
  /** Threw, or returned NaN / ±∞ (or a non-number). */
  kind: 'threw' | 'non-finite';
  /** The error message, or the value returned. */
  detail: string;
}

/** Options of {@link combineRewards}. */
export interface CombineRewardsOptions {
  /**
   * The value a failed source contributes (before its weight). Required: choose it (e.g. the
   * worst reward, to penalise completions that break the grader).
   */
  fallback: number;
  /** Called once per failure. Default: `console.warn` with the source, the error and the prompt (first 200 characters). */
  onFailure?: (failure: RewardFailure) => void;
}

/** Mean, standard deviation (population) and failure count of one source over a batch. */
export interface SourceStats {
  mean: number;
  std: number;
  failures: number;
}

/** Rewards of a batch. */
export interface ScoredBatch {
  /** Σ_source weight·value per sample. */
  rewards: number[];
  /** Each source's unweighted value per sample (fallback substituted on failure). */
  bySource: Record<string, number[]>;
  /** Every failure of the batch. */
  failures: RewardFailure[];
  /** Per source: mean, std and failures (for metrics). */
  stats: Record<string, SourceStats>;
  /** Each source's weight in `rewards` (the multi-reward estimators read the sources separately). */
  weights?: Record<string, number>;
  /**
   * Per sample, the characters at the start of the completion the classmate reward is credited to
   * (`classmate_partial`: the chain of thought the classmate read); undefined entries and an absent
   * array: every token.
   */
  classmateChars?: (number | undefined)[];
}

/** Scores batches with several weighted reward sources. */
export type RewardScorer<M> = (samples: readonly RewardSample<M>[]) => Promise<ScoredBatch>;

/**
 * Combines reward sources into one scorer: each sample's reward is Σ weight·value; every call of
 * every source runs concurrently. See the module comment for failures.
 */
export function combineRewards<M>(sources: readonly RewardSource<M>[], options: CombineRewardsOptions): RewardScorer<M> {
  if (sources.length === 0) throw new Error('combineRewards: give at least one reward source');
  const names = new Set<string>();
  for (const s of sources) {
    if (!s.name) throw new Error('combineRewards: every reward source needs a name');
    if (names.has(s.name)) throw new Error(`combineRewards: two reward sources are named '${s.name}'`);
    names.add(s.name);
    if (s.weight !== undefined && !Number.isFinite(s.weight)) throw new Error(`combineRewards: source '${s.name}' has weight ${s.weight}; weights must be finite`);
  }
  if (!Number.isFinite(options.fallback)) throw new Error(`combineRewards: fallback must be a finite number, got ${options.fallback}`);
  const report = options.onFailure ?? defaultReport;

  return async (samples) => {
    const failures: RewardFailure[] = [];
    const bySource: Record<string, number[]> = {};
    await Promise.all(
      sources.map(async (source) => {
        bySource[source.name] = await Promise.all(
          samples.map(async (s, index) => {
            let value: unknown;
            try {
              value = await source.fn(s.prompt, s.completion, s.meta);
            } catch (e) {
              const f: RewardFailure = { source: source.name, index, prompt: s.prompt, kind: 'threw', detail: e instanceof Error ? e.message : String(e) };
              failures.push(f);
              report(f);
              return options.fallback;
            }
            if (typeof value !== 'number' || !Number.isFinite(value)) {
              const f: RewardFailure = { source: source.name, index, prompt: s.prompt, kind: 'non-finite', detail: String(value) };
              failures.push(f);
              report(f);
              return options.fallback;
            }
            return value;
          }),
        );
      }),
    );
    failures.sort((a, b) => a.index - b.index || a.source.localeCompare(b.source));
    const rewards = samples.map((_s, i) => sources.reduce((acc, src) => acc + (src.weight ?? 1) * bySource[src.name][i], 0));
    const stats: Record<string, SourceStats> = {};
    for (const src of sources) {
      const xs = bySource[src.name];
      const mean = xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0;
      const std = xs.length ? Math.sqrt(xs.reduce((a, x) => a + (x - mean) ** 2, 0) / xs.length) : 0;
      stats[src.name] = { mean, std, failures: failures.filter((f) => f.source === src.name).length };
    }
    return { rewards, bySource, failures, stats, weights: Object.fromEntries(sources.map((src) => [src.name, src.weight ?? 1])) };
  };
}

function defaultReport(f: RewardFailure): void {
  const prompt = f.prompt.length > 200 ? `${f.prompt.slice(0, 200)}…` : f.prompt;
  console.warn(`reward '${f.source}' ${f.kind === 'threw' ? 'threw' : 'returned'} ${f.detail} on sample ${f.index}; using the fallback. Prompt: ${JSON.stringify(prompt)}`);
}

/** Metadata the overlong reward reads. */
export interface LengthMeta {
  /** Response length in tokens. */
  completionTokens: number;
}

/**
 * DAPO's overlong reward shaping as a reward source: 0 up to `maxLength − buffer` tokens, then
 * falling linearly to −maxPenalty at `maxLength` (the graders' `overlongPenalty`). DAPO uses
 * buffer 4,096 of 20,480 and maxPenalty 1.
 */
export function overlongReward(options: OverlongOptions): RewardFunction<LengthMeta> {
  overlongPenalty(0, options); // validates the options now rather than on the first sample
  return (_prompt, _completion, meta) => overlongPenalty(meta.completionTokens, options);
}

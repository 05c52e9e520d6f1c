/**
 * The numbers of `lathe eval`'s table, from graded samples: avg@n, unbiased pass@k, maj@n,
 * best-of-n by a score, MATH subject/level breakdowns, response lengths and the truncation rate.
 * The estimators themselves are the graders' (`passAtK`, `majorityVote`, `bestOfN`).
 */
import { accuracyReport, bestOfN, majorityVote, meanPassAtK, voteKey, type AccuracyCell } from '@lathe/graders';

/** One graded sample, as the metrics read it. */
export interface GradedSample {
  /** The problem's id within its benchmark: samples with the same id are one problem's n samples. */
  problemId: string;
  correct: boolean;
  /** The extracted final answer, or null ("no answer": counted wrong, casts no vote). */
  extracted: string | null;
  finishReason: 'stop' | 'length';
  /** Generated tokens (the stop token included when one ended the sample). */
  outputTokens: number;
  subject?: string;
  level?: number;
  /** A reward model's or critic's score, for best-of-n. */
  score?: number | null;
}

/** Response-length statistics in tokens. */
export interface LengthStats {
  mean: number;
  median: number;
  p90: number;
  max: number;
}

/** One benchmark's metrics for one model. */
export interface BenchmarkMetrics {
  problems: number;
  samples: number;
  /** Samples per problem (the smallest, if problems differ). */
  n: number;
  /** Mean over problems of the fraction of their samples that are correct. */
  avgAtN: number;
  /** Unbiased pass@k for each requested k ≤ n, keyed by k. */
  passAtK: Record<string, number>;
  /** Fraction of problems whose most frequent extracted answer is correct (no answers: wrong). */
  majAtN: number;
  /** Fraction of problems whose highest-scored sample is correct; null without scores. */
  bestOfN: number | null;
  /** Sample accuracy per subject and per level, where the problems carry them. */
  bySubject: Record<string, AccuracyCell>;
  byLevel: Record<string, AccuracyCell>;
  length: LengthStats;
  /** Fraction of samples that hit the token limit. */
  truncationRate: number;
  /** Fraction of samples with no extractable answer. */
  noAnswerRate: number;
}

/** Samples grouped by problem, in first-seen order. */
function byProblem(samples: readonly GradedSample[]): GradedSample[][] {
  const groups = new Map<string, GradedSample[]>();
  for (const s of samples) {
    const g = groups.get(s.problemId);
    if (g) g.push(s);
    else groups.set(s.problemId, [s]);
  }
  return [...groups.values()];
}

/** The q-quantile of sorted values by the nearest-rank method (the value at rank ⌈q·n⌉). */
function nearestRank(sorted: readonly number[], q: number): number {
  return sorted.length === 0 ? 0 : sorted[Math.max(0, Math.ceil(q * sorted.length) - 1)];
}

/** Mean, median (the lower middle for even counts), 90th percentile (nearest rank) and maximum. */
export function lengthStats(lengths: readonly number[]): LengthStats {
  if (lengths.length === 0) return { mean: 0, median: 0, p90: 0, max: 0 };
  const sorted = [...lengths].sort((a, b) => a - b);
  return { mean: sorted.reduce((s, x) => s + x, 0) / sorted.length, median: nearestRank(sorted, 0.5), p90: nearestRank(sorted, 0.9), max: sorted[sorted.length - 1] };
}

/** Whether a problem's majority answer is correct: the samples that voted for it are graded as it was. */
function majorityCorrect(group: readonly GradedSample[]): boolean {
  const vote = majorityVote(group.map((s) => s.extracted));
  if (vote === null) return false;
  const key = voteKey(vote.answer);
  return group.find((s) => s.extracted !== null && voteKey(s.extracted) === key)?.correct ?? false;
}

/**
 * The metrics of one benchmark's graded samples. `ks`: the k of pass@k (those above n are left
 * out). Best-of-n is computed when every sample has a score.
 */
export function benchmarkMetrics(samples: readonly GradedSample[], ks: readonly number[] = []): BenchmarkMetrics {
  const groups = byProblem(samples);
  const n = groups.length === 0 ? 0 : Math.min(...groups.map((g) => g.length));
  const mean = (xs: number[]) => (xs.length === 0 ? 0 : xs.reduce((s, x) => s + x, 0) / xs.length);
  const correctness = groups.map((g) => g.map((s) => s.correct));
  const passAtK: Record<string, number> = {};
  for (const k of ks) if (k >= 1 && k <= n) passAtK[String(k)] = meanPassAtK(correctness, k);
  const scored = samples.length > 0 && samples.every((s) => typeof s.score === 'number');
  const report = accuracyReport(samples);
  return {
    problems: groups.length,
    samples: samples.length,
    n,
    avgAtN: mean(correctness.map((c) => c.filter(Boolean).length / c.length)),
    passAtK,
    majAtN: mean(groups.map((g) => (majorityCorrect(g) ? 1 : 0))),
    bestOfN: scored ? mean(groups.map((g) => (bestOfN(g.map((s) => ({ score: s.score as number, correct: s.correct }))) ? 1 : 0))) : null,
    bySubject: report.bySubject,
    byLevel: report.byLevel,
    length: lengthStats(samples.map((s) => s.outputTokens)),
    truncationRate: samples.length === 0 ? 0 : samples.filter((s) => s.finishReason === 'length').length / samples.length,
    noAnswerRate: samples.length === 0 ? 0 : samples.filter((s) => s.extracted === null).length / samples.length,
  };
}

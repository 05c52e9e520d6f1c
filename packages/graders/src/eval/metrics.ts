/** Evaluation helpers: accuracy with breakdowns, pass@k, best-of-n and majority vote. */
import { normalizeAnswer } from '../math/normalize';
import { parseNumber } from '../math/numbers';

/** Correct over total, and their ratio (0 when there are no rows). */
export interface AccuracyCell {
  correct: number;
  total: number;
  accuracy: number;
}

/** Accuracy overall and per subject and level. */
export interface AccuracyReport {
  overall: AccuracyCell;
  bySubject: Record<string, AccuracyCell>;
  byLevel: Record<string, AccuracyCell>;
}

/** One graded problem; subject and level are optional (GSM8K has neither). */
export interface GradedRow {
  correct: boolean;
  subject?: string;
  level?: number | string;
}

function add(cells: Record<string, AccuracyCell>, key: string, correct: boolean): void {
  const cell = (cells[key] ??= { correct: 0, total: 0, accuracy: 0 });
  cell.total++;
  if (correct) cell.correct++;
  cell.accuracy = cell.correct / cell.total;
}

/** Accuracy over `rows`, broken down by `subject` and `level` where the rows carry them. */
export function accuracyReport(rows: readonly GradedRow[]): AccuracyReport {
  const overall: Record<string, AccuracyCell> = {};
  const bySubject: Record<string, AccuracyCell> = {};
  const byLevel: Record<string, AccuracyCell> = {};
  for (const r of rows) {
    add(overall, 'all', r.correct);
    if (r.subject !== undefined) add(bySubject, r.subject, r.correct);
    if (r.level !== undefined) add(byLevel, String(r.level), r.correct);
  }
  return { overall: overall.all ?? { correct: 0, total: 0, accuracy: 0 }, bySubject, byLevel };
}

/**
 * The unbiased pass@k estimate from n samples of which c are correct: 1 − C(n−c, k) / C(n, k),
 * computed as a product so that large n does not overflow.
 */
export function passAtK(n: number, c: number, k: number): number {
  if (!Number.isInteger(n) || !Number.isInteger(c) || !Number.isInteger(k) || n < 1 || c < 0 || c > n || k < 1 || k > n) {
    throw new Error(`passAtK: need integers 0 ≤ c ≤ n and 1 ≤ k ≤ n, got n=${n}, c=${c}, k=${k}`);
  }
  if (n - c < k) return 1;
  let allWrong = 1;
  for (let i = n - c + 1; i <= n; i++) allWrong *= 1 - k / i;
  return 1 - allWrong;
}

/** Mean pass@k over problems, each given as the correctness of its samples. */
export function meanPassAtK(samples: readonly (readonly boolean[])[], k: number): number {
  if (samples.length === 0) return 0;
  const total = samples.reduce((s, row) => s + passAtK(row.length, row.filter(Boolean).length, k), 0);
  return total / samples.length;
}

/** Whether the highest-scored candidate is correct (the first of equal scores wins); false for none. */
export function bestOfN(candidates: readonly { score: number; correct: boolean }[]): boolean {
  let best: { score: number; correct: boolean } | null = null;
  for (const c of candidates) if (best === null || c.score > best.score) best = c;
  return best?.correct ?? false;
}

/** The key answers are grouped by in a vote: the normalised answer, or its value for plain numbers. */
export function voteKey(answer: string): string {
  const normalised = normalizeAnswer(answer);
  const n = parseNumber(normalised);
  return n ? `#${Number(n.value.toPrecision(12))}` : normalised;
}

/**
 * The most frequent extracted answer (null answers do not vote; ties go to the answer seen first),
 * with its vote count, or null when nobody answered.
 */
export function majorityVote(answers: readonly (string | null)[]): { answer: string; votes: number } | null {
  const groups = new Map<string, { answer: string; votes: number }>();
  for (const a of answers) {
    if (a === null || a.trim() === '') continue;
    const key = voteKey(a);
    const g = groups.get(key);
    if (g) g.votes++;
    else groups.set(key, { answer: a, votes: 1 });
  }
  let best: { answer: string; votes: number } | null = null;
  for (const g of groups.values()) if (best === null || g.votes > best.votes) best = g;
  return best;
}

/** `lathe eval`'s metrics against values computed by hand for three problems × four samples. */
import { benchmarkMetrics, lengthStats, type GradedSample } from '@lathe/recipes';

const sample = (problemId: string, correct: boolean, extracted: string | null, outputTokens: number, extra: Partial<GradedSample> = {}): GradedSample => ({ problemId, correct, extracted, outputTokens, finishReason: 'stop', ...extra });

// A: 2 of 4 correct, a 2–2 tie between 5 (right) and 4 (wrong): the first seen wins
// B: none correct, one sample with no answer, all four cut at the token limit
// C: 3 of 4 correct, written three ways (1/2, 0.5, \frac{1}{2}) that vote as one answer
const A = { subject: 'Algebra', level: 1 };
const B = { subject: 'Algebra', level: 5, finishReason: 'length' as const };
const C = { subject: 'Geometry', level: 1 };
const samples: GradedSample[] = [
  sample('A', true, '5', 10, { ...A, score: 0.1 }),
  sample('A', false, '4', 20, { ...A, score: 0.9 }),
  sample('A', false, '4', 30, { ...A, score: 0.3 }),
  sample('A', true, '5', 40, { ...A, score: 0.2 }),
  sample('B', false, null, 100, { ...B, score: 0.5 }),
  sample('B', false, '3', 100, { ...B, score: 0.5 }),
  sample('B', false, '3', 100, { ...B, score: 0.5 }),
  sample('B', false, '7', 100, { ...B, score: 0.5 }),
  sample('C', true, '1/2', 5, { ...C, score: 0.9 }),
  sample('C', true, '0.5', 5, { ...C, score: 0.5 }),
  sample('C', true, '\\frac{1}{2}', 5, { ...C, score: 0.1 }),
  sample('C', false, '2', 5, { ...C, score: 0.2 }),
];

test('avg@n, pass@k (unbiased), maj@n and best-of-n', () => {
  const m = benchmarkMetrics(samples, [1, 2, 8]);
  expect([m.problems, m.samples, m.n]).toEqual([3, 12, 4]);
  expect(m.avgAtN).toBeCloseTo((2 / 4 + 0 + 3 / 4) / 3, 12);
  // pass@1 = avg@n; pass@2 per problem: 1 − C(n−c, 2)/C(4, 2) = 1 − 1/6, 0, 1 (fewer than 2 wrong); k = 8 > n is left out
  expect(Object.keys(m.passAtK)).toEqual(['1', '2']);
  expect(m.passAtK['1']).toBeCloseTo(m.avgAtN, 12);
  expect(m.passAtK['2']).toBeCloseTo((5 / 6 + 0 + 1) / 3, 12);
  // majority: A's tie → 5 (right), B's 3 (wrong), C's 0.5 with three votes (right)
  expect(m.majAtN).toBeCloseTo(2 / 3, 12);
  // best score: A's 0.9 sample (wrong), B (all wrong), C's 0.9 sample (right)
  expect(m.bestOfN).toBeCloseTo(1 / 3, 12);
});

test('subject and level breakdowns count samples', () => {
  const m = benchmarkMetrics(samples);
  expect(m.bySubject).toEqual({ Algebra: { correct: 2, total: 8, accuracy: 0.25 }, Geometry: { correct: 3, total: 4, accuracy: 0.75 } });
  expect(m.byLevel).toEqual({ '1': { correct: 5, total: 8, accuracy: 5 / 8 }, '5': { correct: 0, total: 4, accuracy: 0 } });
});

test('lengths, truncation and no-answer rates', () => {
  const m = benchmarkMetrics(samples);
  // sorted: 5 5 5 5 10 20 30 40 100 100 100 100 → median at rank 6, p90 at rank ⌈10.8⌉ = 11
  expect(m.length).toEqual({ mean: 520 / 12, median: 20, p90: 100, max: 100 });
  expect(m.truncationRate).toBeCloseTo(4 / 12, 12);
  expect(m.noAnswerRate).toBeCloseTo(1 / 12, 12);
  expect(lengthStats([])).toEqual({ mean: 0, median: 0, p90: 0, max: 0 });
  expect(lengthStats([3, 1, 2])).toEqual({ mean: 2, median: 2, p90: 3, max: 3 });
});

test('no best-of-n without a score on every sample; a problem nobody answered is a wrong majority', () => {
  const unscored = samples.map((s) => ({ ...s, score: undefined }));
  expect(benchmarkMetrics(unscored).bestOfN).toBeNull();
  const silent = [sample('X', false, null, 3), sample('X', false, null, 3)];
  expect(benchmarkMetrics(silent, [1, 2])).toMatchObject({ avgAtN: 0, majAtN: 0, passAtK: { '1': 0, '2': 0 }, noAnswerRate: 1 });
});

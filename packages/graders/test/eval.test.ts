import path from 'node:path';
import fc from 'fast-check';
import { accuracyReport, bestOfN, loadGsm8k, loadMath500, majorityVote, MathGrader, meanPassAtK, passAtK } from '@lathe/graders';

const FIXTURES = path.join(__dirname, 'fixtures');

describe('pass@k', () => {
  test('known values', () => {
    expect(passAtK(10, 0, 1)).toBe(0);
    expect(passAtK(10, 10, 5)).toBe(1);
    expect(passAtK(10, 3, 1)).toBeCloseTo(0.3, 12);
    // 1 − C(2,2)/C(4,2) = 1 − 1/6
    expect(passAtK(4, 2, 2)).toBeCloseTo(5 / 6, 12);
    expect(passAtK(5, 1, 5)).toBe(1);
  });
  test('equals the exact combinatorial formula', () => {
    const choose = (n: number, k: number): number => (k < 0 || k > n ? 0 : k === 0 ? 1 : (choose(n - 1, k - 1) * n) / k);
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 40 }), fc.nat(), fc.nat(), (n, cRaw, kRaw) => {
        const c = cRaw % (n + 1);
        const k = 1 + (kRaw % n);
        expect(passAtK(n, c, k)).toBeCloseTo(1 - choose(n - c, k) / choose(n, k), 9);
      }),
      { seed: 20261124 }, // the same cases every CI run
    );
  });
  test('bad arguments name themselves', () => expect(() => passAtK(3, 4, 1)).toThrow(/n=3, c=4, k=1/));
  test('mean over problems', () => expect(meanPassAtK([[true, false], [false, false]], 1)).toBeCloseTo(0.25, 12));
});

describe('best-of-n and majority vote', () => {
  test('best-of-n takes the highest score, the first of ties', () => {
    expect(bestOfN([{ score: 0.1, correct: true }, { score: 0.9, correct: false }])).toBe(false);
    expect(bestOfN([{ score: 0.5, correct: true }, { score: 0.5, correct: false }])).toBe(true);
    expect(bestOfN([])).toBe(false);
  });
  test('majority vote groups equivalent spellings and ignores missing answers', () => {
    expect(majorityVote(['\\frac{1}{2}', '0.5', '3', null, '1/2', '3'])).toEqual({ answer: '\\frac{1}{2}', votes: 3 });
    expect(majorityVote(['x = 4', '4', '5'])).toEqual({ answer: 'x = 4', votes: 2 });
    expect(majorityVote([null, ''])).toBeNull();
  });
});

describe('accuracy over MATH-500 and GSM8K slices', () => {
  test('MATH-500 rows graded against themselves: full accuracy, per subject and level', async () => {
    const rows = loadMath500(path.join(FIXTURES, 'math500-head8.jsonl'));
    expect(rows).toHaveLength(8);
    const grader = new MathGrader();
    const graded = await Promise.all(rows.map(async (r, i) => ({ ...r, correct: (await grader.grade(i === 1 ? '\\boxed{q - p}' : `so \\boxed{${r.answer}}`, r.answer)).correct })));
    await grader.close();
    const report = accuracyReport(graded);
    expect(report.overall).toEqual({ correct: 7, total: 8, accuracy: 7 / 8 });
    expect(report.bySubject['Intermediate Algebra']).toEqual({ correct: 0, total: 1, accuracy: 0 });
    expect(report.bySubject['Number Theory']).toEqual({ correct: 2, total: 2, accuracy: 1 });
    expect(report.byLevel['2'].total).toBe(3);
  });
  test('GSM8K answers come from the #### line with separators removed', () => {
    const rows = loadGsm8k(path.join(FIXTURES, 'gsm8k-test-head5.jsonl'));
    expect(rows.map((r) => r.answer)).toEqual(['18', '3', '70000', '540', '20']);
    expect(accuracyReport(rows.map((r) => ({ correct: r.answer === '18' }))).overall.accuracy).toBeCloseTo(0.2, 12);
  });
  test('a malformed file names the file and line', () => {
    expect(() => loadGsm8k(path.join(FIXTURES, 'README.md'))).toThrow(/README\.md:1: not valid JSON/);
  });
});

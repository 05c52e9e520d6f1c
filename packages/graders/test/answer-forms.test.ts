/**
 * The five answer forms graded by their own rules (docs/graders.md, "Answer forms"): rounded
 * decimals against exact values (`roundedTolerance: 'digits'`), scientific notation of different
 * mantissa precision, sets written with set operations, choice letters with an explanation, and
 * equations equal up to reordered factors and the names of arbitrary constants. Each case is
 * written from the rule: [gold, prediction (boxed unless it is a whole response), verdict].
 */
import { PassThrough } from 'node:stream';
import { gradeJsonl, MathGrader, parseNumber, resolveGradeOptions } from '@lathe/graders';
import { withinShownDigits } from '../src/math/numbers';
import { canonical, realSet, realSetsEqual } from '../src/math/sets';
import { predictedChoice } from '../src/math/choice';
import { withGoldConstants } from '../src/math/equivalence';

const digits = new MathGrader({ roundedTolerance: 'digits' });
const fixed = new MathGrader();
afterAll(async () => {
  await digits.close();
  await fixed.close();
});

const boxed = (s: string) => (s.includes('\\boxed') || /[a-z]{4,}/.test(s.replace(/\\[a-zA-Z]+/g, '')) ? s : `\\boxed{${s}}`);

describe('a rounded decimal against an exact fraction or closed form (digits rule)', () => {
  test.each([
    ['\\frac{1}{3}', '0.333', true],
    ['\\frac{1}{3}', '0.33', true], // two significant digits are enough
    ['\\frac{1}{3}', '0.3', false], // one is not: the fixed rule decides
    ['\\frac{2}{3}', '0.67', true], // rounded
    ['\\frac{2}{3}', '0.66', false], // truncated: |0.666… − 0.66| > 0.005
    ['\\sqrt{2}', '1.414', true],
    ['\\sqrt{2}', '1.415', false],
    ['\\pi', '3.14', true],
    ['\\pi', '3.15', false],
    ['2', '2.4', false],
    ['2', '2.0', true],
    ['\\frac{9\\sqrt{3}}{4}', '3.897', true], // 3.8971…
    ['0.333', '\\frac{1}{3}', true], // a rounded gold accepts the exact value
  ])('%s vs %s → %s', async (gold, pred, want) => {
    expect((await digits.grade(boxed(pred), gold)).correct).toBe(want);
  });

  test.each([
    ['\\left( 3, \\frac{\\pi}{2} \\right)', '(3, 1.5708)', true],
    ['\\left( 3, \\frac{\\pi}{2} \\right)', '(3, 1.58)', false],
    ['[\\frac{1}{3}, \\sqrt{2})', '[0.333, 1.414)', true],
    ['[\\frac{1}{3}, \\sqrt{2})', '(0.333, 1.414)', false], // the ends still matter
    ['\\begin{pmatrix} \\frac{1}{3} \\\\ -\\frac{2}{7} \\end{pmatrix}', '\\begin{pmatrix} 0.333 \\\\ -0.286 \\end{pmatrix}', true],
    ['\\begin{pmatrix} \\frac{1}{3} \\\\ -\\frac{2}{7} \\end{pmatrix}', '\\begin{pmatrix} 0.333 \\\\ -0.28 \\end{pmatrix}', false],
  ])('inside intervals, tuples and vectors: %s vs %s → %s', async (gold, pred, want) => {
    expect((await digits.grade(boxed(pred), gold)).correct).toBe(want);
  });

  test('the fixed rule (the library default) keeps comparing at 6 decimal places', async () => {
    expect((await fixed.grade('\\boxed{0.333}', '\\frac{1}{3}')).correct).toBe(false);
    expect((await fixed.grade('\\boxed{0.333333}', '\\frac{1}{3}')).correct).toBe(true);
  });

  test('lathe grade --rounded_tolerance digits|fixed', async () => {
    const verdicts = async (rounded: string) => {
      const input = new PassThrough();
      const output = new PassThrough();
      let text = '';
      output.on('data', (d: Buffer) => (text += d.toString()));
      input.end(['{"pred": "\\\\boxed{1.414}", "gold": "\\\\sqrt{2}"}', '{"pred": "\\\\boxed{0.66}", "gold": "\\\\frac{2}{3}"}'].join('\n') + '\n');
      await gradeJsonl(input, output, resolveGradeOptions({ rounded_tolerance: rounded, cas_workers: 1 }), 'test');
      return text.trim().split('\n').map((l) => (JSON.parse(l) as { correct: boolean }).correct);
    };
    expect(await verdicts('digits')).toEqual([true, false]);
    expect(await verdicts('fixed')).toEqual([false, false]);
    expect(() => resolveGradeOptions({ rounded_tolerance: 'loose' })).toThrow(/--rounded_tolerance/);
  });

  test('withinShownDigits: half a unit of the last digit shown, at least two significant digits', () => {
    expect(parseNumber('0.0330')).toMatchObject({ unit: 0.0001, sigDigits: 3 });
    expect(parseNumber('4.48\\times 10^{33}')).toMatchObject({ value: 4.48e33, unit: 1e31, sigDigits: 3, scientific: true });
    expect(parseNumber('12')).toMatchObject({ isDecimal: false });
    expect(withinShownDigits(parseNumber('1.41')!, Math.SQRT2)).toBe(true); // |1.41421 − 1.41| = 0.0042 ≤ 0.005
    expect(withinShownDigits(parseNumber('1.42')!, Math.SQRT2)).toBe(false);
    expect(withinShownDigits(parseNumber('0.5')!, 0.54)).toBeNull(); // one significant digit
  });
});

describe('scientific notation with another mantissa precision', () => {
  test.each([
    ['4.5e33', '4.48 \\times 10^{33}', true], // the gold shows 2 digits: 4.48 rounds to 4.5
    ['6.626 \\times 10^{-34}', '6.63 \\times 10^{-34}', true],
    ['6.626 \\times 10^{-34}', '6.7 \\times 10^{-34}', false], // tiny magnitudes compare relatively, not to 6 places
    ['6.626 \\times 10^{-34}', '6.62 \\times 10^{-34}', false],
    ['2.998 \\times 10^{8}', '3.0 \\times 10^8', true],
    ['3 \\times 10^{8}', '2.998 \\times 10^8', false], // a one-digit mantissa tells too little: compared at 6 places, relatively
    ['7.5 \\times 10^{-7}', '7.50\\times10^{-7}', true],
    ['1.6', '1.57', false], // two plain decimals keep the fixed rule (MATH's exact decimals)
  ])('%s vs %s → %s', async (gold, pred, want) => {
    expect((await digits.grade(boxed(pred), gold)).correct).toBe(want);
  });

  test('at any magnitude the fixed rule now compares scientific notation relatively', async () => {
    expect((await fixed.grade('\\boxed{6.7 \\times 10^{-34}}', '6.626 \\times 10^{-34}')).correct).toBe(false);
    expect((await fixed.grade('\\boxed{6.626 \\times 10^{-34}}', '6.626 \\times 10^{-34}')).correct).toBe(true);
  });

  test("OlympiadBench's per-problem relative tolerance is a per-call option", async () => {
    expect((await digits.grade('\\boxed{4.4}', '4.2')).correct).toBe(false);
    expect((await digits.grade('\\boxed{4.4}', '4.2', 'auto', { relTol: 0.1 })).correct).toBe(true);
    expect((await digits.grade('\\boxed{4.7}', '4.2', 'auto', { relTol: 0.1 })).correct).toBe(false);
  });
});

describe('a set written with set operations in the gold', () => {
  test.each([
    ['\\{1\\} \\cup \\{2, 3\\}', '\\{1, 2, 3\\}', true],
    ['\\{1,2\\}\\cup\\{3\\}', '3, 2, 1', true],
    ['\\{1,2\\}\\cup\\{3\\}', '\\{1, 2\\}', false],
    ['(-\\infty, 0) \\cup (0, \\infty)', '\\mathbb{R} \\setminus \\{0\\}', true],
    ['\\mathbb{R} \\setminus \\{0\\}', '(-\\infty,0)\\cup(0,\\infty)', true],
    ['\\mathbb{R} \\setminus \\{0\\}', '(-\\infty,0]\\cup(0,\\infty)', false],
    ['[1,2] \\cup [2,3]', '[1,3]', true],
    ['[1,2) \\cup (2,3]', '[1,3]', false], // 2 is left out
    ['[0, 5] \\setminus (1, 2)', '[0,1] \\cup [2,5]', true],
    ['[0, 5] \\cap [3, 8]', '[3, 5]', true],
    ['(-\\infty, 1) \\cup (1, 2) \\cup (2, \\infty)', '(-\\infty,1)\\cup(1,\\infty)', false],
    ['\\{-1\\} \\cup [2, 5)', '[2,5) \\cup \\{-1\\}', true],
    ['(-\\infty, \\frac{1}{2}) \\cup (\\frac{1}{2}, \\infty)', '\\mathbb{R} \\setminus \\{0.5\\}', true],
  ])('%s vs %s → %s', async (gold, pred, want) => {
    expect((await fixed.grade(boxed(pred), gold)).correct).toBe(want);
  });

  test('canonical form: sorted, merged, points absorbed', () => {
    expect(canonical([{ lo: 2, hi: 5, loClosed: false, hiClosed: false }, { lo: 2, hi: 2, loClosed: true, hiClosed: true }, { lo: -1, hi: 0, loClosed: true, hiClosed: true }])).toEqual([
      { lo: -1, hi: 0, loClosed: true, hiClosed: true },
      { lo: 2, hi: 5, loClosed: true, hiClosed: false },
    ]);
    expect(realSet('\\R\\setminus\\{0\\}')).toEqual([{ lo: -Infinity, hi: 0, loClosed: false, hiClosed: false }, { lo: 0, hi: Infinity, loClosed: false, hiClosed: false }]);
    expect(realSet('x+1')).toBeNull();
    expect(realSetsEqual(realSet('[1,2]\\cup[2,3]')!, realSet('[1,3]')!)).toBe(true);
  });
});

describe('a choice letter followed by an explanation or inside a sentence', () => {
  test.each([
    ['C', '(C) because the slope is 2', true],
    ['C', 'The answer is (C) 12.', true],
    ['\\text{(C)}', '\\boxed{C. 12}', true],
    ['B', '\\boxed{B) 7}', true],
    ['B', '\\boxed{\\text{(B) } 7}', true],
    ['A', 'I think the answer is A since the others fail.', true],
    ['C', '\\boxed{B}', false],
    ['C', 'The answer is (B) 12.', false],
    ['D', '\\boxed{Dog}', false], // a word that starts with the letter is no letter
  ])('%s vs %s → %s', async (gold, pred, want) => {
    expect((await fixed.grade(pred, gold)).correct).toBe(want);
  });

  test('predictedChoice: the leading letter of the answer, else the last (X) of the response', () => {
    expect(predictedChoice('C. 12', '')).toBe('C');
    expect(predictedChoice('2', 'Options (A) and (B) fail, so (D) holds and the value is 2')).toBe('D');
    expect(predictedChoice('Aha', 'no letters here')).toBeNull();
  });
});

describe('an equation equal up to reordered factors and constants', () => {
  test.each([
    ['(x-1)(x+2)=0', '(x+2)(x-1)=0', true],
    ['y = -\\frac{1}{2}x + 3', 'y = 3 - \\frac{x}{2}', true],
    ['2x + 4y = 8', 'x + 2y = 4', true], // both sides scaled by a constant
    ['y=2(x+1)', '2x+2=y', true],
    ['x^2+y^2=4', 'y^2 + x^2 - 4 = 0', true],
    ['3x-2y=5', '2y-3x=5', false],
    ['y = C e^{-2t}', 'y = c e^{-2t}', true], // the arbitrary constant's name
    ['x(t) = C_1 e^{t} + 2', 'x(t) = 2 + Ae^{t}', true],
    ['x = \\frac{1}{2}\\sin t + Ce^{-t}', 'x=Ce^{-t}+\\frac{\\sin t}{2}', true],
    ['y = C e^{-2t}', 'y = c e^{-3t}', false],
    ['y = C e^{-2t}', 'y = x e^{-2t}', false], // x is no constant's name
  ])('%s vs %s → %s', async (gold, pred, want) => {
    expect((await fixed.grade(boxed(pred), gold)).correct).toBe(want);
  });

  test('withGoldConstants renames only constants, only when a variable is shared, never inside commands', () => {
    expect(withGoldConstants('Ce^{-2t}', 'ce^{-2t}')).toBe('Ce^{-2t}');
    expect(withGoldConstants('C_{1}\\cos t+C_{2}\\sin t', 'A\\cos t+B\\sin t')).toBe('C_{1}\\cos t+C_{2}\\sin t');
    expect(withGoldConstants('k', 'c')).toBeNull(); // a bare answer is never renamed
    expect(withGoldConstants('Cx', 'Cx')).toBeNull();
  });
});

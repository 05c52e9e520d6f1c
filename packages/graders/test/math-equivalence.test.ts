import fc from 'fast-check';
import { closeTruncatedBox, MathGrader, normalizeAnswer, numbersClose, parseNumber } from '@lathe/graders';

// Cases written from the definitions: [prediction, gold, expected verdict].
const NUMERIC: [string, string, boolean][] = [
  ['5', '5', true],
  ['-5', '-5', true],
  ['5', '-5', false],
  ['0.5', '\\frac{1}{2}', true],
  ['1/2', '\\frac12', true],
  ['-\\frac{10}{9}', '-10/9', true],
  ['0.333333', '\\frac{1}{3}', true], // rounded to 6 places, as Math-Verify's float_rounding=6
  ['0.333', '\\frac{1}{3}', false],
  ['1000.0', '1000', true],
  ['1,000', '1000', true],
  ['1e3', '1000', true],
  ['2.5\\times10^{3}', '2500', true],
  ['2\\frac{1}{2}', '2.5', true],
  ['28\\%', '28', true],
  ['28\\%', '0.28', true],
  ['28\\%', '2.8', false],
  ['100', '99.9999', false],
  ['3', '4', false],
  ['10^{100}', '10^{100}', true],
];

const STRUCTURES: [string, string, boolean][] = [
  ['\\{1, 2, 3\\}', '\\{3, 2, 1\\}', true], // sets are unordered
  ['\\{1, 2\\}', '\\{1, 2, 3\\}', false],
  ['1, 2, 3', '3, 1, 2', true], // bare lists unordered by default (Math-Verify)
  ['1, 2', '1, 2, 2', true], // repeats collapse, as in Math-Verify's sets
  ['1, 2', '1, 2, 3', false],
  ['1, 2, 3', '1, 2', false],
  ['(1, 2)', '(2, 1)', false], // tuples are ordered
  ['(1, 2)', '(1, 2)', true],
  ['[0, 1)', '[0, 1)', true],
  ['(0, 1]', '[0, 1)', false], // interval ends matter
  ['[0, 1)', '(0, 1)', false],
  ['(-\\infty, 2) \\cup (3, \\infty)', '(3, \\infty) \\cup (-\\infty, 2)', true],
  ['(-\\infty, 2) \\cup (3, \\infty)', '(-\\infty, 2]\\cup(3,\\infty)', false],
  ['\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}', '\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}', true],
  ['\\begin{pmatrix} 1 & 2 \\\\ 3 & 5 \\end{pmatrix}', '\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}', false],
  ['\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}', '\\begin{pmatrix}1&2\\end{pmatrix}', false],
  ['x = 2', '2', true],
  ['2', 'x = 2', true],
  ['x = 3', '2', false],
  ['x \\ge 5', 'x \\geq 5', true],
  ['5 \\le x', 'x \\ge 5', true],
  ['x > 5', 'x < 5', false],
  ['\\text{Evelyn}', 'Evelyn', true],
  ['evelyn', 'Evelyn', true],
  ['Evelyn', 'Briana', false],
  ['(B)', 'B', true],
  ['90^\\circ', '90', true],
  ['125 miles', '125', true],
  ['\\$18.90', '18.90', true],
  ['[45]', '45', true], // one item in brackets is grouping, not an interval
  ['(5)', '5', true],
  ['[\\sqrt{4}] = [2]', '2', true], // a chain is read at its last side, brackets and all
  ['[0, 1]', '0, 1', false], // an interval is not a list of two answers
  ['[0, 1)', '[0, 1]', false],
  // a ≤ |x| ≤ b describes two intervals, mirrored about 0
  ['[-\\frac{3}{2}, -1] \\cup [1, \\frac{3}{2}]', '1 \\le |z| \\le \\frac{3}{2}', true],
  ['(-2, -1] \\cup [1, 2)', '1 \\le |x| < 2', true],
  ['[-2, -1] \\cup [1, 2]', '1 < |x| \\le 2', false],
  ['(-3, 0) \\cup (0, 3)', '0 < |x| < 3', true],
  ['[-3, 3]', '0 \\le |x| \\le 3', true],
  ['[1, 2]', '1 \\le |x| \\le 2', false],
  // a gold inequality accepts its interval; an inequality does not answer a gold interval (Math-Verify's default)
  ['[-2, 7]', '-2 \\le x \\le 7', true],
  ['(0, 1)', '0 < f(x) < 1', true],
  ['-2 \\le x \\le 7', '[-2, 7]', false],
  ['0 < x < 1', '(0, 1)', false],
];

const SYMBOLIC: [string, string, boolean][] = [
  ['\\sqrt{8}', '2\\sqrt{2}', true],
  ['\\frac{\\sqrt{3}}{3}', '\\frac{1}{\\sqrt{3}}', true],
  ['(x+1)^2', 'x^2+2x+1', true],
  ['x^2+2x+2', '(x+1)^2', false],
  ['\\frac{\\pi}{2}', '\\pi/2', true],
  ['\\frac{9}{4}\\pi', '\\frac{9\\pi}{4}', true],
  ['2\\sin b\\cos a', '2 \\cos a \\sin b', true],
  ['\\sqrt{2}+\\sqrt{5}', '\\sqrt{5}+\\sqrt{2}', true],
  ['\\sqrt{2}+\\sqrt{5}', '\\sqrt{7}', false],
  ['1.5708', '\\frac{\\pi}{2}', false],
  ['y = -\\frac{1}{2}x + \\frac{3}{4}', '2x + 4y - 3 = 0', true],
  ['-x > -1', 'x < 1', true],
  ['x > -1', 'x < 1', false],
  ['1 \\pm \\sqrt{19}', '1 \\pm \\sqrt{19}', true],
  ['x + 1', '2', false], // an expression that varies never equals a constant
  ['2', '\\sin x', false],
  ['e^{i\\pi}', '-1', true], // e and i are constants
  ['2i', '\\sqrt{-4}', true],
  ['x^5-x^4+x^3-x^2+x-1', '70\\sqrt{2}', false], // takes two values at two points: not a constant
  ['\\frac 59', '\\sqrt{0.3}', false], // two constants of different value
  ['\\frac 59', '\\frac{10}{18}', true],
  ['x - x + 2', '2', true], // variables that cancel: the CAS decides
  ['\\sin^2 x + \\cos^2 x', '1', true],
  ['\\det\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}', '-2', true], // environment names are not variables
  ['\\{1-\\sqrt{5}, 1+\\sqrt{5}, -2\\}', '\\{1\\pm\\sqrt{5},-2\\}', false], // ± inside a set is not expanded
  ['(3, \\frac{\\pi}{2})', '\\left( 3, \\frac{\\pi}{2} \\right)', true],
  ['\\left(\\frac{1}{2}, \\sqrt{3}\\right)', '(0.5, \\sqrt{3})', true],
];

describe('math equivalence without the CAS', () => {
  const grader = new MathGrader({ symbolic: false });
  test.each([...NUMERIC, ...STRUCTURES])('%j vs gold %j → %s', async (pred, gold, expected) => {
    expect((await grader.grade(pred, gold, 'raw')).correct).toBe(expected);
  });
});

describe('options', () => {
  test('setRelation accepts an inequality for a gold interval', async () => {
    const grader = new MathGrader({ symbolic: false, setRelation: true });
    expect((await grader.grade('-2 \\le x \\le 7', '[-2, 7]', 'raw')).correct).toBe(true);
    expect((await grader.grade('-2 < x \\le 7', '[-2, 7]', 'raw')).correct).toBe(false);
  });
});

describe('gold answers cut short', () => {
  const grader = new MathGrader({ symbolic: false });
  test('a gold whose box is never closed is read to its end', async () => {
    expect(closeTruncatedBox('\\boxed{\\frac{1}{2}')).toBe('\\boxed{\\frac{1}{2}}');
    expect((await grader.grade('1, -1', '\\boxed{W(n) = 1 \\text{ and } W(n) = -1')).correct).toBe(true);
  });
  test('a prediction cut inside its box earns nothing', async () => {
    expect((await grader.grade('so the answer is \\boxed{12', '12')).correct).toBe(false);
  });
  test('a closed or box-free text is left alone', () => {
    expect(closeTruncatedBox('\\boxed{1} and {2')).toBe('\\boxed{1} and {2}');
    expect(closeTruncatedBox('{x')).toBe('{x');
  });
});

describe('math equivalence with the CAS', () => {
  const grader = new MathGrader();
  afterAll(() => grader.close());
  test.each(SYMBOLIC)('%j vs gold %j → %s', async (pred, gold, expected) => {
    expect((await grader.grade(pred, gold, 'raw')).correct).toBe(expected);
  });

  test('a gold answer the CAS cannot parse scores 0 and says so', async () => {
    const v = await grader.grade('\\frac{1}{2}', '\\frac{1}{', 'raw');
    expect(v).toMatchObject({ correct: false, reason: 'unparseable-gold' });
  });
  test('an empty gold scores 0 even against an empty-looking prediction', async () => {
    const v = await grader.grade('\\boxed{}', '\\boxed{}', 'auto');
    expect(v.correct).toBe(false);
    expect(v.reason).toBe('unparseable-gold');
  });
  test('a response without a final answer earns nothing from its intermediate values', async () => {
    const v = await grader.grade('We have 2 + 3 = 5, then we still have to check the other case, which needs a different argument that we have not written down yet at all', '5');
    expect(v).toMatchObject({ correct: false, extracted: null, reason: 'no-answer' });
  });
  test('a pathological input returns within the time bound', async () => {
    const slow = new MathGrader({ casTimeoutMs: 300 });
    const t0 = Date.now();
    const v = await slow.grade(`${'('.repeat(3000)}x${')'.repeat(3000)}^{${'9^'.repeat(200)}9}`, 'x+1', 'raw');
    expect(v.correct).toBe(false);
    expect(Date.now() - t0).toBeLessThan(5000);
    await slow.close();
  });
});

describe('pathological inputs return quickly', () => {
  const grader = new MathGrader({ casTimeoutMs: 300, gradeTimeoutMs: 300 });
  afterAll(() => grader.close());
  test.each([
    ['nested braces', '{'.repeat(50000)],
    ['many boxes', '\\boxed{'.repeat(20000)],
    ['many dollars', '$'.repeat(50000)],
    ['a long list', Array.from({ length: 3000 }, (_, i) => `x_${i}`).join(', ')],
    ['deep parentheses', `${'('.repeat(20000)}1${')'.repeat(20000)}`],
    ['many fractions', '\\frac{'.repeat(10000)],
    ['a long list of expressions', Array.from({ length: 200 }, (_, i) => `\\sqrt{${i}}+x`).join(', ')],
  ])('%s', async (_name, text) => {
    const t0 = performance.now();
    await grader.grade(text, '5');
    await grader.grade(text, text.split('').reverse().join(''), 'raw');
    expect(performance.now() - t0).toBeLessThan(4000);
  });
});

describe('properties', () => {
  // Seeded: CI sees the same 300 cases every run (an unseeded run once drew 2147483636 vs
  // 2147483637, which a relative tolerance called equal; that case is pinned below).
  const SEED = 20261124;
  const grader = new MathGrader({ symbolic: false });
  const answer = fc.oneof(
    fc.integer({ min: -1e6, max: 1e6 }).map(String),
    fc.tuple(fc.integer({ min: -99, max: 99 }), fc.integer({ min: 1, max: 99 })).map(([a, b]) => `\\frac{${a}}{${b}}`),
    fc.double({ min: -1e4, max: 1e4, noNaN: true }).map((x) => x.toFixed(3)),
    fc.stringMatching(/^[a-z]{1,6}$/),
    fc.array(fc.integer({ min: 0, max: 50 }), { minLength: 1, maxLength: 4 }).map((xs) => `(${xs.join(', ')})`),
  );
  test('any answer matches itself, before and after normalisation', async () => {
    await fc.assert(
      fc.asyncProperty(answer, async (a) => {
        expect((await grader.grade(a, a, 'raw')).correct).toBe(true);
        expect((await grader.grade(normalizeAnswer(a), a, 'raw')).correct).toBe(true);
      }),
      { numRuns: 300, seed: SEED },
    );
  });
  test('neighbouring large integers never match; integers written as decimals still round', async () => {
    for (const [a, b] of [[2147483636, 2147483637], [999999999, 1000000000], [-123456789012, -123456789013]]) {
      expect([a, b, (await grader.grade(String(a), String(b), 'raw')).correct]).toEqual([a, b, false]);
    }
    expect((await grader.grade('2147483636', '2147483636', 'raw')).correct).toBe(true);
    expect((await grader.grade('2.0000001', '2', 'raw')).correct).toBe(true); // decimal: rounded to 6 places
    expect(numbersClose(1e6, 1e6 + 1, false, { floatRounding: 6, relTol: 1e-9 })).toBe(false);
    expect(numbersClose(1 / 3, 0.33333333333333337, false, { floatRounding: 6, relTol: 1e-9 })).toBe(true); // fractions keep the tolerance
  });
  test('distinct integers never match', async () => {
    await fc.assert(
      fc.asyncProperty(fc.integer(), fc.integer(), async (a, b) => {
        fc.pre(a !== b);
        expect((await grader.grade(String(a), String(b), 'raw')).correct).toBe(false);
      }),
      { numRuns: 300, seed: SEED },
    );
  });
  test('distinct fractions never match, equal ones always do', async () => {
    const frac = fc.tuple(fc.integer({ min: -999, max: 999 }), fc.integer({ min: 1, max: 999 }));
    await fc.assert(
      fc.asyncProperty(frac, frac, fc.integer({ min: 1, max: 50 }), async ([a, b], [c, d], k) => {
        const equal = a * d === c * b;
        expect((await grader.grade(`\\frac{${a}}{${b}}`, `${c}/${d}`, 'raw')).correct).toBe(equal);
        // the same value written unreduced
        expect((await grader.grade(`\\frac{${a * k}}{${b * k}}`, `\\frac{${a}}{${b}}`, 'raw')).correct).toBe(true);
      }),
      { numRuns: 300, seed: SEED },
    );
  });
  test('distinct decimals that differ in the first 6 places never match', () => {
    fc.assert(
      fc.property(fc.double({ min: -1e5, max: 1e5, noNaN: true }), fc.double({ min: 1e-5, max: 10, noNaN: true }), (a, d) => {
        const x = parseNumber(a.toFixed(4))!;
        const y = parseNumber((a + d).toFixed(4))!;
        fc.pre(x.value !== y.value);
        expect(numbersClose(x.value, y.value, true, { floatRounding: 6, relTol: 1e-9 })).toBe(false);
      }),
      { numRuns: 300, seed: SEED },
    );
  });
});

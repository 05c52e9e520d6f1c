import { ComputeEngine } from '@cortex-js/compute-engine';
import fc from 'fast-check';
import { evaluateAt, evaluateConstant, takesTwoValues } from '@lathe/graders';

describe('evaluateConstant', () => {
  test.each([
    ['\\frac{3\\sqrt{3}}{4}', (3 * Math.sqrt(3)) / 4],
    ['-\\frac{\\pi}{6}', -Math.PI / 6],
    ['2^{10}', 1024],
    ['\\sqrt[3]{27}', 3],
    ['2(1+\\sqrt{2})', 2 * (1 + Math.SQRT2)],
    ['1+2\\cdot 3', 7],
    ['(1+2)^2', 9],
    ['-2^{2}', -4],
    ['70\\sqrt{2}', 70 * Math.SQRT2],
    ['\\frac{1}{2}\\times 4-1', 1],
  ])('%j = %d', (latex, value) => expect(evaluateConstant(latex)).toBeCloseTo(value, 12));

  test.each([
    ['x+1'], // a variable
    ['3\\frac{1}{2}'], // a mixed number, or 3 times a half: left to the CAS
    ['1/2\\pi'], // 1/(2π) or π/2
    ['2^10'], // LaTeX reads 2^1 then 0
    ['6+9i'],
    ['e^{2}'],
    ['\\sqrt{-4}'],
    ['\\infty'],
    ['52_8'],
    ['50%'],
    ['(3,4]'],
    ['\\frac{1}{0}'],
    ['\\sin 1'],
  ])('%j is not read', (latex) => expect(evaluateConstant(latex)).toBeNull());

  test('agrees with the CAS on random constant expressions', () => {
    // the CAS reports some internal canonicalisation notes on console.error; they are not failures
    const quiet = jest.spyOn(console, 'error').mockImplementation(() => undefined);
    const ce = new ComputeEngine();
    type Tree = { latex: string; compound: boolean };
    const wrap = (t: Tree) => (t.compound ? `(${t.latex})` : t.latex);
    const leaf = fc.oneof(fc.integer({ min: 1, max: 20 }).map((n) => ({ latex: String(n), compound: false })), fc.constant({ latex: '\\pi', compound: false }));
    const tree = fc.letrec<{ t: Tree }>((tie) => ({
      t: fc.oneof(
        { depthSize: 'small', withCrossShrink: true },
        leaf,
        fc.tuple(tie('t'), tie('t')).map(([a, b]) => ({ latex: `${a.latex}+${b.latex}`, compound: true })),
        fc.tuple(tie('t'), tie('t')).map(([a, b]) => ({ latex: `${a.latex}-${wrap(b)}`, compound: true })),
        fc.tuple(tie('t'), tie('t')).map(([a, b]) => ({ latex: `${wrap(a)}\\cdot ${wrap(b)}`, compound: true })),
        fc.tuple(tie('t'), tie('t')).map(([a, b]) => ({ latex: `\\frac{${a.latex}}{${b.latex}}`, compound: false })),
        tie('t').map((a) => ({ latex: `\\sqrt{${a.latex}}`, compound: false })),
        fc.tuple(tie('t'), fc.integer({ min: 1, max: 3 })).map(([a, k]) => ({ latex: `${wrap(a)}^{${k}}`, compound: false })),
        fc.tuple(fc.integer({ min: 2, max: 9 }), tie('t')).map(([n, a]) => ({ latex: `${n}\\sqrt{${a.latex}}`, compound: false })),
      ),
    })).t;
    fc.assert(
      fc.property(tree, (t) => {
        const mine = evaluateConstant(t.latex);
        const cas = ce.parse(t.latex).N();
        if (mine === null) return;
        expect(Number.isFinite(cas.re)).toBe(true);
        expect(Math.abs(mine - cas.re)).toBeLessThanOrEqual(1e-9 * Math.max(1, Math.abs(mine)));
      }),
      { numRuns: 400, seed: 20261124 }, // the same cases every CI run
    );
    quiet.mockRestore();
  });
});

describe('variables', () => {
  test('one-letter variables take the values given; e and i never do', () => {
    expect(evaluateAt('x^2+2x+1', { x: 2 })).toBe(9);
    expect(evaluateAt('3xy', { x: 2, y: 5 })).toBe(30);
    expect(evaluateAt('x+1', {})).toBeNull();
    expect(evaluateAt('e^{2}', { e: 1 })).toBeNull();
  });
  test('an answer that takes two values at two points is not a constant', () => {
    expect(takesTwoValues('x^5-x^4+x^3-x^2+x-1')).toBe(true);
    expect(takesTwoValues('6r^2-4r-24')).toBe(true);
    expect(takesTwoValues('x-x+2')).toBe(false); // cancels
    expect(takesTwoValues('(x+1)^{2}-x^{2}-2x')).toBe(false);
    expect(takesTwoValues('\\sin x')).toBe(false); // not read: left to the CAS
    expect(takesTwoValues('12')).toBe(false);
  });
});

import { normalizeAnswer } from '@lathe/graders';

describe('normalizeAnswer', () => {
  test.each([
    ['$\\dfrac{1}{2}$', '\\frac{1}{2}'],
    ['\\tfrac12', '\\frac{1}{2}'],
    ['\\left( 3, \\frac{\\pi}{2} \\right)', '(3,\\frac{\\pi}{2})'],
    ['\\text{Evelyn}', 'Evelyn'],
    ['90^\\circ', '90'],
    ['90^{\\circ}', '90'],
    ['45°', '45'],
    ['1,000,000', '1000000'],
    ['7,425,000.5', '7425000.5'],
    ['x = 5', '5'],
    ['k=\\frac{1}{3}', '\\frac{1}{3}'],
    ['f(2) = 9', '9'],
    ['2x + 3 = 7', '2x+3=7'],
    ['5.', '5'],
    ['12;', '12'],
    ['\\$1,000.99', '1000.99'],
    ['125\\textnormal{ miles}', '125'],
    ['15\\mbox{ cm}^2', '15'],
    ['10 dollars', '10'],
    ['28\\%', '28%'],
    ['28 percent', '28%'],
    ['\\sqrt2', '\\sqrt{2}'],
    ['\\frac 59', '\\frac{5}{9}'],
    ['\\sqrt 2', '\\sqrt{2}'],
    ['.5', '0.5'],
    ['(B)', 'B'],
    ['x \\in [0, 1)', '[0,1)'],
    ['x \\geq 5', 'x≥5'],
    ['\\sin x', '\\sin x'],
    ['1\\,000', '1000'],
    ['\\boxed{4}', '4'],
    ['x=1/3\\approx0.33', '1/3'],
  ])('%j → %j', (input, expected) => expect(normalizeAnswer(input)).toBe(expected));

  test('units stay when stripUnits is off', () => {
    expect(normalizeAnswer('10 dollars', { stripUnits: false })).toBe('10dollars');
  });
  test('a variable is not mistaken for a unit', () => {
    expect(normalizeAnswer('2x')).toBe('2x');
    expect(normalizeAnswer('3\\sqrt{13}')).toBe('3\\sqrt{13}');
  });
});

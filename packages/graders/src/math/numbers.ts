/**
 * Plain numbers in normalised answers: integers, decimals, scientific notation, `a/b`,
 * `\frac{a}{b}`, mixed numbers and percentages, compared with a tolerance without any CAS.
 */

/** A number read from a normalised answer. */
export interface ParsedNumber {
  /** The value, with a percentage already divided by 100. */
  value: number;
  /** The value as written before a percent sign was applied (`28%` → 28). */
  written: number;
  /** True when a decimal point or exponent appears (a rounded value, compared to `floatRounding` places). */
  isDecimal: boolean;
  /** True when the answer carried a percent sign. */
  percent: boolean;
  /** For decimals: the place value of the last digit shown (`1.414` → 0.001, `4.48\times10^{33}` → 10^31), on the written scale. */
  unit?: number;
  /** For decimals: the significant digits shown (`0.0330` → 3). */
  sigDigits?: number;
  /** Written in scientific notation (`4.5e33`, `4.5\times10^{33}`). */
  scientific?: boolean;
}

const DECIMAL = String.raw`[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?`;
const INTEGER = String.raw`[-+]?\d+`;
const PLAIN = new RegExp(`^(${DECIMAL})$`);
// normalisation keeps one space after a command before a digit: `\times 10^{33}`
const SCI_LATEX = new RegExp(String.raw`^(${DECIMAL})\\(?:times|cdot) ?10\^\{?([-+]?\d+)\}?$`);
const SLASH = new RegExp(`^(${INTEGER})/(\\d+)$`);
const FRAC = new RegExp(String.raw`^(-?)\\frac\{(${INTEGER})\}\{(${INTEGER})\}$`);
const MIXED = new RegExp(String.raw`^(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}$`);

/** Reads a normalised answer (no whitespace) as a number, or null when it is not a plain number. */
export function parseNumber(normalised: string): ParsedNumber | null {
  let s = normalised;
  const percent = s.endsWith('%');
  if (percent) s = s.slice(0, -1);
  let value: number | null = null;
  let isDecimal = false;
  let m: RegExpExecArray | null;
  let shown: Pick<ParsedNumber, 'unit' | 'sigDigits' | 'scientific'> = {};
  if ((m = PLAIN.exec(s))) {
    value = Number(m[1]);
    isDecimal = /[.eE]/.test(m[1]);
    if (isDecimal) {
      const [mantissa, exp] = m[1].split(/[eE]/);
      shown = { ...digitsShown(mantissa, Number(exp ?? 0)), scientific: exp !== undefined };
    }
  } else if ((m = SCI_LATEX.exec(s))) {
    value = Number(m[1]) * 10 ** Number(m[2]);
    isDecimal = true;
    shown = { ...digitsShown(m[1].split(/[eE]/)[0], Number(m[2]) + Number(m[1].split(/[eE]/)[1] ?? 0)), scientific: true };
  } else if ((m = SLASH.exec(s))) {
    value = Number(m[1]) / Number(m[2]);
  } else if ((m = FRAC.exec(s))) {
    value = (m[1] ? -1 : 1) * (Number(m[2]) / Number(m[3]));
  } else if ((m = MIXED.exec(s))) {
    value = (m[1] ? -1 : 1) * (Number(m[2]) + Number(m[3]) / Number(m[4]));
  }
  if (value === null || !Number.isFinite(value)) return null;
  return { value: percent ? value / 100 : value, written: value, isDecimal, percent, ...shown };
}

/** The place value of a mantissa's last digit (times 10^exp) and its significant digits: `0.0330` → 0.0001, 3. */
function digitsShown(mantissa: string, exp: number): { unit: number; sigDigits: number } {
  const digits = mantissa.replace(/^[-+]/, '');
  const decimals = digits.includes('.') ? digits.length - digits.indexOf('.') - 1 : 0;
  const significant = digits.replace('.', '').replace(/^0+/, '');
  return { unit: Number(`1e${exp - decimals}`), sigDigits: significant.length };
}

/** Tolerances for numeric comparison. */
export interface NumericTolerance {
  /** How a rounded decimal compares with an exact value or a more precise decimal (see `MathOptions.roundedTolerance`); default `fixed`. */
  roundedTolerance?: 'digits' | 'fixed';
  /** Decimal places both sides are rounded to when either side is written as a decimal (Math-Verify's float_rounding). */
  floatRounding: number;
  /** Relative tolerance for exact values (integers, fractions) that went through floating point. */
  relTol: number;
}

function roundTo(x: number, places: number): number {
  const f = 10 ** places;
  return Math.round(x * f) / f;
}

/**
 * True when two reals are equal: rounded to `floatRounding` places if `rounded`, else within
 * `relTol` — except two integers that floating point holds exactly, which are equal only when they
 * are (a relative tolerance of 1e-9 would call 2147483636 and 2147483637 equal).
 */
export function numbersClose(a: number, b: number, rounded: boolean, tol: NumericTolerance): boolean {
  if (a === b) return true;
  if (!rounded && Number.isSafeInteger(a) && Number.isSafeInteger(b)) return false;
  const scale = Math.max(Math.abs(a), Math.abs(b));
  if (Math.abs(a - b) <= tol.relTol * scale) return true;
  if (!rounded) return false;
  // relative comparison for large magnitudes, rounding for small ones
  if (scale >= 10 ** 6) return Math.abs(a - b) <= 10 ** -tol.floatRounding * scale;
  return Math.abs(roundTo(a, tol.floatRounding) - roundTo(b, tol.floatRounding)) < 0.5 * 10 ** -tol.floatRounding;
}

/** How percentages compare with plain numbers. */
export type PercentMode = 'either' | 'value' | 'strip';

/** Fewest significant digits a decimal must show for the `digits` rule to read it as a rounded value. */
const MIN_SIG_DIGITS = 2;

/**
 * The `digits` rule: a decimal that shows at least two significant digits stands for every value
 * that rounds to it, so `other` equals it when |other − value| ≤ half the place value of its last
 * digit (`1.414` for √2, `0.33` for 1/3; not `0.3`, not `0.66` for 2/3). Null when the decimal
 * shows too few digits to tell (the fixed rule decides).
 */
export function withinShownDigits(rounded: Pick<ParsedNumber, 'written' | 'unit' | 'sigDigits'>, other: number): boolean | null {
  if (rounded.unit === undefined || (rounded.sigDigits ?? 0) < MIN_SIG_DIGITS) return null;
  return Math.abs(other - rounded.written) <= 0.5 * rounded.unit * (1 + 1e-9);
}

/**
 * Which side the `digits` rule reads as rounded, comparing written values: the decimal when the
 * other is exact (an integer or a fraction), or, when both are decimals and either is in
 * scientific notation (OlympiadBench's relative-tolerance rule), the one that shows its last digit
 * at the larger place. Two plain decimals keep the fixed rule (MATH's exact decimals such as 2.25).
 */
function roundedSide(a: ParsedNumber, b: ParsedNumber): [ParsedNumber, ParsedNumber] | null {
  if (a.isDecimal !== b.isDecimal) return a.isDecimal ? [a, b] : [b, a];
  if (a.isDecimal && b.isDecimal && (a.scientific || b.scientific)) return (a.unit ?? 0) >= (b.unit ?? 0) ? [a, b] : [b, a];
  return null;
}

/** True when two parsed numbers are equal under the percent mode and tolerance. */
export function parsedNumbersEqual(a: ParsedNumber, b: ParsedNumber, percent: PercentMode, tol: NumericTolerance): boolean {
  const rounded = a.isDecimal || b.isDecimal;
  if (a.percent === b.percent) {
    // scientific notation compares relatively: at any magnitude, 6.63e-34 is not 6.7e-34
    const fixed = () => (a.scientific || b.scientific ? Math.abs(a.written - b.written) <= Math.max(tol.relTol, 10 ** -tol.floatRounding) * Math.max(Math.abs(a.written), Math.abs(b.written)) : numbersClose(a.written, b.written, rounded, tol));
    const sides = tol.roundedTolerance === 'digits' ? roundedSide(a, b) : null;
    const verdict = sides ? withinShownDigits(sides[0], sides[1].written) : null;
    return verdict === null ? fixed() : verdict || fixed();
  }
  // exactly one side has a percent sign
  if (percent === 'strip') return numbersClose(a.written, b.written, rounded, tol);
  if (percent === 'value') return numbersClose(a.value, b.value, rounded, tol);
  return numbersClose(a.written, b.written, rounded, tol) || numbersClose(a.value, b.value, rounded, tol);
}

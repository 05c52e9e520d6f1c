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
}

const DECIMAL = String.raw`[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?`;
const INTEGER = String.raw`[-+]?\d+`;
const PLAIN = new RegExp(`^(${DECIMAL})$`);
const SCI_LATEX = new RegExp(String.raw`^(${DECIMAL})\\times10\^\{?([-+]?\d+)\}?$`);
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
  if ((m = PLAIN.exec(s))) {
    value = Number(m[1]);
    isDecimal = /[.eE]/.test(m[1]);
  } else if ((m = SCI_LATEX.exec(s))) {
    value = Number(m[1]) * 10 ** Number(m[2]);
    isDecimal = true;
  } else if ((m = SLASH.exec(s))) {
    value = Number(m[1]) / Number(m[2]);
  } else if ((m = FRAC.exec(s))) {
    value = (m[1] ? -1 : 1) * (Number(m[2]) / Number(m[3]));
  } else if ((m = MIXED.exec(s))) {
    value = (m[1] ? -1 : 1) * (Number(m[2]) + Number(m[3]) / Number(m[4]));
  }
  if (value === null || !Number.isFinite(value)) return null;
  return { value: percent ? value / 100 : value, written: value, isDecimal, percent };
}

/** Tolerances for numeric comparison. */
export interface NumericTolerance {
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

/** True when two parsed numbers are equal under the percent mode and tolerance. */
export function parsedNumbersEqual(a: ParsedNumber, b: ParsedNumber, percent: PercentMode, tol: NumericTolerance): boolean {
  const rounded = a.isDecimal || b.isDecimal;
  if (a.percent === b.percent) return numbersClose(a.written, b.written, rounded, tol);
  // exactly one side has a percent sign
  if (percent === 'strip') return numbersClose(a.written, b.written, rounded, tol);
  if (percent === 'value') return numbersClose(a.value, b.value, rounded, tol);
  return numbersClose(a.written, b.written, rounded, tol) || numbersClose(a.value, b.value, rounded, tol);
}

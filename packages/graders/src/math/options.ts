/** Options of the math grader; defaults follow Math-Verify where public graders differ. */
import type { PercentMode } from './numbers';

/** How the math grader decides equivalence. Every field has a default in {@link MATH_DEFAULTS}. */
export interface MathOptions {
  /** `28%` vs `28` vs `0.28`: `either` accepts both readings, `value` only 0.28, `strip` only 28. */
  percent: PercentMode;
  /** Drop units (`\text{cm}`, `miles`, `cm^2`) and currency signs before comparing. */
  stripUnits: boolean;
  /** Bare comma lists (`1, 2, 3`) compare as multisets (`ignore`) or in order (`strict`). Sets are always unordered, tuples and intervals always ordered. */
  listOrder: 'ignore' | 'strict';
  /** Accept an inequality (`-2 ≤ x ≤ 7`) for a gold interval or set (`[-2, 7]`); off by default, as Math-Verify's `allow_set_relation_comp`. A gold inequality always accepts the interval it describes. */
  setRelation: boolean;
  /**
   * A rounded decimal against an exact value (`1.414` for `\sqrt{2}`, `0.33` for `\frac{1}{3}`), or
   * two decimals of different precision (`6.63\times10^{-34}` for `6.626\times10^{-34}`): `digits`
   * accepts it when the more precise value, rounded to the digits the less precise one shows,
   * equals it — given at least two significant digits shown (see docs/graders.md); `fixed` only
   * compares both at `floatRounding` places.
   */
  roundedTolerance: 'digits' | 'fixed';
  /** Decimal places both sides are rounded to when either is written as a decimal (Math-Verify float_rounding). */
  floatRounding: number;
  /** Relative tolerance for exact values and symbolic checks evaluated in floating point. */
  relTol: number;
  /** Use the computer-algebra system when strings and plain numbers do not decide. */
  symbolic: boolean;
  /** Wall-clock limit of one symbolic check in milliseconds (the check then counts as not equal). */
  casTimeoutMs: number;
  /** No symbolic check starts after this many milliseconds of one comparison (long lists of answers). */
  gradeTimeoutMs: number;
}

/** Defaults of {@link MathOptions}. */
export const MATH_DEFAULTS: MathOptions = {
  percent: 'either',
  stripUnits: true,
  listOrder: 'ignore',
  setRelation: false,
  roundedTolerance: 'fixed',
  floatRounding: 6,
  relTol: 1e-9,
  symbolic: true,
  casTimeoutMs: 800,
  gradeTimeoutMs: 1000,
};

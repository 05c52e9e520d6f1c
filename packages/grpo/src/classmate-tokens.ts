/**
 * From the classmate's text back to the policy's tokens: the classmate reads text (it may have
 * another tokenizer), so the part of a completion it was credited for is a character count, and
 * `classmate_partial` needs the policy tokens that produced those characters.
 */

/**
 * Per token of `tokens`, 1 when the token belongs to the first `chars` characters of the decoded
 * completion, 0 after: tokens 0 … m − 1 for the smallest m whose decoded prefix has at least
 * `chars` characters (a token straddling the boundary is credited). `chars` undefined: every token.
 * Binary search over prefixes (decoded prefix lengths grow with m), so O(log n) decodes.
 */
export function classmateTokenMask(tokens: readonly number[], chars: number | undefined, decode: (ids: number[]) => string): number[] {
  const n = tokens.length;
  if (chars === undefined) return new Array<number>(n).fill(1);
  if (!(Number.isInteger(chars) && chars >= 0)) throw new Error(`classmateTokenMask: chars must be an integer ≥ 0, got ${chars}`);
  let lo = 0;
  let hi = n;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (decode(tokens.slice(0, mid)).length >= chars) hi = mid;
    else lo = mid + 1;
  }
  return Array.from({ length: n }, (_, k) => (k < lo ? 1 : 0));
}

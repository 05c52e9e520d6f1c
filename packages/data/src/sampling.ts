/**
 * Filtering examples by token length. (A run's held-out split is `heldOutSplit` in @lathe/recipes;
 * seeded random numbers and shuffles are in @lathe/models.)
 */

/** A tokenizer as far as length filtering needs one. */
export type Encode = (text: string) => ArrayLike<number>;

/** What a length filter kept and dropped. */
export interface LengthFilterReport {
  total: number;
  kept: number;
  dropped: number;
  /** Longest item seen and the limit, in tokens. */
  maxTokens: number;
  limit: number;
}

/**
 * Keeps the items whose text (as `text(item)` returns it; several fields are summed) is at most
 * `maxTokens` tokens long under `encode`. Returns the kept items, the dropped ones and the counts.
 */
export function filterByTokenLength<T>(
  items: readonly T[],
  options: { encode: Encode; maxTokens: number; text: (item: T) => string | string[] },
): { kept: T[]; dropped: T[]; report: LengthFilterReport } {
  const kept: T[] = [];
  const dropped: T[] = [];
  let longest = 0;
  for (const item of items) {
    const t = options.text(item);
    const n = (Array.isArray(t) ? t : [t]).reduce((s, x) => s + options.encode(x).length, 0);
    longest = Math.max(longest, n);
    (n <= options.maxTokens ? kept : dropped).push(item);
  }
  return { kept, dropped, report: { total: items.length, kept: kept.length, dropped: dropped.length, maxTokens: longest, limit: options.maxTokens } };
}

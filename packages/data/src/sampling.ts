/**
 * Seeded shuffling, train/test splits and filtering by token length. Randomness comes from one
 * seeded generator (SplitMix32), so the same seed gives the same order on every machine.
 */

/** A seeded generator of uniform floats in [0, 1) (SplitMix32: 32-bit state, full period). */
export function seededRandom(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    z = (z ^ (z >>> 16)) >>> 0;
    return z / 4294967296;
  };
}

/** A shuffled copy of `items` (Fisher–Yates driven by {@link seededRandom}). */
export function seededShuffle<T>(items: readonly T[], seed: number): T[] {
  const out = items.slice();
  const rand = seededRandom(seed);
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    const t = out[i];
    out[i] = out[j];
    out[j] = t;
  }
  return out;
}

/** A train/test split: `test` is a count (≥ 1) or a fraction (< 1) of the items. */
export interface SplitOptions {
  test: number;
  seed: number;
  /** Shuffle before splitting (default true); false takes the last items as the test set. */
  shuffle?: boolean;
}

/** Splits items into disjoint train and test sets whose union is the input. */
export function trainTestSplit<T>(items: readonly T[], options: SplitOptions): { train: T[]; test: T[] } {
  const { test, seed } = options;
  if (!(test >= 0)) throw new Error(`split: test must be a count or a fraction ≥ 0, got ${test}`);
  const n = test < 1 ? Math.round(test * items.length) : test;
  if (!Number.isInteger(n)) throw new Error(`split: a test count must be an integer, got ${test}`);
  if (n > items.length) throw new Error(`split: test size ${n} exceeds the ${items.length} items`);
  const order = options.shuffle === false ? items.slice() : seededShuffle(items, seed);
  return { train: order.slice(0, order.length - n), test: order.slice(order.length - n) };
}

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

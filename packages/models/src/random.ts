/**
 * Lathe's one seeded random number generator (mulberry32: 32-bit state, fast, the same sequence on
 * every machine) and what is built on it: normal samples, shuffles and permutations. Random
 * weights, LoRA's initial adapters and data orders all draw from here, so a seed means one thing.
 */

/** Uniform numbers in [0, 1) from a seed (mulberry32). */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Standard normal samples from a seed (Box-Muller over two {@link seededRandom} uniforms per sample). */
export function seededNormal(seed: number): () => number {
  const uniform = seededRandom(seed);
  return () => Math.sqrt(-2 * Math.log(1 - uniform())) * Math.cos(2 * Math.PI * uniform());
}

/** A seeded Fisher-Yates permutation of 0..n−1. */
export function permutation(n: number, seed: number): number[] {
  return seededShuffle([...Array(n).keys()], seed);
}

/** A shuffled copy of `items` (Fisher-Yates driven by {@link seededRandom}); `permutation(n, s)` is `seededShuffle([0..n−1], s)`. */
export function seededShuffle<T>(items: readonly T[], seed: number): T[] {
  const r = seededRandom(seed);
  const out = items.slice();
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

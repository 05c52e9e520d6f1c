/**
 * Sampling noise, made on the host: uniform numbers that are a pure function of (seed, sample key,
 * step), so a generation is reproducible from its seed and each sample's key alone — independent of
 * batch composition and of how many runs a session has done. The graph receives them as a small
 * [rows, steps] input (256 KB for 64 rows × 1,024 tokens) and draws one token per row from each by
 * inverse-CDF sampling; generating them in the graph would need a good integer hash, and ONNX
 * Runtime's CUDA provider has no bitwise ops to build one from.
 */

/** A 32-bit integer finaliser with full avalanche (multiply / xor-shift rounds). */
export function hash32(x: number): number {
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  x ^= x >>> 16;
  return x >>> 0;
}

/** A uniform number in (0, 1) with 24 random bits (exactly representable in float32). */
export function uniformAt(seed: number, key: number, step: number): number {
  // Keys and seeds may exceed 2³²: fold their high words in so distinct values stay distinct.
  const fold = (v: number) => hash32((v >>> 0) ^ hash32(Math.floor(v / 4294967296) + 0x9e3779b9));
  const h = hash32(fold(seed) ^ hash32(fold(key) ^ hash32(step + 0x632be5ab)));
  return ((h >>> 8) + 0.5) / 16777216;
}

/** Noise for `keys.length` rows × `steps` steps, row-major float32 (the graph's `noise` input). */
export function uniformNoise(seed: number, keys: readonly number[], steps: number): Float32Array {
  const out = new Float32Array(keys.length * steps);
  keys.forEach((key, r) => {
    for (let t = 0; t < steps; t++) out[r * steps + t] = uniformAt(seed, key, t);
  });
  return out;
}

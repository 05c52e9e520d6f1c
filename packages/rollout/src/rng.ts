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

/** Keys and seeds may exceed 2³²: their high words are folded in, so distinct values stay distinct. */
const fold = (v: number) => hash32((v >>> 0) ^ hash32(Math.floor(v / 4294967296) + 0x9e3779b9));
const stepHash = (step: number) => hash32(step + 0x632be5ab);
/** The uniform of the hashes of a seed, a key and a step. */
const uniformOf = (seed: number, key: number, step: number) => ((hash32(seed ^ hash32(key ^ step)) >>> 8) + 0.5) / 16777216;

/** A uniform number in (0, 1) with 24 random bits (exactly representable in float32). */
export function uniformAt(seed: number, key: number, step: number): number {
  return uniformOf(fold(seed), fold(key), stepHash(step));
}

/**
 * Noise for `keys.length` rows × `steps` steps, row-major float32 (the graph's `noise` input):
 * element [r, t] is uniformAt(seed, keys[r], t). With `width` > `steps` the rows are `width` long
 * and their columns from `steps` on are 0 (a buffer sized for longer calls, whose later columns a
 * call of `steps` steps never reads). The seed's, each key's and each step's hash are computed
 * once, not once per element as uniformAt would.
 */
export function uniformNoise(seed: number, keys: readonly number[], steps: number, width = steps): Float32Array {
  if (!Number.isInteger(width) || width < steps) throw new Error(`uniformNoise: width ${width} is below steps ${steps}`);
  const out = new Float32Array(keys.length * width);
  const s = fold(seed);
  const t = new Uint32Array(steps);
  for (let j = 0; j < steps; j++) t[j] = stepHash(j);
  keys.forEach((key, r) => {
    const k = fold(key);
    const base = r * width;
    for (let j = 0; j < steps; j++) out[base + j] = uniformOf(s, k, t[j]);
  });
  return out;
}

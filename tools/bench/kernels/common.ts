/**
 * What the kernel checks (ce-check, flash-check, rope-check) share: the element types they test, a
 * seeded generator, dtype bit conversions for uploads and downloads, the error statistic, and how a
 * check compiles, ends and reports a failure.
 */
import { cudaIncludeDir, type Kernels } from '@lathe/kernels';
import { fromBfloat16Bits, fromFloat16Bits, toBfloat16Bits, toFloat16Bits, type DeviceTensor } from '@lathe/runtime';

/** The element types a check runs in. */
export type Dt = 'bfloat16' | 'float16' | 'float32';

/** A seeded uniform generator in [-1, 1) (mulberry32's mixing). */
export function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 31 - 1;
  };
}

/** float32 values as the dtype's upload bits (float32 as they are). */
export const toBits = (dt: Dt, x: Float32Array): Uint16Array | Float32Array => (dt === 'bfloat16' ? toBfloat16Bits(x) : dt === 'float16' ? toFloat16Bits(x) : x);
/** A download's bits as float32 values. */
export const fromBits = (dt: Dt, x: Uint16Array | Float32Array): Float32Array => (x instanceof Float32Array ? x : dt === 'bfloat16' ? fromBfloat16Bits(x) : fromFloat16Bits(x));

/** A device tensor's values as float32. */
export function download(t: DeviceTensor): Float32Array {
  const h = t.download();
  return t.dtype === 'float32' ? (h.data as Float32Array) : fromBits(t.dtype as Dt, h.data as Uint16Array | Float32Array);
}

/** The largest absolute error, the largest reference magnitude, their ratio, and whether every value was finite. */
export interface Stat {
  max_err: number;
  max_ref: number;
  rel: number;
  finite: boolean;
}

/** {@link Stat} of `got` against `ref`: errors over the elements `keep` selects (all by default), finiteness over all. */
export function compare(got: Float32Array, ref: Float32Array, keep: (i: number) => boolean = () => true): Stat {
  let err = 0;
  let mx = 0;
  let finite = true;
  for (let i = 0; i < ref.length; i++) {
    if (!Number.isFinite(got[i])) finite = false;
    if (!keep(i)) continue;
    err = Math.max(err, Math.abs(got[i] - ref[i]));
    mx = Math.max(mx, Math.abs(ref[i]));
  }
  return { max_err: +err.toPrecision(4), max_ref: +mx.toPrecision(4), rel: +(err / (mx || 1)).toPrecision(4), finite };
}

/** Compiles a check's kernels with the CUDA headers' folder and prints the compile phase's line (time, compiled and cached modules, target). */
export function compilePhase<T>(kernels: Kernels, compile: (includeDir: string) => T): T {
  const include = cudaIncludeDir();
  const t0 = performance.now();
  const out = compile(include);
  console.log(JSON.stringify({ phase: 'compile', include, ms: +(performance.now() - t0).toFixed(1), compiled: kernels.counts.compiled, cached: kernels.counts.cached, target: kernels.target }));
  return out;
}

/** Runs a check's main: prints its summary line, and exits 1 where a check failed or it threw. */
export function runCheck(main: () => boolean): void {
  try {
    const ok = main();
    console.log(JSON.stringify({ phase: 'summary', ok }));
    if (!ok) process.exit(1);
  } catch (e) {
    console.error(e);
    process.exit(1);
  }
}

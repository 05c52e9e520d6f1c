/**
 * What the kernel checks (ce-check, decode-check, flash-check, rope-check, swiglu-check) share: the element types they test, a
 * seeded generator, dtype bit conversions for uploads and downloads, the error statistic, and how a
 * check compiles, ends and reports a failure.
 */
import { cudaIncludeDir, Kernels } from '@lathe/kernels';
import { Device, fromBfloat16Bits, fromFloat16Bits, toBfloat16Bits, toFloat16Bits, type DeviceTensor } from '@lathe/runtime';
import { arg, flag } from '../argv';

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

/**
 * `--phases` of a check (with `--cpu`: on the CPU, where there are no kernels to compile or time): the
 * phases asked for, default `all` (on the CPU `cpuPhases`); an unknown phase, or one the CPU cannot
 * run with `--cpu`, is an error naming it.
 */
export function phasesOf(all: readonly string[], cpuPhases: readonly string[]): { cpu: boolean; phases: string[] } {
  const cpu = flag('cpu');
  const phases = arg('phases', (cpu ? cpuPhases : all).join(',')).split(',');
  for (const p of phases) if (!all.includes(p)) throw new Error(`--phases: unknown phase '${p}' (${all.join(', ')})`);
  if (cpu && phases.some((p) => !cpuPhases.includes(p))) throw new Error(`--cpu runs the ${cpuPhases.join(', ')} phase(s) only (no kernels to compile or time on the CPU)`);
  return { cpu, phases };
}

/**
 * The main of a check of one kernel family's custom ops (rope-check, swiglu-check): phases compile,
 * check and time; with `--cpu` the check phase over the host ops' cases.
 */
export function opsCheck<K, O extends { dispose(): void }, C>(spec: {
  cpuOps: () => O;
  compile: (kernels: Kernels, includeDir: string) => K;
  cudaOps: (compiled: K) => O;
  cases: readonly C[];
  cpuCases: readonly C[];
  check: (device: Device, ops: O, c: C) => boolean;
  time: (kernels: Kernels, compiled: K, device: Device, ops: O) => void;
}): () => boolean {
  return () => {
    const { cpu, phases } = phasesOf(['compile', 'check', 'time'], ['check']);
    let ok = true;
    if (cpu) {
      const ops = spec.cpuOps();
      for (const c of spec.cpuCases) ok = spec.check(Device.cpu(), ops, c) && ok;
      ops.dispose();
      return ok;
    }
    const { kernels, device } = Kernels.withDevice();
    const compiled = compilePhase(kernels, (includeDir) => spec.compile(kernels, includeDir));
    const ops = spec.cudaOps(compiled);
    if (phases.includes('check')) for (const c of spec.cases) ok = spec.check(device, ops, c) && ok;
    if (phases.includes('time')) spec.time(kernels, compiled, device, ops);
    ops.dispose();
    kernels.dispose();
    return ok;
  };
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

/**
 * Lathe's RoPE kernel (issue 37: RoPE in place of ONNX Runtime's RotaryEmbedding) checked and timed
 * on the GPU. Phases, one JSON line each:
 * - compile: NVRTC build of every variant (ms, cold or cached).
 * - check (per case): the op's rotation and its gradient (the inverse rotation of an upstream w) in
 *   one ORT session, and ORT's RotaryEmbedding on the same inputs, each against the host rule
 *   (ropeReference) on the same rounded inputs; max abs error / max |reference|. A case passes when
 *   the kernel's error is at most max(2 × ORT's, one rounding of the dtype) — else exit code 1.
 * - time: q [B, S, 16·128] and k [B, S, 8·128] bf16 at --batch (default 8x1024, Qwen3-0.6B's training
 *   shape): the kernel launched directly (device ms, GB/s of x read + y written), and in a session the
 *   op against RotaryEmbedding, forward and forward + backward.
 *
 * --cpu: a smoke test of this script on the CPU (float32, the op's host compute in place of the kernel).
 *
 * usage: node .bundle/rope-check.js [--phases compile,check,time] [--batch 8x1024] [--reps 20] [--cpu]
 */
import * as L from '@lathe/onnx';
import { Kernels, RopeKernels, ropeOps, ropeReference, type RopeOps } from '@lathe/kernels';
import { Device } from '@lathe/runtime';
import { arg } from '../argv';
import { download, fromBits, opsCheck, rng, runCheck, toBits, type Dt } from './common';


interface Case {
  name: string;
  batch: number;
  seq: number;
  heads: number;
  headDim: number;
  dtype: Dt;
}

const CASES: Case[] = [
  { name: 'q_bf16_hd128', batch: 3, seq: 37, heads: 16, headDim: 128, dtype: 'bfloat16' },
  { name: 'k_bf16_hd64', batch: 2, seq: 33, heads: 5, headDim: 64, dtype: 'bfloat16' },
  { name: 'fp16_hd128', batch: 1, seq: 19, heads: 3, headDim: 128, dtype: 'float16' },
  { name: 'fp32_hd64', batch: 2, seq: 21, heads: 4, headDim: 64, dtype: 'float32' },
];
const CPU_CASES: Case[] = [{ name: 'cpu_fp32_hd8', batch: 2, seq: 5, heads: 3, headDim: 8, dtype: 'float32' }];
const MAX_POSITIONS = 2048;
const ROUNDING: Record<Dt, number> = { bfloat16: 2 ** -8, float16: 2 ** -11, float32: 2e-6 };

/** Random values rounded to the dtype: the bits to upload and the float32 values they hold. */
function rounded(dt: Dt, x: Float32Array): { bits: Uint16Array | Float32Array; values: Float32Array } {
  const bits = toBits(dt, x);
  return { bits, values: fromBits(dt, bits) };
}

/** Qwen3's tables (θ = 10⁶) for `headDim`, [MAX_POSITIONS, headDim/2] each. */
function caches(headDim: number): { cos: Float32Array; sin: Float32Array } {
  const half = headDim / 2;
  const angle = (k: number) => Math.fround(Math.floor(k / half) * Math.fround(1 / 1e6 ** ((2 * (k % half)) / headDim)));
  return { cos: Float32Array.from({ length: MAX_POSITIONS * half }, (_, k) => Math.cos(angle(k))), sin: Float32Array.from({ length: MAX_POSITIONS * half }, (_, k) => Math.sin(angle(k))) };
}

/** y = rope(x) and dx of Σ y·w, through the op or ORT's RotaryEmbedding. */
function ropeGraph(c: Case, path: 'kernel' | 'ort', ops: RopeOps, withGrad: boolean): L.Graph {
  const g = new L.Graph(`rope_${path}`);
  const width = c.heads * c.headDim;
  const x = g.input('x', c.dtype, [c.batch, c.seq, width]);
  const pos = g.input('pos', 'int64', [c.batch, c.seq]);
  const cos = g.input('cos', c.dtype, [MAX_POSITIONS, c.headDim / 2]);
  const sin = g.input('sin', c.dtype, [MAX_POSITIONS, c.headDim / 2]);
  const y = path === 'kernel' ? ops.rotate(x, pos, cos, sin) : L.rotaryEmbedding(x, pos, cos, sin);
  g.output(y, 'y');
  if (withGrad) g.output(L.grad(L.reduceSum(L.cast(L.mul(y, g.input('w', c.dtype, [c.batch, c.seq, width])), 'float32')), [x])[0]!, 'dx');
  return g;
}

interface Inputs {
  x: { bits: Uint16Array | Float32Array; values: Float32Array };
  w: { bits: Uint16Array | Float32Array; values: Float32Array };
  cos: { bits: Uint16Array | Float32Array; values: Float32Array };
  sin: { bits: Uint16Array | Float32Array; values: Float32Array };
  pos: BigInt64Array;
}

function inputsOf(c: Case): Inputs {
  const r = rng(17);
  const n = c.batch * c.seq * c.heads * c.headDim;
  const t = caches(c.headDim);
  // row b starts at position 97·b (as an offset batch would), within the table
  const pos = BigInt64Array.from({ length: c.batch * c.seq }, (_, i) => BigInt((97 * Math.floor(i / c.seq) + (i % c.seq)) % MAX_POSITIONS));
  return { x: rounded(c.dtype, Float32Array.from({ length: n }, () => 2 * r())), w: rounded(c.dtype, Float32Array.from({ length: n }, () => r())), cos: rounded(c.dtype, t.cos), sin: rounded(c.dtype, t.sin), pos };
}

/** A binding of `session` with the inputs uploaded; `dispose` frees both. */
function bindAll(device: Device, session: ReturnType<Device['compile']>, c: Case, x: Inputs, withGrad: boolean) {
  const width = c.heads * c.headDim;
  const up = [
    device.upload({ data: x.x.bits, dims: [c.batch, c.seq, width] }, c.dtype),
    device.upload({ data: x.pos, dims: [c.batch, c.seq] }),
    device.upload({ data: x.cos.bits, dims: [MAX_POSITIONS, c.headDim / 2] }, c.dtype),
    device.upload({ data: x.sin.bits, dims: [MAX_POSITIONS, c.headDim / 2] }, c.dtype),
    ...(withGrad ? [device.upload({ data: x.w.bits, dims: [c.batch, c.seq, width] }, c.dtype)] : []),
  ];
  const b = session.binding().input('x', up[0]).input('pos', up[1]).input('cos', up[2]).input('sin', up[3]).output('y', 'device');
  if (withGrad) b.input('w', up[4]).output('dx', 'device');
  return {
    b,
    dispose: () => {
      b.dispose();
      for (const t of up) t.dispose();
    },
  };
}

function compare(got: Float32Array, ref: Float32Array): { rel: number; finite: boolean } {
  let err = 0;
  let mx = 0;
  let finite = true;
  for (let i = 0; i < ref.length; i++) {
    if (!Number.isFinite(got[i])) finite = false;
    err = Math.max(err, Math.abs(got[i] - ref[i]));
    mx = Math.max(mx, Math.abs(ref[i]));
  }
  return { rel: +(err / (mx || 1)).toPrecision(4), finite };
}

function checkCase(device: Device, ops: RopeOps, c: Case): boolean {
  const x = inputsOf(c);
  const shape = { rows: c.batch * c.seq, heads: c.heads, half: c.headDim / 2, maxPositions: MAX_POSITIONS };
  const ref = {
    y: ropeReference(shape, { x: x.x.values, positionIds: x.pos, cos: x.cos.values, sin: x.sin.values }),
    dx: ropeReference(shape, { x: x.w.values, positionIds: x.pos, cos: x.cos.values, sin: x.sin.values }, -1),
  };
  const report: Record<string, unknown> = {};
  const failures: string[] = [];
  const got: Record<string, Record<'y' | 'dx', Float32Array>> = {};
  for (const path of ['kernel', 'ort'] as const) {
    const session = device.compile(ropeGraph(c, path, ops, true), path === 'kernel' ? { customOpDomains: [ops.domain.handle] } : {});
    const { b, dispose } = bindAll(device, session, c, x, true);
    b.runSync();
    ops.check();
    got[path] = { y: download(b.get('y')), dx: download(b.get('dx')) };
    dispose();
    session.dispose();
  }
  for (const n of ['y', 'dx'] as const) {
    const kernel = compare(got.kernel[n], ref[n]);
    const ort = compare(got.ort[n], ref[n]);
    const bound = Math.max(2 * ort.rel, ROUNDING[c.dtype]);
    const pass = kernel.finite && kernel.rel <= bound;
    if (!pass) failures.push(`${n}: kernel rel ${kernel.rel} > ${bound.toPrecision(3)}`);
    report[n] = { kernel, ort, bound: +bound.toPrecision(3), pass };
  }
  const ok = failures.length === 0;
  console.log(JSON.stringify({ phase: 'check', case: c.name, shape: c, vs_host: report, ok, failures }));
  return ok;
}

function timePhase(kernels: Kernels, rope: RopeKernels, device: Device, ops: RopeOps): void {
  const reps = Number(arg('reps', '20'));
  const [B, S] = arg('batch', '8x1024').split('x').map(Number);
  const time = (fn: () => void) => {
    for (let r = 0; r < 2; r++) fn();
    kernels.synchronize();
    return kernels.time(() => {
      for (let r = 0; r < reps; r++) fn();
    }) / reps;
  };
  for (const [what, heads] of [
    ['q', 16],
    ['k', 8],
  ] as const) {
    const c: Case = { name: `time_${what}`, batch: B, seq: S, heads, headDim: 128, dtype: 'bfloat16' };
    const x = inputsOf(c);
    const width = heads * 128;
    const xs = device.upload({ data: x.x.bits, dims: [B, S, width] }, 'bfloat16');
    const pos = device.upload({ data: x.pos, dims: [B, S] });
    const cos = device.upload({ data: x.cos.bits, dims: [MAX_POSITIONS, 64] }, 'bfloat16');
    const sin = device.upload({ data: x.sin.bits, dims: [MAX_POSITIONS, 64] }, 'bfloat16');
    const y = device.empty('bfloat16', [B, S, width]);
    const direct = time(() => rope.apply({ rows: B * S, heads, half: 64, maxPositions: MAX_POSITIONS, dtype: 'bfloat16' }, { x: xs, positionIds: pos, cos, sin, y }));
    const bytes = 2 * B * S * width * 2;
    const session: Record<string, number | string> = {};
    for (const path of ['kernel', 'ort'] as const) {
      for (const withGrad of [false, true]) {
        const key = `${path}_${withGrad ? 'fwd_bwd' : 'fwd'}`;
        try {
          const s = device.compile(ropeGraph(c, path, ops, withGrad), path === 'kernel' ? { customOpDomains: [ops.domain.handle] } : {});
          const { b, dispose } = bindAll(device, s, c, x, withGrad);
          session[key] = +time(() => b.runSync({ synchronize: false })).toFixed(4);
          ops.check();
          dispose();
          s.dispose();
        } catch (e) {
          session[key] = `failed: ${(e as Error).message.split('\n')[0]}`;
        }
      }
    }
    console.log(JSON.stringify({ phase: 'time', tensor: what, shape: [B, S, width], dtype: 'bfloat16', reps, kernel_ms: +direct.toFixed(4), kernel_gb_per_s: Math.round(bytes / (direct * 1e6)), session_ms: session }));
    for (const t of [xs, pos, cos, sin, y]) t.dispose();
  }
}

runCheck(
  opsCheck({
    cpuOps: () => ropeOps('cpu'),
    compile: (kernels, includeDir) => RopeKernels.compile(kernels, { includeDir }),
    cudaOps: (k: RopeKernels) => ropeOps('cuda', k),
    cases: CASES,
    cpuCases: CPU_CASES,
    check: checkCase,
    time: timePhase,
  }),
);

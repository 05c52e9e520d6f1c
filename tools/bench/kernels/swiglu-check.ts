/**
 * Lathe's SwiGLU kernels (issue 37: the MLP's activation in place of ONNX Runtime's QuickGelu and
 * Mul) checked and timed on the GPU. Phases, one JSON line each:
 * - compile: NVRTC build of every variant (ms, cold or cached).
 * - check (per case): the op's y = silu(g)·u and its gradients (dg, du of Σ y·w) in one ORT session,
 *   and the composed QuickGelu·Mul (what the decoder's MLP runs without the kernel) with Lathe's
 *   autodiff on the same inputs, each against the host rule (swigluReference) on the same rounded
 *   inputs; max abs error / max |reference|. A case passes when the kernel's error is at most
 *   max(2 × the composed graph's, one rounding of the dtype) — else exit code 1.
 * - time: gate and up [B, S, 3072] bf16 at --batch (default 8x1024, Qwen3-0.6B's training shape):
 *   the forward and backward kernels launched directly (device ms, GB/s of what each reads and
 *   writes), and in a session the op against the composed graph, forward and forward + backward.
 *
 * --cpu: a smoke test of this script on the CPU (float32, the op's host compute in place of the kernel).
 *
 * usage: node .bundle/swiglu-check.js [--phases compile,check,time] [--batch 8x1024] [--intermediate 3072] [--reps 20] [--cpu]
 */
import * as L from '@lathe/onnx';
import { Kernels, SwigluKernels, swigluOps, swigluReference, type SwigluOps } from '@lathe/kernels';
import { Device } from '@lathe/runtime';
import { arg } from '../argv';
import { compare, download, fromBits, opsCheck, rng, runCheck, toBits, type Dt } from './common';

interface Case {
  name: string;
  /** [B, S, I]. */
  dims: [number, number, number];
  dtype: Dt;
}

// ragged sizes (elements not a multiple of the 16-byte vector) and several blocks with a partial last one
const CASES: Case[] = [
  { name: 'bf16_qwen_width', dims: [2, 37, 3072], dtype: 'bfloat16' },
  { name: 'bf16_ragged', dims: [3, 7, 301], dtype: 'bfloat16' },
  { name: 'fp16_ragged', dims: [1, 19, 1027], dtype: 'float16' },
  { name: 'fp32_ragged', dims: [2, 5, 999], dtype: 'float32' },
];
const CPU_CASES: Case[] = [{ name: 'cpu_fp32_ragged', dims: [2, 3, 13], dtype: 'float32' }];
// fp32: __expf's few ulps on top of fp32 rounding
const ROUNDING: Record<Dt, number> = { bfloat16: 2 ** -8, float16: 2 ** -11, float32: 1e-5 };

type Rounded = { bits: Uint16Array | Float32Array; values: Float32Array };

/** Random values rounded to the dtype: the bits to upload and the float32 values they hold. */
function rounded(dt: Dt, x: Float32Array): Rounded {
  const bits = toBits(dt, x);
  return { bits, values: fromBits(dt, bits) };
}

interface Inputs {
  gate: Rounded;
  up: Rounded;
  w: Rounded;
}

function inputsOf(c: Case): Inputs {
  const r = rng(23);
  const n = c.dims[0] * c.dims[1] * c.dims[2];
  // gates over ±8 (σ near both ends), as a trained MLP's pre-activations spread
  return { gate: rounded(c.dtype, Float32Array.from({ length: n }, () => 8 * r())), up: rounded(c.dtype, Float32Array.from({ length: n }, () => 2 * r())), w: rounded(c.dtype, Float32Array.from({ length: n }, () => r())) };
}

/** y = silu(g)·u and dg, du of Σ y·w, through the op or composed from QuickGelu and Mul. */
function swigluGraph(c: Case, path: 'kernel' | 'composed', ops: SwigluOps, withGrad: boolean): L.Graph {
  const g = new L.Graph(`swiglu_${path}`);
  const gate = g.input('gate', c.dtype, c.dims);
  const up = g.input('up', c.dtype, c.dims);
  const y = path === 'kernel' ? ops.apply(gate, up) : L.mul(L.quickGelu(gate, 1), up);
  g.output(y, 'y');
  if (withGrad) {
    const [dg, du] = L.grad(L.reduceSum(L.cast(L.mul(y, g.input('w', c.dtype, c.dims)), 'float32')), [gate, up]);
    g.output(dg!, 'dgate');
    g.output(du!, 'dup');
  }
  return g;
}

/** A binding of `session` with the inputs uploaded; `dispose` frees both. */
function bindAll(device: Device, session: ReturnType<Device['compile']>, c: Case, x: Inputs, withGrad: boolean) {
  const up = [device.upload({ data: x.gate.bits, dims: c.dims }, c.dtype), device.upload({ data: x.up.bits, dims: c.dims }, c.dtype), ...(withGrad ? [device.upload({ data: x.w.bits, dims: c.dims }, c.dtype)] : [])];
  const b = session.binding().input('gate', up[0]).input('up', up[1]).output('y', 'device');
  if (withGrad) b.input('w', up[2]).output('dgate', 'device').output('dup', 'device');
  return {
    b,
    dispose: () => {
      b.dispose();
      for (const t of up) t.dispose();
    },
  };
}

const OUTS = ['y', 'dgate', 'dup'] as const;

function checkCase(device: Device, ops: SwigluOps, c: Case): boolean {
  const x = inputsOf(c);
  const grads = swigluReference(x.gate.values, x.up.values, x.w.values);
  const ref = { y: swigluReference(x.gate.values, x.up.values), dgate: grads.dGate, dup: grads.dUp };
  const report: Record<string, unknown> = {};
  const failures: string[] = [];
  const got: Record<string, Record<(typeof OUTS)[number], Float32Array>> = {};
  for (const path of ['kernel', 'composed'] as const) {
    const session = device.compile(swigluGraph(c, path, ops, true), path === 'kernel' ? { customOpDomains: [ops.domain.handle] } : {});
    const { b, dispose } = bindAll(device, session, c, x, true);
    b.runSync();
    ops.check();
    got[path] = { y: download(b.get('y')), dgate: download(b.get('dgate')), dup: download(b.get('dup')) };
    dispose();
    session.dispose();
  }
  for (const n of OUTS) {
    const kernel = compare(got.kernel[n], ref[n]);
    const composed = compare(got.composed[n], ref[n]);
    const bound = Math.max(2 * composed.rel, ROUNDING[c.dtype]);
    const pass = kernel.finite && kernel.rel <= bound;
    if (!pass) failures.push(`${n}: kernel rel ${kernel.rel} > ${bound.toPrecision(3)}`);
    report[n] = { kernel, composed, bound: +bound.toPrecision(3), pass };
  }
  const ok = failures.length === 0;
  console.log(JSON.stringify({ phase: 'check', case: c.name, shape: c, vs_host: report, ok, failures }));
  return ok;
}

function timePhase(kernels: Kernels, swiglu: SwigluKernels, device: Device, ops: SwigluOps): void {
  const reps = Number(arg('reps', '20'));
  const [B, S] = arg('batch', '8x1024').split('x').map(Number);
  const I = Number(arg('intermediate', '3072'));
  const time = (fn: () => void) => {
    for (let r = 0; r < 2; r++) fn();
    kernels.synchronize();
    return (
      kernels.time(() => {
        for (let r = 0; r < reps; r++) fn();
      }) / reps
    );
  };
  const c: Case = { name: 'time', dims: [B, S, I], dtype: 'bfloat16' };
  const x = inputsOf(c);
  const n = B * S * I;
  const t = (v: Rounded) => device.upload({ data: v.bits, dims: c.dims }, 'bfloat16');
  const [gate, up, dy] = [t(x.gate), t(x.up), t(x.w)];
  const [y, dGate, dUp] = [0, 1, 2].map(() => device.empty('bfloat16', c.dims));
  const shape = { n, dtype: 'bfloat16' as const };
  const fwd = time(() => swiglu.forward(shape, { gate, up, y }));
  const bwd = time(() => swiglu.backward(shape, { dy, gate, up, dGate, dUp }));
  const session: Record<string, number | string> = {};
  for (const path of ['kernel', 'composed'] as const) {
    for (const withGrad of [false, true]) {
      const key = `${path}_${withGrad ? 'fwd_bwd' : 'fwd'}`;
      try {
        const s = device.compile(swigluGraph(c, path, ops, withGrad), path === 'kernel' ? { customOpDomains: [ops.domain.handle] } : {});
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
  // bf16: the forward reads g and u and writes y; the backward reads dy, g and u and writes dg and du
  console.log(
    JSON.stringify({
      phase: 'time',
      shape: c.dims,
      dtype: 'bfloat16',
      reps,
      fwd_ms: +fwd.toFixed(4),
      fwd_gb_per_s: Math.round((3 * n * 2) / (fwd * 1e6)),
      bwd_ms: +bwd.toFixed(4),
      bwd_gb_per_s: Math.round((5 * n * 2) / (bwd * 1e6)),
      session_ms: session,
    }),
  );
  for (const d of [gate, up, dy, y, dGate, dUp]) d.dispose();
}

runCheck(
  opsCheck({
    cpuOps: () => swigluOps('cpu'),
    compile: (kernels, includeDir) => SwigluKernels.compile(kernels, { includeDir }),
    cudaOps: (k: SwigluKernels) => swigluOps('cuda', k),
    cases: CASES,
    cpuCases: CPU_CASES,
    check: checkCase,
    time: timePhase,
  }),
);

/**
 * Lathe's flash-attention kernels checked and timed on the GPU (issue 37). Phases, one JSON line each:
 * - compile: NVRTC build of every variant (include folder, ms, cold or cached).
 * - check (per case): forward and backward of the kernels on random bf16/fp16 inputs with ragged row
 *   lengths, against (a) the composed path through ONNX Runtime on the same device (GroupQueryAttention
 *   and its gradient rule) and (b) an fp32 reference — PyTorch's SDPA forward+backward
 *   (/opt/torch/.venv/bin/python, or --python) where present, and attention on the host in float64
 *   for short cases. Max abs error / max |reference| of out, dq, dk, dv for the kernels and for the
 *   composed path; padding rows (out, dq) and padding keys (dk, dv) must be exactly 0. A case passes
 *   when every kernel error is at most max(2 × the composed path's, 2e-2) (FA's own acceptance rule:
 *   no worse than twice the reference implementation in the same precision) — else exit code 1.
 * - op: the kernels as custom ops in one ORT session (the decoder's opt-in path), forward and
 *   gradient, against the direct launches: mode `kernels` (the kernels' forward and backward) must be
 *   equal (dq to rounding: atomicAdd order), mode `backward` (GroupQueryAttention's forward, the
 *   kernels' backward) within 2 %.
 * - time: kernel vs composed forward and forward+backward at the Qwen3-0.6B training shape (8 × 1024,
 *   16/8 heads, 128), device ms from events on the stream, per layer, and GroupQueryAttention's
 *   forward followed by the kernels' backward; PyTorch SDPA (flash backend, causal) beside them when
 *   PyTorch is there.
 * - sft: full SFT steps of Qwen3-0.6B (random init) at --batch 8x1024 through the trainer, sftLoss's
 *   flash attention (GroupQueryAttention, composed backward) against the same loss with the decoder's
 *   kernel path (--mode backward: GroupQueryAttention's forward and the kernels' backward, the
 *   default; kernels: both sides; or both, comma-separated): losses (must agree within 2 % in bf16),
 *   step ms and tok/s of each.
 *
 * --cpu: a smoke test of this script on the CPU (float32, tiny cases, the custom ops' host compute in
 * place of the kernels, no PyTorch): what CI can run; it checks the script, not the kernels.
 *
 * usage: node .bundle/flash-check.js [--phases compile,check,op,time,sft] [--cases NAME,…] [--reps 20] [--python PATH] [--no-torch]
 *          [--batch 8x1024] [--steps 4] [--compute bfloat16] [--mode backward|kernels|backward,kernels] [--cpu]
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import { CausalLM, chunkedTargetLogprobs, decoder, paddedCausalMask, positionsFromPadding, rightPaddedAttention, shiftLeft, totalLength, totalLengthTensor, TOTAL_LENGTH_INPUT, type DecoderConfig, type FlashAttentionInputs, type HfConfig } from '@lathe/models';
import { castWeights, sftLoss, Trainer, type LossBuilder } from '@lathe/train';
import { FlashAttention, flashAttentionOps, flashAttentionReference, Kernels, type FlashAttentionMode, type FlashAttentionOps, type FlashAttentionShape } from '@lathe/kernels';
import { Device, type Binding, type DeviceTensor, type Session } from '@lathe/runtime';
import { arg, flag } from '../argv';
import { QWEN3_0_6B } from '../shapes';
import { trainedParams } from './plan';
import { compare, compilePhase, download, fromBits, rng, runCheck, toBits } from './common';

type Half = 'bfloat16' | 'float16' | 'float32';

interface Case {
  name: string;
  batch: number;
  seqLen: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  dtype: Half;
  lens: number[];
}

const CASES: Case[] = [
  { name: 'b2_t128_ragged', batch: 2, seqLen: 128, numHeads: 16, numKvHeads: 8, headDim: 128, dtype: 'bfloat16', lens: [128, 77] },
  { name: 'b2_t1024_ragged', batch: 2, seqLen: 1024, numHeads: 16, numKvHeads: 8, headDim: 128, dtype: 'bfloat16', lens: [1024, 601] },
  { name: 'b3_t200_hd64_g4_len1', batch: 3, seqLen: 200, numHeads: 8, numKvHeads: 2, headDim: 64, dtype: 'bfloat16', lens: [1, 200, 130] },
  { name: 'b2_t130_fp16', batch: 2, seqLen: 130, numHeads: 16, numKvHeads: 8, headDim: 128, dtype: 'float16', lens: [130, 65] },
];

/** Host reference in float64 only where it is quick (it is O(B·H·T²·D) in JavaScript). */
const HOST_REFERENCE_MAX_T = 256;

const TORCH_SCRIPT = String.raw`
import json, sys, torch
import torch.nn.functional as F
spec = json.load(open(sys.argv[1]))
d = spec["dir"]
dev = "cuda"
def load(name, shape):
    return torch.frombuffer(bytearray(open(f"{d}/{name}.f32", "rb").read()), dtype=torch.float32).reshape(shape).to(dev)
def save(t, name):
    t = t.detach().float().cpu().contiguous()
    try:
        import numpy
        t.numpy().tofile(f"{d}/{name}.f32")
    except ImportError:
        with open(f"{d}/{name}.f32", "wb") as f:
            f.write(bytes(t.view(torch.uint8).reshape(-1).tolist()))
out = {}
if spec.get("case"):
    B, T, H, KV, D = spec["B"], spec["T"], spec["H"], spec["KV"], spec["D"]
    lens = spec["lens"]
    q, k, v, do = load("q", (B, T, H, D)), load("k", (B, T, KV, D)), load("v", (B, T, KV, D)), load("do", (B, T, H, D))
    i = torch.arange(T, device=dev)
    ln = torch.tensor(lens, device=dev)
    # causal and within the row; a padding query keeps its row's keys (its output is zeroed below)
    allowed = (i[None, None, :, None] >= i[None, None, None, :]) | (i[None, None, :, None] >= ln[:, None, None, None])
    allowed = allowed & (i[None, None, None, :] < ln[:, None, None, None])
    valid = (i[None, None, :, None] < ln[:, None, None, None])
    def run(dt):
        qq, kk, vv = [t.to(dt).transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v)]
        kr, vr = kk.repeat_interleave(H // KV, dim=1), vv.repeat_interleave(H // KV, dim=1)
        o = F.scaled_dot_product_attention(qq, kr, vr, attn_mask=allowed) * valid
        o.backward(do.to(dt).transpose(1, 2))
        return [t.float().transpose(1, 2).contiguous() for t in (o.detach(), qq.grad, kk.grad, vv.grad)]
    for tag, dt in (("fp32", torch.float32), ("half", torch.bfloat16 if spec["dtype"] == "bfloat16" else torch.float16)):
        for name, t in zip(("o", "dq", "dk", "dv"), run(dt)):
            save(t, f"torch_{tag}_{name}")
if spec.get("time"):
    B, T, H, KV, D, reps = spec["B"], spec["T"], spec["H"], spec["KV"], spec["D"], spec["reps"]
    dt = torch.bfloat16
    # keys and values expanded to H heads beforehand (the same FLOPs as GQA; the expansion is not timed)
    q, k, v = [torch.randn(B, H, T, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3)]
    do = torch.randn(B, H, T, D, device=dev, dtype=dt)
    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    def both():
        fwd().backward(do)
    res = {}
    for name, fn in (("fwd", fwd), ("fwd_bwd", both)):
        for _ in range(3): fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps): fn()
        b.record(); torch.cuda.synchronize()
        res[name] = round(a.elapsed_time(b) / reps, 3)
    out["time"] = res
out["torch"] = torch.__version__
json.dump(out, open(f"{d}/torch_out.json", "w"))
`;

function pythonPath(): string | undefined {
  if (flag('no-torch')) return undefined;
  const p = arg('python', '/opt/torch/.venv/bin/python');
  return existsSync(p) ? p : undefined;
}

function runTorch(python: string, dir: string, spec: Record<string, unknown>): Record<string, unknown> {
  writeFileSync(join(dir, 'torch_check.py'), TORCH_SCRIPT);
  writeFileSync(join(dir, 'spec.json'), JSON.stringify({ ...spec, dir }));
  execFileSync(python, [join(dir, 'torch_check.py'), join(dir, 'spec.json')], { stdio: ['ignore', 'inherit', 'inherit'] });
  return JSON.parse(readFileSync(join(dir, 'torch_out.json'), 'utf8')) as Record<string, unknown>;
}

function readF32(path: string): Float32Array {
  const b = readFileSync(path);
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
}

/** Random values rounded to the half type (the inputs every path sees), as bits and as floats. */
function randomHalf(dt: Half, n: number, amp: number, seed: number): { bits: Uint16Array | Float32Array; values: Float32Array } {
  const r = rng(seed);
  const bits = toBits(dt, Float32Array.from({ length: n }, () => amp * r()));
  return { bits, values: fromBits(dt, bits) };
}

/** The composed path: GroupQueryAttention and its gradient rule, one session, outputs out, dq, dk, dv. */
function composedGraph(c: { batch: number; seqLen: number; numHeads: number; numKvHeads: number; headDim: number; dtype: Half }, withGrad: boolean): L.Graph {
  const { batch: B, seqLen: T, numHeads: H, numKvHeads: KV, headDim: D, dtype } = c;
  const g = new L.Graph(withGrad ? 'composed_fwd_bwd' : 'composed_fwd');
  const q = g.input('q', dtype, [B, T, H * D]);
  const k = g.input('k', dtype, [B, T, KV * D]);
  const v = g.input('v', dtype, [B, T, KV * D]);
  const seqlens = g.input('seqlens_k', 'int32', [B]);
  const tokens = g.input('tokens', 'bool', [B, T, 1]);
  const r = L.groupQueryAttention({ query: q, key: k, value: v, seqlensK: seqlens, totalSequenceLength: g.constant(T, 'int32', []) }, { numHeads: H, kvNumHeads: KV });
  const out = L.where(tokens, r.output, g.constant(0, dtype, []));
  g.output(out, 'out');
  if (withGrad) {
    const dOut = g.input('dout', dtype, [B, T, H * D]);
    const [dq, dk, dv] = L.grad(out, [q, k, v], { seed: dOut });
    g.output(dq, 'dq');
    g.output(dk, 'dk');
    g.output(dv, 'dv');
  }
  return g;
}

interface Inputs {
  shape: FlashAttentionShape;
  q: DeviceTensor;
  k: DeviceTensor;
  v: DeviceTensor;
  dOut: DeviceTensor;
  seqlens: DeviceTensor;
  tokens: DeviceTensor;
  host: { q: Float32Array; k: Float32Array; v: Float32Array; dOut: Float32Array; seqlensK: Int32Array };
}

function makeInputs(device: Device, c: Case, seed: number): Inputs {
  const { batch: B, seqLen: T, numHeads: H, numKvHeads: KV, headDim: D, dtype } = c;
  const q = randomHalf(dtype, B * T * H * D, 2, seed);
  const k = randomHalf(dtype, B * T * KV * D, 2, seed + 1);
  const v = randomHalf(dtype, B * T * KV * D, 1, seed + 2);
  const dO = randomHalf(dtype, B * T * H * D, 1, seed + 3);
  // the decoder zeroes outputs at padding, so their gradients are 0
  for (let b = 0; b < B; b++) for (let i = c.lens[b]; i < T; i++) for (let x = 0; x < H * D; x++) dO.bits[(b * T + i) * H * D + x] = 0;
  const dOv = fromBits(dtype, dO.bits);
  const seqlensK = Int32Array.from(c.lens, (l) => l - 1);
  const tokens = Uint8Array.from({ length: B * T }, (_, x) => (x % T < c.lens[Math.floor(x / T)] ? 1 : 0));
  return {
    shape: { batch: B, seqLen: T, numHeads: H, numKvHeads: KV, headDim: D, dtype },
    q: device.upload({ data: q.bits, dims: [B, T, H, D] }, dtype),
    k: device.upload({ data: k.bits, dims: [B, T, KV, D] }, dtype),
    v: device.upload({ data: v.bits, dims: [B, T, KV, D] }, dtype),
    dOut: device.upload({ data: dO.bits, dims: [B, T, H, D] }, dtype),
    seqlens: device.upload({ data: seqlensK, dims: [B] }),
    tokens: device.upload({ data: tokens, dims: [B, T, 1] }, 'bool'),
    host: { q: q.values, k: k.values, v: v.values, dOut: dOv, seqlensK },
  };
}

interface KernelOutputs {
  out: DeviceTensor;
  lse: DeviceTensor;
  delta: DeviceTensor;
  dqAcc: DeviceTensor;
  dq: DeviceTensor;
  dk: DeviceTensor;
  dv: DeviceTensor;
}

function kernelOutputs(device: Device, s: FlashAttentionShape): KernelOutputs {
  const { batch: B, seqLen: T, numHeads: H, numKvHeads: KV, headDim: D, dtype } = s;
  return {
    out: device.empty(dtype, [B, T, H, D]),
    lse: device.empty('float32', [B, H, T]),
    delta: device.empty('float32', [B, H, T]),
    dqAcc: device.empty('float32', [B, T, H, D]),
    dq: device.empty(dtype, [B, T, H, D]),
    dk: device.empty(dtype, [B, T, KV, D]),
    dv: device.empty(dtype, [B, T, KV, D]),
  };
}

/** What stands for the kernels: the kernels (GPU), or with --cpu the custom ops' host compute. */
interface KernelSide {
  run(x: Inputs, o: KernelOutputs, backward?: boolean): void;
  /** The backward after GroupQueryAttention's forward: the log-sum-exp pass, then the backward (GPU). */
  lseBackward?(x: Inputs, o: KernelOutputs): void;
  synchronize(): void;
  dispose(): void;
}

function gpuSide(kernels: Kernels, fa: FlashAttention): KernelSide {
  return {
    run: (x, o, backward = true) => {
      fa.forward(x.shape, { q: x.q, k: x.k, v: x.v, seqlensK: x.seqlens, out: o.out, lse: o.lse });
      if (backward) fa.backward(x.shape, { q: x.q, k: x.k, v: x.v, seqlensK: x.seqlens, out: o.out, lse: o.lse, dOut: x.dOut, delta: o.delta, dqAcc: o.dqAcc, dq: o.dq, dk: o.dk, dv: o.dv });
    },
    lseBackward: (x, o) => {
      fa.logSumExp(x.shape, { q: x.q, k: x.k, seqlensK: x.seqlens, lse: o.lse });
      fa.backward(x.shape, { q: x.q, k: x.k, v: x.v, seqlensK: x.seqlens, out: o.out, lse: o.lse, dOut: x.dOut, delta: o.delta, dqAcc: o.dqAcc, dq: o.dq, dk: o.dk, dv: o.dv });
    },
    synchronize: () => kernels.synchronize(),
    dispose: () => undefined,
  };
}

/** The attention ops in one session, as the decoder uses them: q, k, v, seqlens_k, tokens, dout → out, dq, dk, dv. */
function opSession(device: Device, ops: FlashAttentionOps, s: FlashAttentionShape, mode: FlashAttentionMode = 'kernels') {
  const { batch: B, seqLen: T, numHeads: H, numKvHeads: KV, headDim: D, dtype } = s;
  const g = new L.Graph('flash_op');
  const q = g.input('q', dtype, [B, T, H * D]);
  const k = g.input('k', dtype, [B, T, KV * D]);
  const v = g.input('v', dtype, [B, T, KV * D]);
  const attended = ops.attend({ query: q, key: k, value: v, seqlensK: g.input('seqlens_k', 'int32', [B]), totalSequenceLength: g.constant(T, 'int32', []) }, { numHeads: H, kvNumHeads: KV }, mode);
  const out = L.where(g.input('tokens', 'bool', [B, T, 1]), attended, g.constant(0, dtype, []));
  g.output(out, 'out');
  const [dq, dk, dv] = L.grad(out, [q, k, v], { seed: g.input('dout', dtype, [B, T, H * D]) });
  g.output(dq, 'dq');
  g.output(dk, 'dk');
  g.output(dv, 'dv');
  return device.compile(g, { customOpDomains: [ops.domain.handle] });
}

/** [B, S, heads, D] as [B, S, heads·D] (the same memory). */
function flatOf(t: DeviceTensor): DeviceTensor {
  const [B, S, n, D] = t.dims;
  return t.reshape([B, S, n * D]);
}

function bindOp(session: Session, x: Inputs): Binding {
  return session.binding().input('q', flatOf(x.q)).input('k', flatOf(x.k)).input('v', flatOf(x.v)).input('seqlens_k', x.seqlens).input('tokens', x.tokens).input('dout', flatOf(x.dOut));
}

function cpuSide(device: Device): KernelSide {
  const ops = flashAttentionOps('cpu');
  const sessions: { dispose(): void }[] = [];
  return {
    run: (x, o) => {
      const session = opSession(device, ops, x.shape);
      sessions.push(session);
      const b = bindOp(session, x);
      b.output('out', flatOf(o.out)).output('dq', flatOf(o.dq)).output('dk', flatOf(o.dk)).output('dv', flatOf(o.dv));
      b.runSync();
      ops.check();
      b.dispose();
    },
    synchronize: () => undefined,
    dispose: () => {
      for (const s of sessions.splice(0)) s.dispose();
      ops.dispose();
    },
  };
}

function bindComposed(device: Device, c: Case, x: Inputs, withGrad: boolean) {
  const { batch: B, seqLen: T, numHeads: H, numKvHeads: KV, headDim: D } = x.shape;
  const session = device.compile(composedGraph({ ...x.shape, dtype: c.dtype }, withGrad));
  const b = session.binding().input('q', x.q.reshape([B, T, H * D])).input('k', x.k.reshape([B, T, KV * D])).input('v', x.v.reshape([B, T, KV * D])).input('seqlens_k', x.seqlens).input('tokens', x.tokens);
  if (withGrad) b.input('dout', x.dOut.reshape([B, T, H * D]));
  for (const n of withGrad ? ['out', 'dq', 'dk', 'dv'] : ['out']) b.output(n, 'device');
  return { session, b };
}

function checkCase(side: KernelSide, device: Device, c: Case, python: string | undefined): boolean {
  const x = makeInputs(device, c, 17);
  const { batch: B, seqLen: T, numHeads: H, numKvHeads: KV, headDim: D } = x.shape;
  const o = kernelOutputs(device, x.shape);
  side.run(x, o);
  side.synchronize();
  const kernel = { o: download(o.out), dq: download(o.dq), dk: download(o.dk), dv: download(o.dv) };
  const { session, b } = bindComposed(device, c, x, true);
  b.runSync();
  const composed = { o: download(b.get('out')), dq: download(b.get('dq')), dk: download(b.get('dk')), dv: download(b.get('dv')) };
  // references: torch fp32 where there, host float64 for short cases
  const refs: Record<string, Record<'o' | 'dq' | 'dk' | 'dv', Float32Array>> = {};
  let torchVersion: unknown;
  if (python) {
    const dir = mkdtempSync(join(tmpdir(), 'lathe-flash-check-'));
    for (const [n, a] of [['q', x.host.q], ['k', x.host.k], ['v', x.host.v], ['do', x.host.dOut]] as const) writeFileSync(join(dir, `${n}.f32`), a);
    const r = runTorch(python, dir, { case: true, B, T, H, KV, D, lens: c.lens, dtype: c.dtype });
    torchVersion = r.torch;
    refs.torch_fp32 = { o: readF32(join(dir, 'torch_fp32_o.f32')), dq: readF32(join(dir, 'torch_fp32_dq.f32')), dk: readF32(join(dir, 'torch_fp32_dk.f32')), dv: readF32(join(dir, 'torch_fp32_dv.f32')) };
    refs.torch_half_as_candidate = { o: readF32(join(dir, 'torch_half_o.f32')), dq: readF32(join(dir, 'torch_half_dq.f32')), dk: readF32(join(dir, 'torch_half_dk.f32')), dv: readF32(join(dir, 'torch_half_dv.f32')) };
  }
  if (T <= HOST_REFERENCE_MAX_T) {
    const r = flashAttentionReference(x.shape, x.host);
    refs.host_f64 = { o: r.out, dq: r.dq!, dk: r.dk!, dv: r.dv! };
  }
  const validQ = (i: number) => Math.floor(i / (H * D)) % T < c.lens[Math.floor(i / (T * H * D))];
  const validK = (i: number) => Math.floor(i / (KV * D)) % T < c.lens[Math.floor(i / (T * KV * D))];
  const keepOf = { o: validQ, dq: validQ, dk: validK, dv: validK };
  const names = ['o', 'dq', 'dk', 'dv'] as const;
  const report: Record<string, unknown> = {};
  let ok = true;
  const failures: string[] = [];
  const reference = refs.torch_fp32 ?? refs.host_f64;
  for (const [refName, ref] of Object.entries(refs)) {
    if (refName === 'torch_half_as_candidate') continue;
    const rows: Record<string, unknown> = {};
    for (const n of names) {
      const k = compare(kernel[n], ref[n], keepOf[n]);
      const cmp = compare(composed[n], ref[n], keepOf[n]);
      const torchHalf = refs.torch_half_as_candidate ? compare(refs.torch_half_as_candidate[n], ref[n], keepOf[n]) : undefined;
      const bound = Math.max(2 * cmp.rel, 2e-2);
      const pass = k.finite && k.rel <= bound;
      if (!pass) failures.push(`${refName}/${n}: kernel rel ${k.rel} > ${bound.toPrecision(3)}`);
      ok &&= pass;
      rows[n] = { kernel: k, composed: cmp, ...(torchHalf ? { torch_half: torchHalf } : {}), bound: +bound.toPrecision(3), pass };
    }
    report[`vs_${refName}`] = rows;
  }
  if (!reference) {
    // no fp32 reference: the kernels against the composed path only
    const rows: Record<string, unknown> = {};
    for (const n of names) {
      const k = compare(kernel[n], composed[n], keepOf[n]);
      const pass = k.finite && k.rel <= 4e-2;
      if (!pass) failures.push(`composed/${n}: kernel rel ${k.rel} > 4e-2`);
      ok &&= pass;
      rows[n] = { kernel: k, pass };
    }
    report.vs_composed = rows;
  }
  // padding: rows past a row's length (out, dq) and keys past it (dk, dv) exactly 0
  const padNonzero = names.map((n) => kernel[n].reduce((cnt, val, i) => cnt + (!keepOf[n](i) && val !== 0 ? 1 : 0), 0));
  const padOk = padNonzero.every((z) => z === 0);
  if (!padOk) failures.push(`padding not zero: ${names.map((n, i) => `${n} ${padNonzero[i]}`).join(', ')}`);
  ok &&= padOk;
  console.log(JSON.stringify({ phase: 'check', case: c.name, shape: { ...x.shape, lens: c.lens }, torch: torchVersion ?? null, ...report, padding_nonzero: Object.fromEntries(names.map((n, i) => [n, padNonzero[i]])), ok, failures }));
  b.dispose();
  session.dispose();
  for (const t of [...Object.values(o), x.q, x.k, x.v, x.dOut, x.seqlens, x.tokens]) t.dispose();
  return ok;
}

/** The kernels as custom ops in one session (the decoder's opt-in path) against the direct launches. */
function opPhase(side: KernelSide, device: Device, c: Case, fa: FlashAttention | undefined): boolean {
  const x = makeInputs(device, c, 29);
  const o = kernelOutputs(device, x.shape);
  side.run(x, o);
  side.synchronize();
  const direct = { out: download(o.out), dq: download(o.dq), dk: download(o.dk), dv: download(o.dv) };
  const ops = flashAttentionOps(device.kind, fa);
  let ok = true;
  for (const mode of ['kernels', 'backward'] as const) {
    const session = opSession(device, ops, x.shape, mode);
    const b = bindOp(session, x);
    for (const n of ['out', 'dq', 'dk', 'dv']) b.output(n, 'device');
    b.runSync();
    ops.check();
    const viaOp = { out: download(b.get('out')), dq: download(b.get('dq')), dk: download(b.get('dk')), dv: download(b.get('dv')) };
    const diff = Object.fromEntries((['out', 'dq', 'dk', 'dv'] as const).map((n) => [n, compare(viaOp[n], direct[n], () => true)]));
    // kernels: the same launches (dq sums key tiles by atomicAdd in any order: equal to rounding, the
    // rest bitwise); backward: GroupQueryAttention's own output feeds D, so all within rounding
    const modeOk = Object.entries(diff).every(([n, d]) => d.finite && (mode === 'kernels' && n !== 'dq' ? d.max_err === 0 : d.rel <= 2e-2));
    console.log(JSON.stringify({ phase: 'op', mode, case: c.name, diff, ok: modeOk }));
    ok &&= modeOk;
    b.dispose();
    session.dispose();
  }
  ops.dispose();
  for (const t of [...Object.values(o), x.q, x.k, x.v, x.dOut, x.seqlens, x.tokens]) t.dispose();
  return ok;
}

function timePhase(kernels: Kernels, device: Device, side: KernelSide, python: string | undefined): void {
  const reps = Number(arg('reps', '20'));
  const c: Case = { name: 'qwen3_0.6b_8x1024', batch: 8, seqLen: 1024, numHeads: 16, numKvHeads: 8, headDim: 128, dtype: 'bfloat16', lens: Array<number>(8).fill(1024) };
  const x = makeInputs(device, c, 41);
  const o = kernelOutputs(device, x.shape);
  const time = (fn: () => void) => {
    for (let r = 0; r < 3; r++) fn();
    kernels.synchronize();
    return kernels.time(() => {
      for (let r = 0; r < reps; r++) fn();
    }) / reps;
  };
  const kernelFwd = time(() => side.run(x, o, false));
  const kernelBoth = time(() => side.run(x, o));
  const fwd = bindComposed(device, c, x, false);
  const composedFwd = time(() => fwd.b.runSync({ synchronize: false }));
  const both = bindComposed(device, c, x, true);
  const composedBoth = time(() => both.b.runSync({ synchronize: false }));
  // GroupQueryAttention's forward (ORT's flash kernel) with the kernels' backward (the log-sum-exp pass first)
  const hybridBoth = side.lseBackward
    ? time(() => {
        fwd.b.runSync({ synchronize: false });
        side.lseBackward!(x, o);
      })
    : NaN;
  let torch: unknown = null;
  if (python) {
    const dir = mkdtempSync(join(tmpdir(), 'lathe-flash-time-'));
    torch = (runTorch(python, dir, { time: true, B: c.batch, T: c.seqLen, H: c.numHeads, KV: c.numKvHeads, D: c.headDim, reps }) as { time: unknown }).time;
  }
  const r3 = (v: number) => +v.toFixed(3);
  // causal matmul work: the forward's two products over the S·(S+1)/2 visible pairs, the backward's five
  const fwdFlop = 4 * c.batch * c.numHeads * c.headDim * ((c.seqLen * (c.seqLen + 1)) / 2);
  const tflops = (flop: number, ms: number) => +(flop / (ms * 1e9)).toFixed(1);
  console.log(
    JSON.stringify({
      phase: 'time',
      shape: x.shape,
      reps,
      ms_per_layer: {
        kernel_fwd: r3(kernelFwd),
        kernel_fwd_bwd: r3(kernelBoth),
        kernel_bwd: r3(kernelBoth - kernelFwd),
        composed_fwd: r3(composedFwd),
        composed_fwd_bwd: r3(composedBoth),
        composed_bwd: r3(composedBoth - composedFwd),
        gqa_fwd_kernel_bwd: r3(hybridBoth),
      },
      speedup_fwd_bwd: { kernels: +(composedBoth / kernelBoth).toFixed(2), gqa_fwd_kernel_bwd: +(composedBoth / hybridBoth).toFixed(2) },
      speedup_fwd: +(composedFwd / kernelFwd).toFixed(2),
      tflops: { kernel_fwd: tflops(fwdFlop, kernelFwd), kernel_bwd: tflops(2.5 * fwdFlop, kernelBoth - kernelFwd), composed_fwd: tflops(fwdFlop, composedFwd) },
      torch_sdpa_ms: torch,
    }),
  );
  for (const s of [fwd, both]) {
    s.b.dispose();
    s.session.dispose();
  }
  for (const t of [...Object.values(o), x.q, x.k, x.v, x.dOut, x.seqlens, x.tokens]) t.dispose();
}

/**
 * sftLoss with flash attention (all tokens right-padded rows, full loss mask) with the decoder's
 * attention through `kernel`: the same loss as `sftLoss(cfg, { compute, flashAttention: true })`
 * for a batch whose loss_mask is attention_mask.
 */
function kernelSftLoss(cfg: DecoderConfig, compute: 'float32' | 'bfloat16', kernel: NonNullable<FlashAttentionInputs['kernel']>): LossBuilder {
  return (g, params) => {
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    const attention = g.input('attention_mask', 'int64', ['B', 'T']);
    const lossMask = g.input('loss_mask', 'int64', ['B', 'T']);
    const normaliser = g.input('loss_tokens', 'float32', []);
    const w = castWeights(params, compute);
    const rows = rightPaddedAttention(attention, totalLength(g, ids));
    const { hidden } = decoder(cfg, w, { inputIds: ids, positionIds: positionsFromPadding(attention), attentionMask: paddedCausalMask(attention), flashAttention: { ...rows, kernel } });
    const logp = chunkedTargetLogprobs(cfg, w, hidden, shiftLeft(ids), {});
    // position t predicts token t + 1: weighted by loss_mask[t + 1], the wrapped last column by 0
    const predicted = L.mul(shiftLeft(lossMask), L.concat([L.slice(L.add(L.mul(lossMask, 0), 1), [1], [0], [-1]), L.mul(L.slice(lossMask, [1], [0], [1]), 0)], 1));
    const nllSum = L.neg(L.reduceSum(L.mul(logp, L.cast(predicted, 'float32'))));
    return { loss: L.div(nllSum, normaliser), metrics: { token_nll_sum: nllSum } };
  };
}

/** Full SFT steps with sftLoss's flash attention (GroupQueryAttention, composed backward) and with the kernels, same init and batch. */
function sftPhase(device: Device, hf: HfConfig, ops: FlashAttentionOps, o: { batch: [number, number]; steps: number; compute: 'float32' | 'bfloat16'; mode: FlashAttentionMode }): boolean {
  const [B, T] = o.batch;
  const model = CausalLM.random(hf, { seed: 1, std: 0.02 });
  const params = trainedParams(hf).map((p) => ({ name: p.name, shape: p.shape, decay: p.decay }));
  const weights = model.float32Weights();
  const vocab = model.config.vocabSize;
  const ids = BigInt64Array.from({ length: B * T }, (_, i) => BigInt((i * 7919 + 13) % vocab));
  // one row shorter than the batch (right padding) where there are two rows
  const mask = BigInt64Array.from({ length: B * T }, (_, i) => (B > 1 && Math.floor(i / T) === 1 && i % T >= T - T / 4 ? 0n : 1n));
  const tokens = mask.reduce((a, m) => a + Number(m), 0);
  const batch = {
    input_ids: device.upload({ data: ids, dims: [B, T] }),
    attention_mask: device.upload({ data: mask, dims: [B, T] }),
    loss_mask: device.upload({ data: mask, dims: [B, T] }),
    loss_tokens: { data: Float32Array.of(tokens - B), dims: [] },
    [TOTAL_LENGTH_INPUT]: totalLengthTensor(T),
  };
  const optimizer = { weightDecay: 0.01, maxGradNorm: 1 };
  const runs: Record<string, { losses: number[]; grad_norms: number[]; step_ms: number[]; tokens_per_s_best: number }> = {};
  const kernel: NonNullable<FlashAttentionInputs['kernel']> = (x, heads) => ops.attend(x, heads, o.mode);
  for (const path of ['composed', 'kernel'] as const) {
    const loss = path === 'composed' ? sftLoss(model.config, { compute: o.compute, flashAttention: true }) : kernelSftLoss(model.config, o.compute, kernel);
    const trainer = Trainer.create({ params, loss, optimizer }, { params: weights }, { device, ...(path === 'kernel' ? { session: { customOpDomains: [ops.domain.handle] } } : {}) });
    const r = { losses: [] as number[], grad_norms: [] as number[], step_ms: [] as number[], tokens_per_s_best: 0 };
    for (let s = 0; s < o.steps; s++) {
      const t0 = performance.now();
      const out = trainer.trainStep([batch], 1e-5);
      ops.check();
      r.step_ms.push(+(performance.now() - t0).toFixed(1));
      r.losses.push(out.loss);
      r.grad_norms.push(out.gradNorm);
    }
    trainer.dispose();
    r.tokens_per_s_best = Math.round((B * T) / (Math.min(...r.step_ms.slice(o.steps > 1 ? 1 : 0)) / 1000));
    runs[path] = r;
  }
  // the same model, batch and update: losses agree to the compute dtype's rounding
  const tol = o.compute === 'float32' ? 1e-4 : 2e-2;
  const worst = Math.max(...runs.composed.losses.map((l, i) => Math.abs(l - runs.kernel.losses[i]) / Math.abs(l)));
  const ok = runs.kernel.losses.every(Number.isFinite) && worst <= tol;
  console.log(JSON.stringify({ phase: 'sft', mode: o.mode, batch: [B, T], compute: o.compute, ...runs, speedup: +(runs.kernel.tokens_per_s_best / runs.composed.tokens_per_s_best).toFixed(3), max_rel_loss_diff: +worst.toPrecision(3), ok }));
  for (const t of [batch.input_ids, batch.attention_mask, batch.loss_mask]) t.dispose();
  return ok;
}

const TINY: HfConfig = { architectures: ['Qwen3ForCausalLM'], vocab_size: 512, hidden_size: 64, intermediate_size: 192, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 1024, tie_word_embeddings: true };

const CPU_CASES: Case[] = [
  { name: 'cpu_b2_t40_ragged', batch: 2, seqLen: 40, numHeads: 4, numKvHeads: 2, headDim: 64, dtype: 'float32', lens: [40, 17] },
  { name: 'cpu_b3_t20_len1', batch: 3, seqLen: 20, numHeads: 4, numKvHeads: 1, headDim: 64, dtype: 'float32', lens: [1, 20, 9] },
];

function main(): boolean {
  const cpu = flag('cpu');
  const phases = arg('phases', cpu ? 'check,op,sft' : 'compile,check,op,time,sft').split(',');
  for (const p of phases) if (!['compile', 'check', 'op', 'time', 'sft'].includes(p)) throw new Error(`--phases: unknown phase '${p}' (compile, check, op, time, sft)`);
  if (cpu && phases.some((p) => p === 'compile' || p === 'time')) throw new Error('--cpu runs the check, op and sft phases only (no kernels to compile or time on the CPU)');
  const modes = arg('mode', 'backward').split(',') as FlashAttentionMode[];
  for (const m of modes) if (m !== 'backward' && m !== 'kernels') throw new Error(`--mode: unknown mode '${m}' (backward, kernels)`);
  let ok = true;
  if (cpu) {
    const device = Device.cpu();
    const side = cpuSide(device);
    if (phases.includes('check')) for (const c of CPU_CASES) ok = checkCase(side, device, c, undefined) && ok;
    if (phases.includes('op')) ok = opPhase(side, device, CPU_CASES[0], undefined) && ok;
    if (phases.includes('sft')) {
      const ops = flashAttentionOps('cpu');
      for (const mode of modes) ok = sftPhase(device, TINY, ops, { batch: [2, 16], steps: 2, compute: 'float32', mode }) && ok;
      ops.dispose();
    }
    side.dispose();
  } else {
    const { kernels, device } = Kernels.withDevice();
    const fa = compilePhase(kernels, (includeDir) => FlashAttention.compile(kernels, { includeDir }));
    const side = gpuSide(kernels, fa);
    const python = pythonPath();
    const names = arg('cases', CASES.map((c) => c.name).join(',')).split(',');
    const unknown = names.filter((n) => !CASES.some((c) => c.name === n));
    if (unknown.length) throw new Error(`--cases: unknown case(s) ${unknown.join(', ')} (${CASES.map((c) => c.name).join(', ')})`);
    if (phases.includes('check')) for (const c of CASES.filter((x) => names.includes(x.name))) ok = checkCase(side, device, c, python) && ok;
    if (phases.includes('op')) ok = opPhase(side, device, CASES[0], fa) && ok;
    if (phases.includes('time')) timePhase(kernels, device, side, python);
    if (phases.includes('sft')) {
      const ops = flashAttentionOps('cuda', fa);
      const [B, T] = arg('batch', '8x1024').split('x').map(Number);
      const compute = arg('compute', 'bfloat16') as 'float32' | 'bfloat16';
      for (const mode of modes) ok = sftPhase(device, QWEN3_0_6B, ops, { batch: [B, T], steps: Number(arg('steps', '4')), compute, mode }) && ok;
      ops.dispose();
    }
    kernels.dispose();
  }
  return ok;
}

runCheck(main);

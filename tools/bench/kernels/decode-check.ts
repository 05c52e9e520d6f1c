/**
 * Lathe's decode-attention kernels checked and timed on the GPU (issue 37, item 4). Phases, one JSON
 * line each:
 * - compile: NVRTC build of the module (ms, cold or cached).
 * - check (per case × cache native | float8e4m3): one decode step on random caches with ragged row
 *   lengths — the op (append with QK-norm and RoPE, split-KV, merge) and GroupQueryAttention (ORT, the
 *   KV engine's settings: in-kernel rotary and QK-norm on CUDA) in one session, each on its own copy of
 *   the cache bound in place — against attention on the host in float64 (the op's reference with the
 *   dtype's roundings, from the same inputs), and the op built with the combine folded into the split
 *   (`combine: 'fused'`) on a third copy: its output must equal the op's bit for bit. Relative errors (max abs / max |reference|) of the output,
 *   and of the new cache entry against GroupQueryAttention's. A native case passes when the op's error
 *   is at most max(2 × GroupQueryAttention's, 1e-2) and op vs GroupQueryAttention ≤ 2e-2; an e4m3 case
 *   when it matches its own e4m3-rounded reference as tightly and its output is within 1/8 of the bf16 reference — else exit code 1.
 * - time: batch 256, Qwen3-0.6B heads (16/8, 128; --heads H,KV for others), cache length 1024, every row at each --lengths:
 *   the kernels' device ms per layer (kernel_bf16, kernel_fp8; direct launches; events on the stream;
 *   every kernel warmed at every length before the first timing, then timed in one fixed order; the
 *   split, append and combine also timed alone; the fused step — append + the split with the combine
 *   folded in — as fused_ms and its split as fused_split_ms), achieved GB/s over the bytes the step must read (K and
 *   V of every row's positions, plus scales for e4m3), and GroupQueryAttention and the op as one-node
 *   sessions on the same stream. --lengths (default 1,256,512,768; 1 shows a step's fixed cost).
 * - generate: end-to-end KV-engine generation at --rows 256 ragged prompts of 128–256 tokens + --new
 *   512 (greedy, CUDA graphs), engines gqa | kernel | kernel+fp8 in this one process (and the A/B
 *   variants: gqa-unfused, kernel+fp8-unfused without the residual-norm fusion; gqa+swiglu,
 *   kernel+fp8+swiglu with the SwiGLU kernel in the decode step; gqa+concat, kernel+fp8+concat with
 *   q/k/v and gate/up as one MatMul each; gqa+bf16res, kernel+fp8+bf16res with the residual stream in
 *   bf16; gqa+pick, kernel+fp8+all+pick with the greedy-pick kernel choosing the tokens; +fc on a kernel
 *   engine: the decode-attention op with the combine folded into the split): tok/s, decode
 *   step ms, and agreement of each engine's tokens with gqa's (rows identical, mean first divergence),
 *   and of a +pick engine's with the same engine without +pick when that one ran earlier in the list.
 * - pick: the greedy-pick kernel against the composed greedy path it replaces (sampleNext at
 *   temperature 0: Cast, firstArgMax, LogSoftmax, gather) on random bf16 logits [256, 151936] with
 *   ties (injected maxima at several places a row, an all-equal row, and bf16's own ties), and both
 *   against the host's float64 rule: tokens equal, log-prob max abs difference (fails over 1e-4), and
 *   µs a call of the kernel (direct launches), the op as a one-node session and the composed session.
 * - kl: the KL(bf16 cache ‖ e4m3 cache) of next-token distributions: --kl-rows prompts prefilled once,
 *   both caches fed the bf16 path's greedy tokens for --kl-steps steps in one graph (two decoders over
 *   the two caches, the KL per row computed in the graph): mean, p99 and max KL (nats) and the top-1
 *   agreement. With random weights (no --model) the distributions are near-flat and the KL tiny: pass
 *   --model DIR (a Qwen3 folder) for a meaningful number.
 *
 * - sweep: the split kernel's tuning sweep (see sweepPhase): variants over loads issued together (2, 4,
 *   8), chunk (e4m3 128/256/512, bf16 64/128/256), elements a thread (e4m3 8, 16; bf16 8) and a
 *   `__launch_bounds__` minimum of CTAs an SM (none, 4, 8), built in modules of their own, at 256 rows,
 *   heads 16/8 and 32/8 of 128, --lengths (default 256,512,768,2048 here) over a cache of 2048: one
 *   line a variant (ms, GB/s, vs_default, its float32 output against the default variant's ≤ 1e-3),
 *   then sweep_best per (cache, G, length). CUDA only. --sweep-groups 2,4 and --sweep-caches
 *   native,float8e4m3 (the defaults) narrow it.
 *
 * --cpu: a smoke test of this script on the CPU (float32, a tiny model and tiny cases, the ops' host
 * compute in place of the kernels, no time phase): it checks the script, not the kernels.
 *
 * usage: node .bundle/decode-check.js [--phases compile,check,time,generate,kl,sweep] [--reps 20] [--lengths 1,256,512,768] [--heads 16,8] [--model DIR]
 *          [--rows 256] [--new 512] [--engines gqa,kernel,kernel+fp8 (a base gqa | gqa-unfused | kernel | kernel+fp8 | kernel+fp8-unfused, then any of +swiglu +concat +bf16res +all +pick +fc)] [--kl-rows 32] [--kl-steps 128] [--cpu]
 *        (phases also: pick)
 */
import * as L from '@lathe/onnx';
import { type DType, type Tensor } from '@lathe/onnx';
import { CausalLM, lmLogits, weightInputs, type DecoderConfig, type HfConfig, type KvPair } from '@lathe/models';
import { addKvPrefill, cacheName, KvCacheGenerator, kvKernelDecoder, sampleNext, type Completion, type KvCacheGeneratorOptions } from '@lathe/rollout';
import {
  cudaIncludeDir,
  DecodeAttention,
  decodeAttentionOps,
  decodeAttentionReference,
  decodeChunks,
  decodeSplitDefaultVariant,
  decodeSplitSmem,
  decodeSplitSweepSource,
  decodeSplitSweepVariants,
  decodeSweepCombineName,
  decodeSweepKernelName,
  DECODE_GROUPS,
  DECODE_SWEEP_SPACE,
  DECODE_THREADS,
  e4m3Decode,
  sameDecodeSplitVariant,
  GreedyPickKernels,
  greedyPickOps,
  greedyPickReference,
  Kernels,
  quantizeE4m3Reference,
  SwigluKernels,
  swigluOps,
  type DecodeAttentionOps,
  type DecodeAttentionShape,
  type DecodeCombine,
  type DecodeStepPart,
  type DecodeSplitVariant,
  type GreedyPickOps,
  type KernelModule,
  type SwigluOps,
} from '@lathe/kernels';
import { Device, fromBfloat16Bits, fromFloat16Bits, hostTensor, toBfloat16Bits, toFloat16Bits, type DeviceTensor } from '@lathe/runtime';
import { arg, flag } from '../argv';
import { phasesOf } from './common';
import { QWEN3_0_6B } from '../shapes';

type Dt = 'bfloat16' | 'float16' | 'float32';
type CacheKind = 'native' | 'float8e4m3';

interface Case {
  name: string;
  rows: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  maxLength: number;
  dtype: Dt;
  /** Each row's length after the step (the new token at length − 1). */
  lens: number[];
}

const CASES: Case[] = [
  { name: 'r4_m300_ragged', rows: 4, numHeads: 16, numKvHeads: 8, headDim: 128, maxLength: 300, dtype: 'bfloat16', lens: [300, 129, 128, 1] },
  { name: 'r3_m1024', rows: 3, numHeads: 16, numKvHeads: 8, headDim: 128, maxLength: 1024, dtype: 'bfloat16', lens: [1024, 700, 513] },
  { name: 'r2_hd64_g4', rows: 2, numHeads: 8, numKvHeads: 2, headDim: 64, maxLength: 256, dtype: 'bfloat16', lens: [256, 77] },
  { name: 'r4_m600_g4_256s', rows: 4, numHeads: 32, numKvHeads: 8, headDim: 128, maxLength: 600, dtype: 'bfloat16', lens: [600, 257, 256, 512] },
  { name: 'r2_fp16_g1', rows: 2, numHeads: 8, numKvHeads: 8, headDim: 128, maxLength: 200, dtype: 'float16', lens: [200, 3] },
  // groups that are not a power of two: Qwen3-14B's 40/8 (G 5), Qwen2.5-7B's 28/4 (G 7), G 3 and G 6 (the e4m3 plan's 8 elements a thread past G 4)
  { name: 'r3_m600_g5_40x8', rows: 3, numHeads: 40, numKvHeads: 8, headDim: 128, maxLength: 600, dtype: 'bfloat16', lens: [600, 257, 1] },
  { name: 'r3_m300_g7_28x4', rows: 3, numHeads: 28, numKvHeads: 4, headDim: 128, maxLength: 300, dtype: 'bfloat16', lens: [300, 128, 77] },
  { name: 'r2_m300_g3_12x4', rows: 2, numHeads: 12, numKvHeads: 4, headDim: 128, maxLength: 300, dtype: 'bfloat16', lens: [300, 129] },
  { name: 'r2_hd64_g6_fp16', rows: 2, numHeads: 12, numKvHeads: 2, headDim: 64, maxLength: 256, dtype: 'float16', lens: [256, 5] },
];
const CPU_CASES: Case[] = [
  { name: 'cpu_tiny', rows: 3, numHeads: 4, numKvHeads: 2, headDim: 16, maxLength: 40, dtype: 'float32', lens: [40, 7, 1] },
  { name: 'cpu_g3', rows: 2, numHeads: 3, numKvHeads: 1, headDim: 16, maxLength: 40, dtype: 'float32', lens: [33, 1] },
  { name: 'cpu_g5', rows: 2, numHeads: 10, numKvHeads: 2, headDim: 16, maxLength: 40, dtype: 'float32', lens: [40, 3] },
  { name: 'cpu_g7', rows: 2, numHeads: 7, numKvHeads: 1, headDim: 16, maxLength: 40, dtype: 'float32', lens: [40, 17] },
];

/** A tiny Qwen3 for --cpu (GroupQueryAttention's rotary needs head_dim ≥ 16). */
const TINY: HfConfig = { ...QWEN3_0_6B, vocab_size: 64, hidden_size: 64, intermediate_size: 96, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, max_position_embeddings: 256 };

const EPS = 1e-6;
const THETA = 1e6;

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

/** Values as the dtype holds them (rounded), its bits for upload, and a rounding function. */
function half(dt: Dt) {
  const bits = (x: Float32Array) => (dt === 'bfloat16' ? toBfloat16Bits(x) : dt === 'float16' ? toFloat16Bits(x) : x);
  const back = (b: Uint16Array | Float32Array) => (dt === 'bfloat16' ? fromBfloat16Bits(b as Uint16Array) : dt === 'float16' ? fromFloat16Bits(b as Uint16Array) : (b as Float32Array));
  const round = (x: Float32Array) => back(bits(x));
  const one = (v: number) => round(Float32Array.of(v))[0];
  return { bits, back, round, one };
}

function relErr(got: Float32Array, ref: Float32Array, keep: (i: number) => boolean = () => true): { rel: number; max_err: number; max_ref: number; finite: boolean } {
  let err = 0;
  let mx = 0;
  let finite = true;
  for (let i = 0; i < ref.length; i++) {
    if (!keep(i)) continue;
    if (!Number.isFinite(got[i])) finite = false;
    err = Math.max(err, Math.abs(got[i] - ref[i]));
    mx = Math.max(mx, Math.abs(ref[i]));
  }
  return { rel: +(err / Math.max(mx, 1e-30)).toExponential(3), max_err: +err.toExponential(3), max_ref: +mx.toFixed(4), finite };
}

function download(t: DeviceTensor, dt: Dt): Float32Array {
  const d = t.download().data;
  return dt === 'float32' ? (d as Float32Array) : half(dt).back(d as Uint16Array);
}

/** cos/sin [P, D/2] of Qwen3's default RoPE. */
function ropeTables(P: number, D: number): { cos: Float32Array; sin: Float32Array } {
  const h = D / 2;
  const cos = new Float32Array(P * h);
  const sin = new Float32Array(P * h);
  for (let p = 0; p < P; p++) {
    for (let i = 0; i < h; i++) {
      const a = Math.fround(p * Math.fround(1 / THETA ** ((2 * i) / D)));
      cos[p * h + i] = Math.cos(a);
      sin[p * h + i] = Math.sin(a);
    }
  }
  return { cos, sin };
}

/** One check case: the op and GroupQueryAttention in one session, each over its own cache bound in place. */
function checkCase(device: Device, ops: Record<CacheKind, DecodeAttentionOps>, fused: Record<CacheKind, DecodeAttentionOps>, c: Case, cache: CacheKind): boolean {
  const { rows: R, numHeads: H, numKvHeads: KV, headDim: D, maxLength: M, dtype: dt } = c;
  const fp8 = cache === 'float8e4m3';
  const h = half(dt);
  const rand = rng(7 + R * 31 + M);
  const gen = (n: number, amp: number, off = 0) => h.round(Float32Array.from({ length: n }, () => off + amp * (2 * rand() - 1)));
  const q = gen(R * H * D, 2);
  const k = gen(R * KV * D, 2);
  const v = gen(R * KV * D, 1);
  const qn = gen(D, 0.5, 1);
  const kn = gen(D, 0.5, 1);
  const cacheK = gen(R * KV * M * D, 2);
  const cacheV = gen(R * KV * M * D, 1);
  const rope = ropeTables(M, D);
  const cos = h.round(rope.cos);
  const sin = h.round(rope.sin);
  const seqlens = Int32Array.from(c.lens, (l) => l - 1);
  const qk = fp8 ? quantizeE4m3Reference(cacheK, D) : undefined;
  const qv = fp8 ? quantizeE4m3Reference(cacheV, D) : undefined;

  // The host reference (float64, the dtype's roundings) over the op's cache: bf16 values or e4m3 bytes.
  const shape: DecodeAttentionShape = { rows: R, numHeads: H, numKvHeads: KV, headDim: D, maxLength: M, dtype: dt, cache };
  const roundOne = dt === 'float32' ? Math.fround : h.one;
  const ref = decodeAttentionReference(
    shape,
    { q, k, v, cacheK: fp8 ? qk!.data.slice() : cacheK.slice(), cacheV: fp8 ? qv!.data.slice() : cacheV.slice(), kScale: qk?.scale.slice(), vScale: qv?.scale.slice(), seqlens, cos, sin, qNorm: qn, kNorm: kn, epsilon: EPS },
    roundOne,
  );
  // …and over the bf16 cache (what an e4m3 case is measured against).
  const refNative = fp8 ? decodeAttentionReference({ ...shape, cache: 'native' }, { q, k, v, cacheK: cacheK.slice(), cacheV: cacheV.slice(), seqlens, cos, sin, qNorm: qn, kNorm: kn, epsilon: EPS }, roundOne) : ref;

  const g = new L.Graph('decode_check');
  const cacheShape = [R, KV, M, D];
  const inp = {
    q: g.input('q', dt, [R, 1, H * D]),
    k: g.input('k', dt, [R, 1, KV * D]),
    v: g.input('v', dt, [R, 1, KV * D]),
    seqlens: g.input('seqlens', 'int32', [R]),
    total: g.input('total', 'int32', []),
    cos: g.input('cos', dt, [M, D / 2]),
    sin: g.input('sin', dt, [M, D / 2]),
    qn: g.input('qn', dt, [D]),
    kn: g.input('kn', dt, [D]),
    gk: g.input('gqa_k', dt, cacheShape),
    gv: g.input('gqa_v', dt, cacheShape),
    ok: g.input('op_k', fp8 ? 'uint8' : dt, cacheShape),
    ov: g.input('op_v', fp8 ? 'uint8' : dt, cacheShape),
    ks: fp8 ? g.input('op_ks', 'float32', [R, KV, M]) : undefined,
    vs: fp8 ? g.input('op_vs', 'float32', [R, KV, M]) : undefined,
    fk: g.input('fc_k', fp8 ? 'uint8' : dt, cacheShape),
    fv: g.input('fc_v', fp8 ? 'uint8' : dt, cacheShape),
    fks: fp8 ? g.input('fc_ks', 'float32', [R, KV, M]) : undefined,
    fvs: fp8 ? g.input('fc_vs', 'float32', [R, KV, M]) : undefined,
  };
  const heads = { numHeads: H, kvNumHeads: KV };
  const cuda = device.kind === 'cuda';
  // GroupQueryAttention as the engine runs it: QK-norm inside the kernel on CUDA; ORT's CPU kernel takes none, so nodes there.
  const norm = (t: Tensor, w: Tensor, n: number) => L.reshape(L.simplifiedLayerNorm(L.reshape(t, [R, 1, n, D]), w, EPS), [R, 1, n * D]);
  const gqa = L.groupQueryAttention(
    {
      query: cuda ? inp.q : norm(inp.q, inp.qn, H),
      key: cuda ? inp.k : norm(inp.k, inp.kn, KV),
      value: inp.v,
      past: { key: inp.gk, value: inp.gv },
      seqlensK: inp.seqlens,
      totalSequenceLength: inp.total,
      rotary: { cos: inp.cos, sin: inp.sin },
      ...(cuda ? { qkNorm: { q: inp.qn, k: inp.kn, epsilon: EPS } } : {}),
    },
    heads,
  );
  const op = ops[cache].attend(
    { query: inp.q, key: inp.k, value: inp.v, cacheKey: inp.ok, cacheValue: inp.ov, keyScale: inp.ks, valueScale: inp.vs, seqlens: inp.seqlens, rotary: { cos: inp.cos, sin: inp.sin }, qkNorm: { q: inp.qn, k: inp.kn } },
    heads,
  );
  // The fused combine's op on its own copy of the op's cache (the append writes in place).
  const fc = fused[cache].attend(
    { query: inp.q, key: inp.k, value: inp.v, cacheKey: inp.fk, cacheValue: inp.fv, keyScale: inp.fks, valueScale: inp.fvs, seqlens: inp.seqlens, rotary: { cos: inp.cos, sin: inp.sin }, qkNorm: { q: inp.qn, k: inp.kn } },
    heads,
  );
  // each attention's output and presents as `<name>_out`, `_pk`, `_pv` (and the e4m3 scales `_pks`, `_pvs`)
  const outputs = (name: string, r: { output: Tensor; presentKey: Tensor; presentValue: Tensor; presentKeyScale?: Tensor; presentValueScale?: Tensor }) => {
    g.output(r.output, `${name}_out`);
    g.output(r.presentKey, `${name}_pk`);
    g.output(r.presentValue, `${name}_pv`);
    if (r.presentKeyScale) g.output(r.presentKeyScale, `${name}_pks`);
    if (r.presentValueScale) g.output(r.presentValueScale, `${name}_pvs`);
  };
  outputs('fc', fc);
  outputs('gqa', gqa);
  outputs('op', op);
  const session = device.compile(g, { customOpDomains: [ops.native.domain.handle, ops.float8e4m3.domain.handle, fused.native.domain.handle, fused.float8e4m3.domain.handle] });
  const up = (x: Float32Array, dims: number[]) => device.upload({ data: h.bits(x), dims }, dt);
  const t = {
    gk: up(cacheK, cacheShape),
    gv: up(cacheV, cacheShape),
    ok: fp8 ? device.upload({ data: qk!.data, dims: cacheShape }, 'uint8') : up(cacheK, cacheShape),
    ov: fp8 ? device.upload({ data: qv!.data, dims: cacheShape }, 'uint8') : up(cacheV, cacheShape),
    ks: fp8 ? device.upload({ data: qk!.scale, dims: [R, KV, M] }) : undefined,
    vs: fp8 ? device.upload({ data: qv!.scale, dims: [R, KV, M] }) : undefined,
    fk: fp8 ? device.upload({ data: qk!.data, dims: cacheShape }, 'uint8') : up(cacheK, cacheShape),
    fv: fp8 ? device.upload({ data: qv!.data, dims: cacheShape }, 'uint8') : up(cacheV, cacheShape),
    fks: fp8 ? device.upload({ data: qk!.scale, dims: [R, KV, M] }) : undefined,
    fvs: fp8 ? device.upload({ data: qv!.scale, dims: [R, KV, M] }) : undefined,
    out: { gqa: device.empty(dt, [R, 1, H * D]), op: device.empty(dt, [R, 1, H * D]), fc: device.empty(dt, [R, 1, H * D]) },
  };
  const b = session.binding();
  const ins = { q: up(q, [R, 1, H * D]), k: up(k, [R, 1, KV * D]), v: up(v, [R, 1, KV * D]), seqlens: device.upload({ data: seqlens, dims: [R] }), cos: up(cos, [M, D / 2]), sin: up(sin, [M, D / 2]), qn: up(qn, [D]), kn: up(kn, [D]) };
  for (const [name, x] of Object.entries(ins)) b.input(name, x);
  b.input('total', hostTensor('int32', [], [M]));
  b.input('gqa_k', t.gk).input('gqa_v', t.gv).input('op_k', t.ok).input('op_v', t.ov);
  b.output('gqa_pk', t.gk).output('gqa_pv', t.gv).output('op_pk', t.ok).output('op_pv', t.ov).output('gqa_out', t.out.gqa).output('op_out', t.out.op);
  if (fp8) b.input('op_ks', t.ks!).input('op_vs', t.vs!).output('op_pks', t.ks!).output('op_pvs', t.vs!);
  b.input('fc_k', t.fk).input('fc_v', t.fv).output('fc_pk', t.fk).output('fc_pv', t.fv).output('fc_out', t.out.fc);
  if (fp8) b.input('fc_ks', t.fks!).input('fc_vs', t.fvs!).output('fc_pks', t.fks!).output('fc_pvs', t.fvs!);
  b.runSync();
  ops[cache].check();
  fused[cache].check();
  const gqaOut = download(t.out.gqa, dt);
  const opOut = download(t.out.op, dt);
  const fcOut = download(t.out.fc, dt);
  // The fused combine merges with the combine's arithmetic in its order: the same bits, NaNs included.
  const fcDiffering = fcOut.reduce((n, x, i) => n + (Object.is(x, opOut[i]) ? 0 : 1), 0);
  const fcVsRef = relErr(fcOut, ref.out);
  // The new entries (row r, KV head h, position lens[r] − 1) of both caches.
  const newEntries = (kk: DeviceTensor, isOp: boolean, scale?: DeviceTensor) => {
    const all = isOp && fp8 ? (kk.download().data as Uint8Array) : download(kk, dt);
    const sc = scale ? (scale.download().data as Float32Array) : undefined;
    const out = new Float32Array(R * KV * D);
    for (let r = 0; r < R; r++) {
      for (let hh = 0; hh < KV; hh++) {
        const vec = (r * KV + hh) * M + seqlens[r];
        for (let d = 0; d < D; d++) out[(r * KV + hh) * D + d] = sc ? e4m3Decode(all[vec * D + d]) * sc[vec] : all[vec * D + d];
      }
    }
    return out;
  };
  const entryK = relErr(newEntries(t.ok, true, t.ks), newEntries(t.gk, false));
  const entryV = relErr(newEntries(t.ov, true, t.vs), newEntries(t.gv, false));
  const opVsRef = relErr(opOut, ref.out);
  const gqaVsRef = relErr(gqaOut, refNative.out);
  const opVsGqa = relErr(opOut, gqaOut);
  const opVsBf16 = relErr(opOut, refNative.out);
  // e4m3 keeps 3 mantissa bits (a value's rounding up to 1/16 of it): the output can move by that through V and again
  // through the softmax weights Q·K sets, so 1/8 of the bf16 output's scale; the op's own exactness is opVsRef.
  const pass = fcDiffering === 0 && (fp8
    ? opVsRef.finite && opVsRef.rel <= Math.max(2 * gqaVsRef.rel, 1e-2) && opVsBf16.rel <= 1 / 8 && entryK.rel <= 1 / 16 && entryV.rel <= 1 / 16
    : opVsRef.finite && opVsRef.rel <= Math.max(2 * gqaVsRef.rel, 1e-2) && opVsGqa.rel <= 2e-2 && entryK.rel <= 2e-2 && entryV.rel === 0);
  console.log(JSON.stringify({ phase: 'check', case: c.name, cache, chunks: decodeChunks(M, cache, H / KV), op_vs_reference: opVsRef, gqa_vs_reference: gqaVsRef, op_vs_gqa: opVsGqa, ...(fp8 ? { op_vs_bf16_reference: opVsBf16 } : {}), new_key_vs_gqa: entryK, new_value_vs_gqa: entryV, fused_vs_reference: fcVsRef, fused_vs_op_differing: fcDiffering, ok: pass }));
  b.dispose();
  session.dispose();
  for (const x of [t.gk, t.gv, t.ok, t.ov, t.ks, t.vs, t.fk, t.fv, t.fks, t.fvs, t.out.gqa, t.out.op, t.out.fc, ...Object.values(ins)]) x?.dispose();
  return pass;
}

/**
 * Random bf16 and e4m3 caches of `cacheShape` [R, KV, M, D] (two each, K and V) and e4m3 scales of 1/64:
 * the kernels' time does not depend on the values. bf16 from random bits of a small range, e4m3 from
 * random bytes; a random block tiled over the cache (filling 268 M elements one by one would take seconds).
 */
function randomCaches(device: Device, cacheShape: number[], rand: () => number): { bf: DeviceTensor[]; f8: DeviceTensor[]; sc: DeviceTensor[] } {
  const [R, KV, M, D] = cacheShape;
  const tiled = <A extends Uint16Array | Uint8Array>(make: (n: number) => A, value: () => number): A => {
    const n = R * KV * M * D;
    const out = make(n);
    const block = 1 << 16;
    for (let i = 0; i < block; i++) out[i] = value();
    for (let at = block; at < n; at += block) out.copyWithin(at, 0, Math.min(block, n - at));
    return out;
  };
  const bf = [0, 1].map(() => device.upload({ data: tiled((n) => new Uint16Array(n), () => 0x3c00 + Math.floor(rand() * 0x3ff)), dims: cacheShape }, 'bfloat16'));
  const f8 = [0, 1].map(() => device.upload({ data: tiled((n) => new Uint8Array(n), () => Math.floor(rand() * 0x7e)), dims: cacheShape }, 'uint8'));
  const sc = [0, 1].map(() => device.upload({ data: new Float32Array(R * KV * M).fill(1 / 64), dims: [R, KV, M] }));
  return { bf, f8, sc };
}

/** Device ms of one `fn` (direct launches): 10 untimed, then `reps` between events on the kernels' stream. */
function timeLaunches(kernels: Kernels, reps: number, fn: () => void): number {
  for (let r = 0; r < 10; r++) fn();
  kernels.synchronize();
  return kernels.time(() => {
    for (let r = 0; r < reps; r++) fn();
  }) / reps;
}

/** The kernels' device time per layer at batch 256 and the Qwen3-0.6B heads, beside GroupQueryAttention and the op as sessions. */
function timePhase(kernels: Kernels, da: DecodeAttention, device: Device, ops: Record<CacheKind, DecodeAttentionOps>): void {
  const reps = Number(arg('reps', '20'));
  const R = 256;
  // Qwen3-0.6B's heads by default; --heads 32,8 gives Qwen3-4B/8B's 4 query heads per KV head.
  const [H, KV] = arg('heads', '16,8').split(',').map(Number);
  if (!(H > 0 && KV > 0 && H % KV === 0)) throw new Error(`--heads: '${arg('heads', '16,8')}' is not H,KV with KV dividing H`);
  const D = 128;
  const M = 1024;
  const dt: Dt = 'bfloat16';
  const h = half(dt);
  const rand = rng(11);
  const upRand = (n: number, dims: number[], amp = 1) => device.upload({ data: h.bits(Float32Array.from({ length: n }, () => amp * (2 * rand() - 1))), dims }, dt);
  const cacheShape = [R, KV, M, D];
  const q = upRand(R * H * D, [R, 1, H * D], 2);
  const k = upRand(R * KV * D, [R, 1, KV * D], 2);
  const v = upRand(R * KV * D, [R, 1, KV * D]);
  const qn = device.upload({ data: h.bits(new Float32Array(D).fill(1)), dims: [D] }, dt);
  const rope = ropeTables(M, D);
  const cos = device.upload({ data: h.bits(rope.cos), dims: [M, D / 2] }, dt);
  const sin = device.upload({ data: h.bits(rope.sin), dims: [M, D / 2] }, dt);
  const { bf, f8, sc } = randomCaches(device, cacheShape, rand);
  const C = Math.max(decodeChunks(M, 'native', H / KV), decodeChunks(M, 'float8e4m3', H / KV));
  const scratch = { qRot: device.empty('float32', [R, H, D]), oPart: device.empty('float32', [R, H, C, D]), lsePart: device.empty('float32', [R, H, C]), out: device.empty(dt, [R, 1, H * D]) };
  const time = (fn: () => void) => timeLaunches(kernels, reps, fn);
  // One-node sessions on the kernels' stream: GroupQueryAttention as the engine compiles it (ORT_ENABLE_XQA=0 for 2 query heads per KV head), and the op.
  const session = (which: 'gqa' | CacheKind) => {
    const g = new L.Graph(`decode_time_${which}`);
    const fp8 = which === 'float8e4m3';
    const x = { q: g.input('q', dt, [R, 1, H * D]), k: g.input('k', dt, [R, 1, KV * D]), v: g.input('v', dt, [R, 1, KV * D]), seqlens: g.input('seqlens', 'int32', [R]), total: g.input('total', 'int32', []), cos: g.input('cos', dt, [M, D / 2]), sin: g.input('sin', dt, [M, D / 2]), qn: g.input('qn', dt, [D]) };
    const ck = g.input('ck', fp8 ? 'uint8' : dt, cacheShape);
    const cv = g.input('cv', fp8 ? 'uint8' : dt, cacheShape);
    const ks = fp8 ? g.input('ks', 'float32', [R, KV, M]) : undefined;
    const vs = fp8 ? g.input('vs', 'float32', [R, KV, M]) : undefined;
    const heads = { numHeads: H, kvNumHeads: KV };
    if (which === 'gqa') {
      const r = L.groupQueryAttention({ query: x.q, key: x.k, value: x.v, past: { key: ck, value: cv }, seqlensK: x.seqlens, totalSequenceLength: x.total, rotary: { cos: x.cos, sin: x.sin }, qkNorm: { q: x.qn, k: x.qn, epsilon: EPS } }, heads);
      g.output(r.output, 'out');
      g.output(r.presentKey, 'pk');
      g.output(r.presentValue, 'pv');
    } else {
      const r = ops[which].attend({ query: x.q, key: x.k, value: x.v, cacheKey: ck, cacheValue: cv, keyScale: ks, valueScale: vs, seqlens: x.seqlens, rotary: { cos: x.cos, sin: x.sin }, qkNorm: { q: x.qn, k: x.qn } }, heads);
      g.output(r.output, 'out');
      g.output(r.presentKey, 'pk');
      g.output(r.presentValue, 'pv');
      if (fp8) {
        g.output(r.presentKeyScale!, 'pks');
        g.output(r.presentValueScale!, 'pvs');
      }
    }
    const prev = process.env.ORT_ENABLE_XQA;
    if (which === 'gqa' && prev === undefined && H / KV === 2) process.env.ORT_ENABLE_XQA = '0';
    try {
      return device.compile(g, { customOpDomains: [ops.native.domain.handle, ops.float8e4m3.domain.handle] });
    } finally {
      if (prev === undefined) delete process.env.ORT_ENABLE_XQA;
    }
  };
  const sessions = { gqa: session('gqa'), native: session('native'), float8e4m3: session('float8e4m3') };
  const lengths = arg('lengths', '1,256,512,768').split(',').map(Number);
  for (const L0 of lengths) if (!(Number.isInteger(L0) && L0 >= 1 && L0 <= M)) throw new Error(`--lengths: ${L0} is not a length in 1..${M}`);
  const seqlensAt = new Map(lengths.map((L0) => [L0, device.upload({ data: new Int32Array(R).fill(L0 - 1), dims: [R] })]));
  const step = (cache: CacheKind, seqlens: DeviceTensor, parts?: readonly DecodeStepPart[], combine: DecodeCombine = 'separate') => () => {
    const fp8 = cache === 'float8e4m3';
    const [ck, cv] = fp8 ? f8 : bf;
    const shape: DecodeAttentionShape = { rows: R, numHeads: H, numKvHeads: KV, headDim: D, maxLength: M, dtype: dt, cache };
    da.step(shape, { q, k, v, cacheK: ck, cacheV: cv, kScale: fp8 ? sc[0] : undefined, vScale: fp8 ? sc[1] : undefined, seqlens, cos, sin, qNorm: qn, kNorm: qn, epsilon: EPS, ...scratch }, undefined, parts, { combine });
  };
  // Every kernel at every length once untimed first, so no timing pays a first launch (module load, clocks, the JIT of the launch path).
  for (const L0 of lengths) for (const cache of ['native', 'float8e4m3'] as const) for (const combine of ['separate', 'fused'] as const) for (let r = 0; r < 10; r++) step(cache, seqlensAt.get(L0)!, undefined, combine)();
  kernels.synchronize();
  for (const L0 of lengths) {
    const seqlens = seqlensAt.get(L0)!;
    const row: Record<string, unknown> = { phase: 'time', rows: R, heads: [H, KV, D], cache_length: M, length: L0 };
    for (const cache of ['native', 'float8e4m3'] as const) {
      const fp8 = cache === 'float8e4m3';
      const bytes = R * KV * L0 * D * 2 * (fp8 ? 1 : 2) + (fp8 ? R * KV * L0 * 2 * 4 : 0);
      const ms = time(step(cache, seqlens));
      // The step's kernels apart (the split alone is what reads the cache; append and combine are its fixed costs).
      const part = (p: DecodeStepPart) => +time(step(cache, seqlens, [p])).toFixed(4);
      const splitMs = part('split');
      row[`kernel_${fp8 ? 'fp8' : 'bf16'}`] = {
        ms: +ms.toFixed(4),
        gb_per_s: Math.round(bytes / ms / 1e6),
        bytes,
        chunks: decodeChunks(M, cache, H / KV),
        split_ms: splitMs,
        split_gb_per_s: Math.round(bytes / splitMs / 1e6),
        append_ms: part('append'),
        combine_ms: part('combine'),
        // append + the split with the combine folded in (two launches), and that split alone
        fused_ms: +time(step(cache, seqlens, undefined, 'fused')).toFixed(4),
        fused_split_ms: +time(step(cache, seqlens, ['split'], 'fused')).toFixed(4),
      };
    }
    for (const which of ['gqa', 'native', 'float8e4m3'] as const) {
      const fp8 = which === 'float8e4m3';
      const [ck, cv] = fp8 ? f8 : bf;
      const b = sessions[which].binding();
      b.input('q', q).input('k', k).input('v', v).input('seqlens', seqlens).input('total', hostTensor('int32', [], [M])).input('cos', cos).input('sin', sin).input('qn', qn);
      b.input('ck', ck).input('cv', cv).output('pk', ck).output('pv', cv).output('out', scratch.out);
      if (fp8) b.input('ks', sc[0]).input('vs', sc[1]).output('pks', sc[0]).output('pvs', sc[1]);
      const ms = time(() => b.runSync({ synchronize: false }));
      ops.native.check();
      ops.float8e4m3.check();
      row[`session_${which === 'native' ? 'op_bf16' : which === 'float8e4m3' ? 'op_fp8' : 'gqa'}_ms`] = +ms.toFixed(4);
      if (which !== 'gqa') row[`session_${which === 'native' ? 'op_bf16' : 'op_fp8'}_cache_copies`] = ops[which].stats.cacheCopies;
      b.dispose();
    }
    console.log(JSON.stringify(row));
  }
  for (const x of seqlensAt.values()) x.dispose();
  for (const s of Object.values(sessions)) s.dispose();
  for (const x of [q, k, v, qn, cos, sin, ...bf, ...f8, ...sc, ...Object.values(scratch)]) x.dispose();
}

/** The sweep's groups (--sweep-groups, default 2,4): heads 8·G over 8 KV heads of 128 — Qwen3-0.6B's 16/8, Qwen3-4B/8B's 32/8. */
function sweepGroups(): number[] {
  const groups = arg('sweep-groups', '2,4').split(',').map(Number);
  for (const G of groups) if (!(DECODE_GROUPS as readonly number[]).includes(G)) throw new Error(`--sweep-groups: ${G} is not one of ${DECODE_GROUPS.join(', ')}`);
  return groups;
}
/** The largest relative difference (max abs / max |default|) of a variant's float32 output from the default variant's. */
const SWEEP_TOLERANCE = 1e-3;

type SplitArgs = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'];
type CombineArgs = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32'];
const SPLIT_ARGS: SplitArgs = ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'];
const COMBINE_ARGS: CombineArgs = ['ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32'];

/** The sweep's variants of (cache, G) compiled: one module, or, when it fails, each variant alone (the failures named). */
function compileSweep(kernels: Kernels, cache: CacheKind, G: number, variants: DecodeSplitVariant[]): { built: { v: DecodeSplitVariant; mod: KernelModule }[]; failed: { v: DecodeSplitVariant; error: string }[]; ms: number } {
  const options = [`-I${cudaIncludeDir()}`, '--std=c++17'];
  const t0 = performance.now();
  const name = `lathe_decode_sweep_${cache}_g${G}`;
  try {
    const mod = kernels.compile(decodeSplitSweepSource(variants), { name, options });
    return { built: variants.map((v) => ({ v, mod })), failed: [], ms: performance.now() - t0 };
  } catch {
    const built: { v: DecodeSplitVariant; mod: KernelModule }[] = [];
    const failed: { v: DecodeSplitVariant; error: string }[] = [];
    for (const v of variants) {
      try {
        built.push({ v, mod: kernels.compile(decodeSplitSweepSource([v]), { name: `${name}_${decodeSweepKernelName(v)}`, options }) });
      } catch (e) {
        failed.push({ v, error: (e instanceof Error ? e.message : String(e)).slice(0, 2000) });
      }
    }
    return { built, failed, ms: performance.now() - t0 };
  }
}

/**
 * The split kernel's tuning sweep (CUDA only): for each cache kind and {@link SWEEP_HEADS} shape, every
 * variant of `decodeSplitSweepVariants` (loads issued together, chunk, elements a thread, the
 * `__launch_bounds__` minimum of CTAs an SM) built in its own module from the step's `da_split`
 * template, timed alone at 256 rows and each length as the time phase times `split_ms`, its output
 * (split + a float32 combine) checked against the default variant's; one JSON line a variant, then
 * the fastest correct variant per (cache, G, length). --sweep-groups and --sweep-caches narrow it
 * (to split it over device calls). The default variant is also timed through the
 * step's own module (`main_split_ms`: the same build, so the two should agree).
 */
function sweepPhase(kernels: Kernels, da: DecodeAttention, device: Device): boolean {
  const reps = Number(arg('reps', '20'));
  const R = 256;
  const D = 128;
  const lengths = arg('lengths', '256,512,768,2048').split(',').map(Number);
  const M = Math.max(2048, Math.ceil(Math.max(...lengths) / 512) * 512);
  for (const L0 of lengths) if (!(Number.isInteger(L0) && L0 >= 1 && L0 <= M)) throw new Error(`--lengths: ${L0} is not a length in 1..${M}`);
  const rand = rng(13);
  const heads = sweepGroups().map((G) => [8 * G, 8] as const);
  const caches = arg('sweep-caches', 'native,float8e4m3').split(',') as CacheKind[];
  for (const c of caches) if (c !== 'native' && c !== 'float8e4m3') throw new Error(`--sweep-caches: '${c}' is not native or float8e4m3`);
  const Hmax = Math.max(...heads.map(([h]) => h));
  const maxChunks = Math.ceil(M / Math.min(...DECODE_SWEEP_SPACE.native.chunk, ...DECODE_SWEEP_SPACE.float8e4m3.chunk));
  const seqlensAt = new Map(lengths.map((L0) => [L0, device.upload({ data: new Int32Array(R).fill(L0 - 1), dims: [R] })]));
  const scratch = { oPart: device.empty('float32', [R, Hmax, maxChunks, D]), lsePart: device.empty('float32', [R, Hmax, maxChunks]), out: device.empty('float32', [R, 1, Hmax * D]) };
  const outBf16 = device.empty('bfloat16', [R, 1, Hmax * D]);
  // every shape has 8 KV heads: one set of caches
  const { bf, f8, sc } = randomCaches(device, [R, 8, M, D], rand);
  let ok = true;
  for (const [H, KV] of heads) {
    const G = H / KV;
    const q = device.upload({ data: Float32Array.from({ length: R * H * D }, () => 2 * rand() - 1), dims: [R, H, D] });
    for (const cache of caches) {
      const fp8 = cache === 'float8e4m3';
      const [ck, cv] = fp8 ? f8 : bf;
      const [ks, vs] = fp8 ? sc : [0n, 0n];
      const variants = decodeSplitSweepVariants(cache, G, D);
      const { built, failed, ms: compileMs } = compileSweep(kernels, cache, G, variants);
      console.log(JSON.stringify({ phase: 'sweep_compile', cache, group: G, variants: variants.length, built: built.length, ms: +compileMs.toFixed(1) }));
      for (const f of failed) {
        ok = false;
        console.log(JSON.stringify({ phase: 'sweep', cache, group: G, variant: decodeSweepKernelName(f.v), compile_error: f.error, ok: false }));
      }
      const def = decodeSplitDefaultVariant(cache, G, D);
      const runVariant = (v: DecodeSplitVariant, mod: KernelModule) => {
        const split = mod.kernel(decodeSweepKernelName(v), SPLIT_ARGS);
        const combine = mod.kernel(decodeSweepCombineName(D, v.chunk), COMBINE_ARGS);
        const C = Math.ceil(M / v.chunk);
        const smem = decodeSplitSmem(D, G, cache, v.chunk);
        return {
          split: (seqlens: DeviceTensor) => () => split.launch({ grid: [C, KV, R], block: DECODE_THREADS, sharedBytes: smem }, q, ck, cv, ks, vs, seqlens, scratch.oPart, scratch.lsePart, M, KV, C, 1 / Math.sqrt(D)),
          combine: (seqlens: DeviceTensor) => combine.launch({ grid: R * H, block: D }, scratch.oPart, scratch.lsePart, seqlens, scratch.out, M, H, C),
        };
      };
      // The default variant's output and time at each length: what every other variant is held to.
      const defBuilt = built.find((b) => sameDecodeSplitVariant(b.v, def));
      if (!defBuilt) {
        ok = false;
        continue;
      }
      const reference = new Map<number, { out: Float32Array; ms: number }>();
      const outOf = (launch: ReturnType<typeof runVariant>, seqlens: DeviceTensor) => {
        launch.split(seqlens)();
        launch.combine(seqlens);
        kernels.synchronize();
        return (scratch.out.download().data as Float32Array).slice(0, R * H * D);
      };
      const bytesAt = (L0: number) => R * KV * L0 * D * 2 * (fp8 ? 1 : 2) + (fp8 ? R * KV * L0 * 2 * 4 : 0);
      const results: { v: DecodeSplitVariant; by: Map<number, { ms: number; rel: number }> }[] = [];
      for (const { v, mod } of [defBuilt, ...built.filter((b) => b !== defBuilt)]) {
        const launch = runVariant(v, mod);
        const isDefault = v === defBuilt.v;
        const by = new Map<number, { ms: number; rel: number }>();
        const perLength: Record<string, unknown>[] = [];
        let variantOk = true;
        for (const L0 of lengths) {
          const seqlens = seqlensAt.get(L0)!;
          const out = outOf(launch, seqlens);
          const ms = timeLaunches(kernels, reps, launch.split(seqlens));
          if (isDefault) reference.set(L0, { out, ms });
          const ref = reference.get(L0)!;
          const stat = isDefault ? { rel: 0, finite: out.every(Number.isFinite) } : relErr(out, ref.out);
          const good = stat.finite && stat.rel <= SWEEP_TOLERANCE;
          variantOk &&= good;
          by.set(L0, { ms, rel: good ? stat.rel : Infinity });
          const row: Record<string, unknown> = { length: L0, ms: +ms.toFixed(4), gb_per_s: Math.round(bytesAt(L0) / ms / 1e6), vs_default: +(ref.ms / ms).toFixed(3), rel_vs_default: stat.rel, ok: good };
          if (isDefault) {
            // the same build through the step's module: its split part, as the time phase's split_ms
            const shape: DecodeAttentionShape = { rows: R, numHeads: H, numKvHeads: KV, headDim: D, maxLength: M, dtype: 'bfloat16', cache };
            const args = { q: 0n, k: 0n, v: 0n, cacheK: ck, cacheV: cv, kScale: ks, vScale: vs, seqlens, cos: 0n, sin: 0n, out: outBf16, qRot: q, oPart: scratch.oPart, lsePart: scratch.lsePart };
            row.main_split_ms = +timeLaunches(kernels, reps, () => da.step(shape, args, undefined, ['split'])).toFixed(4);
          }
          perLength.push(row);
        }
        ok &&= variantOk;
        results.push({ v, by });
        console.log(JSON.stringify({ phase: 'sweep', cache, heads: [H, KV, D], group: G, rows: R, cache_length: M, variant: decodeSweepKernelName(v), default: isDefault, chunk: v.chunk, elems: v.elems, unroll: v.unroll, min_blocks: v.minBlocks, by_length: perLength, ok: variantOk }));
      }
      for (const L0 of lengths) {
        const ranked = results.filter((r) => Number.isFinite(r.by.get(L0)!.rel)).sort((a, b) => a.by.get(L0)!.ms - b.by.get(L0)!.ms);
        const best = ranked[0];
        if (!best) continue;
        const ms = best.by.get(L0)!.ms;
        console.log(
          JSON.stringify({ phase: 'sweep_best', cache, group: G, length: L0, variant: decodeSweepKernelName(best.v), chunk: best.v.chunk, elems: best.v.elems, unroll: best.v.unroll, min_blocks: best.v.minBlocks, ms: +ms.toFixed(4), gb_per_s: Math.round(bytesAt(L0) / ms / 1e6), vs_default: +(reference.get(L0)!.ms / ms).toFixed(3) }),
        );
      }
    }
    q.dispose();
  }
  for (const x of [...seqlensAt.values(), ...Object.values(scratch), outBf16, ...bf, ...f8, ...sc]) x.dispose();
  return ok;
}

/** Ragged prompts of lo..hi tokens (seeded). */
function makePrompts(n: number, lo: number, hi: number, vocab: number, seed: number): number[][] {
  const rand = rng(seed);
  return Array.from({ length: n }, () => Array.from({ length: lo + Math.floor(rand() * (hi - lo + 1)) }, () => 1 + Math.floor(rand() * (vocab - 2))));
}

/**
 * The engines: GroupQueryAttention, or the op over a bf16 / e4m3 cache; `-unfused` keeps each residual
 * Add and RMSNorm apart (`fuseResidualNorm: false`, the graphs before SkipSimplifiedLayerNormalization);
 * `+swiglu` takes the decode step's SwiGLU through Lathe's kernel (the engine's `swiglu` option);
 * `+concat` runs q/k/v and gate/up as one MatMul each over concatenated weights (`concatProjections`);
 * `+bf16res` keeps the residual stream in the compute dtype (`residualDtype: 'compute'`: no Casts between
 * the layers, no float32 norm-weight copies); `+all` is `+concat+swiglu+bf16res`; `+pick` takes the
 * greedy token pick through Lathe's kernel (the engine's `greedyPick` option; not part of `+all`);
 * `+fc` (kernel bases) builds the decode-attention op with the combine folded into the split
 * (`combine: 'fused'`; not part of `+all`). Modifiers compose: `kernel+fp8+concat+bf16res`,
 * `kernel+fp8+all+pick+fc`.
 */
const BASES = ['gqa', 'gqa-unfused', 'kernel', 'kernel+fp8', 'kernel+fp8-unfused'] as const;
const MODIFIERS = ['swiglu', 'concat', 'bf16res', 'all', 'pick', 'fc'] as const;
type Engine = string;

/** The engine's base and its modifiers, or an error naming the flag's accepted forms. */
function parseEngine(engine: string): { base: (typeof BASES)[number]; mods: Set<string> } {
  const base = [...BASES].sort((a, b) => b.length - a.length).find((b) => engine === b || engine.startsWith(`${b}+`));
  const mods = base ? engine.slice(base.length).split('+').filter(Boolean) : [];
  const bad = mods.find((m) => !(MODIFIERS as readonly string[]).includes(m));
  if (!base || bad !== undefined || (base.endsWith('-unfused') && mods.length))
    throw new Error(`--engines: unknown engine '${engine}' (a base ${BASES.join(' | ')}, then any of +${MODIFIERS.join(' +')}; -unfused takes none)`);
  const set = new Set(mods.flatMap((m) => (m === 'all' ? ['swiglu', 'concat', 'bf16res'] : [m])));
  return { base, mods: set };
}

/** The kernels' ops an engine's modifiers may ask for (undefined where this run has none). */
interface ModifierOps {
  swiglu?: SwigluOps;
  pick?: GreedyPickOps;
  /** The decode-attention ops with the fused combine, by cache kind (+fc). */
  fused?: Record<CacheKind, DecodeAttentionOps>;
}

/** An engine's KvCacheGenerator options beyond the common ones, and the decode-attention op it uses. */
function engineOptions(engine: Engine, ops: Record<CacheKind, DecodeAttentionOps>, { swiglu, pick, fused }: ModifierOps): { extra: Partial<KvCacheGeneratorOptions>; used?: DecodeAttentionOps } {
  const { base, mods } = parseEngine(engine);
  if (mods.has('fc') && !base.startsWith('kernel')) throw new Error(`--engines ${engine}: +fc folds the decode-attention kernel's combine into its split; it needs a kernel base`);
  if (mods.has('fc') && !fused) throw new Error(`--engines ${engine}: no fused-combine ops were built`);
  const pickOps = mods.has('fc') ? fused! : ops;
  const used = base.startsWith('kernel+fp8') ? pickOps.float8e4m3 : base.startsWith('kernel') ? pickOps.native : undefined;
  const extra: Partial<KvCacheGeneratorOptions> = {
    ...(used ? { decodeAttention: used } : {}),
    ...(used?.cache === 'float8e4m3' ? { kvCacheDtype: 'float8e4m3' as const } : {}),
    ...(base.endsWith('-unfused') ? { fuseResidualNorm: false } : {}),
    ...(mods.has('concat') ? { concatProjections: true } : {}),
    ...(mods.has('bf16res') ? { residualDtype: 'compute' as const } : {}),
  };
  if (mods.has('swiglu')) {
    if (!swiglu) throw new Error(`--engines ${engine}: the SwiGLU kernel needs the GPU (not --cpu)`);
    extra.swiglu = swiglu;
  }
  if (mods.has('pick')) {
    if (!pick) throw new Error(`--engines ${engine}: no greedy-pick ops were built`);
    extra.greedyPick = pick;
  }
  return { extra, ...(used ? { used } : {}) };
}

/** The share of rows whose tokens all equal the reference's, and the mean index of the first difference. */
function agreement(out: Completion[], reference: Completion[]): { rows_identical: number; mean_first_divergence: number } {
  const firstDiff = out.map((c, i) => {
    const j = c.tokens.findIndex((x, k) => x !== reference[i].tokens[k]);
    return j < 0 ? c.tokens.length : j;
  });
  return { rows_identical: +(firstDiff.filter((d, i) => d === out[i].tokens.length).length / out.length).toFixed(3), mean_first_divergence: +(firstDiff.reduce((a, b) => a + b, 0) / out.length).toFixed(1) };
}

/** End-to-end generation through the KV engine, one engine at a time over the same model. */
async function generatePhase(model: CausalLM, ops: Record<CacheKind, DecodeAttentionOps>, modOps: ModifierOps, o: { rows: number; newTokens: number; promptLen: [number, number]; cudaGraph: boolean; engines: Engine[] }): Promise<boolean> {
  const prompts = makePrompts(o.rows, o.promptLen[0], o.promptLen[1], model.config.vocabSize, 5);
  const maxLength = o.promptLen[1] + o.newTokens;
  let reference: Completion[] | undefined;
  const byEngine = new Map<Engine, Completion[]>();
  let ok = true;
  for (const engine of o.engines) {
    const { extra, used } = engineOptions(engine, ops, modOps);
    const copies0 = used?.stats.cacheCopies ?? 0;
    const s0 = performance.now();
    const gen = KvCacheGenerator.create(model, { temperature: 0, rows: o.rows, maxLength, cudaGraph: o.cudaGraph, ...extra });
    const sessionMs = performance.now() - s0;
    const call = { maxNewTokens: o.newTokens, seed: 1 };
    const w0 = performance.now();
    await gen.generate(prompts, call);
    const warmMs = performance.now() - w0;
    const t0 = performance.now();
    const out = await gen.generate(prompts, call);
    const ms = performance.now() - t0;
    const t = gen.lastTimings;
    gen.dispose();
    const tokens = out.reduce((s, c) => s + c.tokens.length, 0);
    reference ??= engine === 'gqa' ? out : undefined;
    const agree = reference && agreement(out, reference);
    // a +pick engine against the same engine without it, when that ran first: the same logits, so the same first maxima are expected
    byEngine.set(engine, out);
    const unpicked = parseEngine(engine).mods.has('pick') ? byEngine.get(engine.replace('+pick', '')) : undefined;
    if (!out.every((c) => c.tokens.length === o.newTokens)) ok = false;
    // A compute whose present was not its past copied a whole cache first: the engine binds them to one buffer, so none is expected.
    const cacheCopies = (used?.stats.cacheCopies ?? 0) - copies0;
    if (cacheCopies > 0) ok = false;
    console.log(
      JSON.stringify({
        phase: 'generate',
        engine,
        rows: o.rows,
        prompt_tokens: o.promptLen,
        new_tokens: o.newTokens,
        cuda_graph: o.cudaGraph,
        session_ms: +sessionMs.toFixed(1),
        warm_up_ms: +warmMs.toFixed(1),
        run_ms: +ms.toFixed(1),
        prefill_ms: +t.prefillMs.toFixed(1),
        decode_ms: +t.decodeMs.toFixed(1),
        decode_step_ms: +(t.decodeMs / Math.max(1, t.decodeSteps)).toFixed(3),
        new_tokens_per_s: Math.round(tokens / (ms / 1000)),
        ...(agree ? { vs_gqa: agree } : {}),
        ...(unpicked ? { vs_without_pick: agreement(out, unpicked) } : {}),
        ...(used ? { cache_copies: cacheCopies } : {}),
      }),
    );
  }
  return ok;
}

/**
 * KL(bf16 cache ‖ e4m3 cache) of next-token distributions: one prefill (ORT's GroupQueryAttention, bf16
 * presents), the caches quantized into a second set, then steps of one graph holding two decoders (the
 * op over each cache) fed the bf16 decoder's greedy token, the KL per row computed in the graph.
 */
function klPhase(model: CausalLM, dev: { device: Device; da?: DecodeAttention }, ops: Record<CacheKind, DecodeAttentionOps>, o: { rows: number; steps: number; promptLen: [number, number] }): boolean {
  const { device, da } = dev;
  const cfg: DecoderConfig = model.config;
  const dt = model.dtype as Dt;
  const R = o.rows;
  const M = o.promptLen[1] + o.steps + 1;
  const { numKvHeads: KV, headDim: D, numLayers: NL } = cfg;
  const prompts = makePrompts(R, o.promptLen[0], o.promptLen[1], cfg.vocabSize, 9);
  const P = Math.max(...prompts.map((p) => p.length));
  const cacheShape = [R, KV, M, D];
  const made: DeviceTensor[] = [];
  const keep = <T extends DeviceTensor>(t: T) => (made.push(t), t);
  const bf = Array.from({ length: 2 * NL }, () => keep(device.zeros(dt, cacheShape)));
  const f8 = Array.from({ length: 2 * NL }, () => keep(device.zeros('uint8', cacheShape)));
  const sc = Array.from({ length: 2 * NL }, () => keep(device.zeros('float32', [R, KV, M])));
  const tail = keep(device.zeros(dt, cacheShape));

  // Prefill: the KV engine's graph (greedy), bf16 presents.
  const pg = new L.Graph('kl_prefill');
  addKvPrefill(pg, cfg, weightInputs(pg, cfg, dt, dt).weights, dt, { temperature: 0 }, { K: 1, qkNormInKernel: device.kind === 'cuda', rows: R });
  const prefill = device.compile(pg, { memoryPattern: false });
  const pb = prefill.binding();
  for (const [name, t] of model.weights) pb.input(name, t);
  const ids = new BigInt64Array(R * P);
  prompts.forEach((p, r) => p.forEach((tok, j) => (ids[r * P + j] = BigInt(tok))));
  const firstTok = keep(device.zeros('int64', [R, 1]));
  const seq0 = keep(device.zeros('int32', [R]));
  pb.input('input_ids', { data: ids, dims: [R, P] }).input('seqlens', hostTensor('int32', [R], prompts.map((p) => p.length - 1)));
  pb.input('last_index', hostTensor('int64', [R], prompts.map((p, r) => r * P + p.length - 1))).input('prompt_width', hostTensor('int32', [], [P]));
  pb.input('cache_start', hostTensor('int64', [1], [P])).input('cache_tail', tail).input('expand_index', hostTensor('int64', [R], prompts.map((_, r) => r)));
  pb.output('next_token', firstTok).output('next_seqlens', seq0).output('next_step', keep(device.zeros('int64', [1]))).output('next_history', keep(device.zeros('float32', [R, 1, 3])));
  for (let i = 0; i < NL; i++) pb.output(cacheName(i, 'key', 'output'), bf[2 * i]).output(cacheName(i, 'value', 'output'), bf[2 * i + 1]);
  pb.runSync();
  // The e4m3 copy of the prefilled caches.
  for (let i = 0; i < 2 * NL; i++) {
    if (da) da.quantize(dt, D, { x: bf[i], y: f8[i], scale: sc[i], rows: R * KV * M });
    else {
      const qz = quantizeE4m3Reference(bf[i].download().data as Float32Array, D);
      f8[i].upload({ data: qz.data, dims: cacheShape });
      sc[i].upload({ data: qz.scale, dims: [R, KV, M] });
    }
  }

  // The step: two decoders, the KL per row, the bf16 path's greedy token.
  const g = new L.Graph('kl_step');
  const w = weightInputs(g, cfg, dt, dt).weights;
  const token = g.input('token', 'int64', [R, 1]);
  const seqlens = g.input('seqlens', 'int32', [R]);
  const pastOf = (prefix: string, d: DType): KvPair[] => Array.from({ length: NL }, (_, i) => ({ key: g.input(`${prefix}.${i}.key`, d, cacheShape), value: g.input(`${prefix}.${i}.value`, d, cacheShape) }));
  const pBf = pastOf('bf', dt);
  const pF8 = pastOf('cache', 'uint8'); // cache.{i}.*: the names kvKernelDecoder gives the scale inputs beside them
  const a = kvKernelDecoder(g, cfg, w, dt, { token, seqlens, past: pBf, R }, ops.native);
  const b = kvKernelDecoder(g, cfg, w, dt, { token, seqlens, past: pF8, R }, ops.float8e4m3);
  const logp = (hidden: Tensor) => L.logSoftmax(L.cast(L.squeeze(lmLogits(cfg, w, hidden), [1]), 'float32'), -1);
  const lp = logp(a.hidden);
  const lq = logp(b.hidden);
  g.output(L.reduceSum(L.mul(L.softmax(lp, -1), L.sub(lp, lq)), [1]), 'kl');
  g.output(L.unsqueeze(L.argMax(lp, 1), [1]), 'next_token');
  g.output(L.cast(L.equal(L.argMax(lp, 1), L.argMax(lq, 1)), 'float32'), 'top1_agree');
  const outputs = (pairs: KvPair[], prefix: string, suffix = '') =>
    pairs.forEach((p, i) => {
      g.output(p.key, `${prefix}.${i}.key${suffix}`);
      g.output(p.value, `${prefix}.${i}.value${suffix}`);
    });
  outputs(a.present, 'bf_out');
  outputs(b.present, 'f8_out');
  outputs(b.scales!, 'f8_out', '_scale');
  const step = device.compile(g, { memoryPattern: false, customOpDomains: [ops.native.domain.handle, ops.float8e4m3.domain.handle] });
  const sb = step.binding();
  for (const [name, t] of model.weights) sb.input(name, t);
  for (let i = 0; i < NL; i++) {
    sb.input(`bf.${i}.key`, bf[2 * i]).input(`bf.${i}.value`, bf[2 * i + 1]).output(`bf_out.${i}.key`, bf[2 * i]).output(`bf_out.${i}.value`, bf[2 * i + 1]);
    sb.input(cacheName(i, 'key', 'input'), f8[2 * i]).input(cacheName(i, 'value', 'input'), f8[2 * i + 1]).output(`f8_out.${i}.key`, f8[2 * i]).output(`f8_out.${i}.value`, f8[2 * i + 1]);
    sb.input(`${cacheName(i, 'key', 'input')}_scale`, sc[2 * i]).input(`${cacheName(i, 'value', 'input')}_scale`, sc[2 * i + 1]).output(`f8_out.${i}.key_scale`, sc[2 * i]).output(`f8_out.${i}.value_scale`, sc[2 * i + 1]);
  }
  const tokA = firstTok;
  const tokB = keep(device.zeros('int64', [R, 1]));
  const klOut = keep(device.zeros('float32', [R]));
  const agreeOut = keep(device.zeros('float32', [R]));
  sb.output('kl', klOut).output('top1_agree', agreeOut);
  const kls: number[] = [];
  let agree = 0;
  const lens = prompts.map((p) => p.length);
  for (let s = 0; s < o.steps; s++) {
    // The token from the last step (the prefill's first) goes in at each row's next position.
    sb.input('token', s % 2 === 0 ? tokA : tokB).output('next_token', s % 2 === 0 ? tokB : tokA);
    sb.input('seqlens', hostTensor('int32', [R], lens.map((l) => l + s)));
    sb.runSync();
    ops.native.check();
    ops.float8e4m3.check();
    kls.push(...(klOut.download().data as Float32Array));
    agree += (agreeOut.download().data as Float32Array).reduce((x, y) => x + y, 0);
  }
  const sorted = [...kls].sort((x, y) => x - y);
  const mean = kls.reduce((x, y) => x + y, 0) / kls.length;
  const finite = kls.every(Number.isFinite);
  console.log(
    JSON.stringify({
      phase: 'kl',
      rows: R,
      steps: o.steps,
      prompt_tokens: o.promptLen,
      kl_mean: +mean.toExponential(3),
      kl_p99: +sorted[Math.floor(0.99 * (sorted.length - 1))].toExponential(3),
      kl_max: +sorted[sorted.length - 1].toExponential(3),
      top1_agreement: +(agree / (R * o.steps)).toFixed(4),
      ok: finite,
    }),
  );
  sb.dispose();
  pb.dispose();
  step.dispose();
  prefill.dispose();
  for (const t of made) t.dispose();
  return finite;
}

/**
 * The greedy-pick kernel against the composed greedy path (sampleNext at temperature 0 on the logits
 * cast to float32) on random logits with ties, both against the host's float64 rule, and their times.
 * Rows: 0 all equal; every other row uniform in [−4, 4) (bf16 rounds ~300 values a row into the top
 * bin: ties everywhere) with 12 injected at r mod 4 random places, and −∞ every 1000th element in every
 * 6th row. --cpu: float32 [4, 640] and the ops' host rule, no times.
 */
function pickPhase(device: Device, pick: GreedyPickOps, gpu?: { kernels: Kernels; compiled: GreedyPickKernels }): boolean {
  const R = gpu ? 256 : 4;
  const V = gpu ? Number(QWEN3_0_6B.vocab_size) : 640;
  const dt: Dt = gpu ? 'bfloat16' : 'float32';
  const h = half(dt);
  const rand = rng(17);
  const values = new Float32Array(R * V);
  for (let r = 0; r < R; r++) {
    const row = values.subarray(r * V, (r + 1) * V);
    if (r === 0) {
      row.fill(0.5);
      continue;
    }
    for (let j = 0; j < V; j++) row[j] = r % 6 === 3 && j % 1000 === 7 ? -Infinity : 8 * rand() - 4;
    for (let k = 0; k < r % 4; k++) row[Math.floor(rand() * V)] = 12;
  }
  const rounded = h.round(values);
  const logits = device.upload({ data: h.bits(rounded), dims: [R, V] }, dt);
  const ref = greedyPickReference(rounded, R, V);

  const graph = (name: string, build: (x: Tensor) => { tokens: Tensor; logprobs: Tensor }) => {
    const g = new L.Graph(name);
    const r = build(g.input('logits', dt, [R, V]));
    g.output(r.tokens, 'tokens');
    g.output(r.logprobs, 'logprobs');
    return device.compile(g, { customOpDomains: [pick.domain.handle] });
  };
  const sessions = {
    op: graph('pick_op', (x) => pick.apply(x)),
    composed: graph('pick_composed', (x) => sampleNext(L.cast(x, 'float32'), { temperature: 0 })),
  };
  const outs = (Object.keys(sessions) as (keyof typeof sessions)[]).map((k) => ({ k, tokens: device.zeros('int64', [R]), logprobs: device.zeros('float32', [R]) }));
  const bindings = outs.map((o) => sessions[o.k].binding().input('logits', logits).output('tokens', o.tokens).output('logprobs', o.logprobs));
  const direct = gpu ? { tokens: device.zeros('int64', [R]), logprobs: device.zeros('float32', [R]) } : undefined;
  const launch = () => gpu!.compiled.run({ rows: R, vocab: V, dtype: dt }, { logits, tokens: direct!.tokens, logprobs: direct!.logprobs });
  for (const b of bindings) b.runSync();
  pick.check();
  if (gpu) {
    launch();
    gpu.kernels.synchronize();
  }
  const read = (t: { tokens: DeviceTensor; logprobs: DeviceTensor }) => ({ tokens: Array.from(t.tokens.download().data as BigInt64Array, Number), logprobs: t.logprobs.download().data as Float32Array });
  const got = { op: read(outs[0]), composed: read(outs[1]), ...(direct ? { kernel: read(direct) } : {}) };
  const want = { tokens: Array.from(ref.tokens, Number), logprobs: ref.logprobs };
  const rowsDiffering = (a: number[], b: number[]) => a.filter((t, i) => t !== b[i]).length;
  const maxDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Number.isNaN(x) && Number.isNaN(b[i]) ? 0 : Number.isNaN(x - b[i]) ? Infinity : Math.abs(x - b[i])), 0);
  const fused = got.kernel ?? got.op;
  const row: Record<string, unknown> = {
    phase: 'pick',
    rows: R,
    vocab: V,
    dtype: dt,
    kernel_vs_composed: { rows_differing: rowsDiffering(fused.tokens, got.composed.tokens), logprob_max_abs_diff: +maxDiff(fused.logprobs, got.composed.logprobs).toExponential(3) },
    op_vs_composed: { rows_differing: rowsDiffering(got.op.tokens, got.composed.tokens), logprob_max_abs_diff: +maxDiff(got.op.logprobs, got.composed.logprobs).toExponential(3) },
    kernel_vs_reference: { rows_differing: rowsDiffering(fused.tokens, want.tokens), logprob_max_abs_diff: +maxDiff(fused.logprobs, want.logprobs).toExponential(3) },
    composed_vs_reference: { rows_differing: rowsDiffering(got.composed.tokens, want.tokens), logprob_max_abs_diff: +maxDiff(got.composed.logprobs, want.logprobs).toExponential(3) },
  };
  if (gpu) {
    const reps = Number(arg('reps', '20'));
    const time = (fn: () => void) => {
      for (let r = 0; r < 10; r++) fn();
      gpu.kernels.synchronize();
      return (gpu.kernels.time(() => {
        for (let r = 0; r < reps; r++) fn();
      }) / reps) * 1000;
    };
    const kernelUs = time(launch);
    row.kernel_us = +kernelUs.toFixed(2);
    row.kernel_gb_per_s = Math.round((R * V * 2) / kernelUs / 1e3);
    row.op_session_us = +time(() => bindings[0].runSync({ synchronize: false })).toFixed(2);
    row.composed_session_us = +time(() => bindings[1].runSync({ synchronize: false })).toFixed(2);
    pick.check();
  }
  const pass = [row.kernel_vs_composed, row.op_vs_composed].every((x) => {
    const d = x as { rows_differing: number; logprob_max_abs_diff: number };
    return d.rows_differing === 0 && d.logprob_max_abs_diff <= 1e-4;
  });
  console.log(JSON.stringify({ ...row, ok: pass }));
  for (const b of bindings) b.dispose();
  for (const s of Object.values(sessions)) s.dispose();
  for (const t of [logits, ...outs.flatMap((o) => [o.tokens, o.logprobs]), ...(direct ? [direct.tokens, direct.logprobs] : [])]) t.dispose();
  return pass;
}

async function main(): Promise<void> {
  if (flag('cpu') && arg('phases', '').split(',').includes('sweep')) throw new Error('--phases sweep builds and times CUDA variants of the split kernel: it has no CPU form (drop --cpu, or run --cpu with the check, generate, kl or pick phases)');
  const { cpu, phases } = phasesOf(['compile', 'check', 'time', 'generate', 'kl', 'pick', 'sweep'], ['check', 'generate', 'kl', 'pick']);
  const engines = arg('engines', 'gqa,kernel,kernel+fp8').split(',') as Engine[];
  for (const e of engines) parseEngine(e);
  if (flag('split')) throw new Error('--split: the v1 split was removed; there is one split kernel (drop the flag)');
  let ok = true;
  let device: Device;
  let kernels: Kernels | undefined;
  let da: DecodeAttention | undefined;
  let swiglu: SwigluOps | undefined;
  let pick: GreedyPickOps | undefined;
  let pickKernels: GreedyPickKernels | undefined;
  if (cpu) device = Device.cpu();
  else {
    ({ kernels, device } = Kernels.withDevice());
    const t0 = performance.now();
    // every group for the phases that run models and cases of several; the time and sweep phases only their own
    const [tH, tKV] = arg('heads', '16,8').split(',').map(Number);
    const own = [...(phases.includes('time') ? [tH / tKV] : []), ...(phases.includes('sweep') ? sweepGroups() : [])];
    const allGroups = phases.some((p) => ['compile', 'check', 'generate', 'kl'].includes(p)) || own.some((g) => !(DECODE_GROUPS as readonly number[]).includes(g));
    da = DecodeAttention.compile(kernels, { includeDir: cudaIncludeDir(), ...(allGroups || own.length === 0 ? {} : { groups: own }) });
    if (phases.includes('compile')) {
      const ms = +(performance.now() - t0).toFixed(1);
      // a module of one group (what a model needs: Qwen3-0.6B's 2), beside the one of every group
      const t1 = performance.now();
      DecodeAttention.compile(kernels, { includeDir: cudaIncludeDir(), groups: [2] });
      console.log(JSON.stringify({ phase: 'compile', ms, groups: da.groups.length, one_group_ms: +(performance.now() - t1).toFixed(1), compiled: kernels.counts.compiled, cached: kernels.counts.cached, target: kernels.target }));
    }
  }
  const provider = cpu ? 'cpu' : 'cuda';
  const modelDir = arg('model', '');
  const needModel = phases.includes('generate') || phases.includes('kl');
  const model = needModel
    ? modelDir
      ? await CausalLM.fromPretrained(modelDir, { device, dtype: cpu ? 'float32' : 'bfloat16' })
      : CausalLM.random(cpu ? TINY : QWEN3_0_6B, { device, dtype: cpu ? 'float32' : 'bfloat16', seed: 3, std: cpu ? 0.5 : 0.02 })
    : undefined;
  const eps = model?.config.rmsNormEps ?? EPS;
  const opsOf = (combine: DecodeCombine): Record<CacheKind, DecodeAttentionOps> => ({
    native: decodeAttentionOps(provider, da, { cache: 'native', qkNormEpsilon: eps, combine }),
    float8e4m3: decodeAttentionOps(provider, da, { cache: 'float8e4m3', qkNormEpsilon: eps, combine }),
  });
  const ops = opsOf('separate');
  // the same ops with the combine folded into the split (the check phase and the +fc engines)
  const fused = opsOf('fused');
  if (phases.includes('check')) for (const c of cpu ? CPU_CASES : CASES) for (const cache of ['native', 'float8e4m3'] as const) ok = checkCase(device, ops, fused, c, cache) && ok;
  if (phases.includes('time')) timePhase(kernels!, da!, device, ops);
  if (phases.includes('sweep')) ok = sweepPhase(kernels!, da!, device) && ok;
  // the greedy-pick kernel on the sessions' stream (the ops' host rule with --cpu), for the pick phase and the +pick engines
  if (phases.includes('pick') || engines.some((e) => parseEngine(e).mods.has('pick'))) {
    pickKernels = kernels && GreedyPickKernels.compile(kernels, { includeDir: cudaIncludeDir() });
    pick = greedyPickOps(provider, pickKernels);
  }
  if (pick && phases.includes('pick')) ok = pickPhase(device, pick, cpu ? undefined : { kernels: kernels!, compiled: pickKernels! }) && ok;
  if (model && phases.includes('generate')) {
    const rows = Number(arg('rows', cpu ? '4' : '256'));
    const newTokens = Number(arg('new', cpu ? '6' : '512'));
    // the SwiGLU kernel on the sessions' stream, for the +swiglu engines
    swiglu = kernels && engines.some((e) => parseEngine(e).mods.has('swiglu')) ? swigluOps('cuda', SwigluKernels.compile(kernels, { includeDir: cudaIncludeDir() })) : undefined;
    ok = (await generatePhase(model, ops, { swiglu, pick, fused }, { rows, newTokens, promptLen: cpu ? [3, 9] : [128, 256], cudaGraph: !cpu, engines })) && ok;
  }
  if (model && phases.includes('kl')) {
    const rows = Number(arg('kl-rows', cpu ? '3' : '32'));
    const steps = Number(arg('kl-steps', cpu ? '4' : '128'));
    ok = klPhase(model, { device, da }, ops, { rows, steps, promptLen: cpu ? [3, 9] : [128, 256] }) && ok;
  }
  model?.dispose();
  ops.native.dispose();
  ops.float8e4m3.dispose();
  fused.native.dispose();
  fused.float8e4m3.dispose();
  da?.dispose();
  swiglu?.dispose();
  pick?.dispose();
  kernels?.dispose();
  console.log(JSON.stringify({ phase: 'summary', ok }));
  if (!ok) process.exit(1);
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : e);
  process.exit(1);
});

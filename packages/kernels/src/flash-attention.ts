/**
 * Flash attention (forward and backward) on Lathe's kernel layer: `FlashAttention` compiles the
 * kernels of flash-attention-source.ts and launches them on the kernels' stream on device
 * addresses; `flashAttentionOps` puts them in a graph as two custom ops — a forward node whose
 * gradient rule emits the backward node — so a train step stays one session (ORT allocates every
 * output, scratch included, and can capture the step as a CUDA graph). On the CPU the ops compute
 * attention on the host (for tests of the wiring; slow).
 */
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import { type DType, type OpDef, type Tensor } from '@lathe/onnx';
import { type DeviceKind } from '@lathe/runtime';
import { type ArgValue } from './args';
import { opFamily, readF32, readI32, writeHost, type CustomOps } from './custom-op';
import { type Handle } from './driver';
import { FLASH_BM, FLASH_BN, FLASH_HEAD_DIMS, FLASH_THREADS, FLASH_TYPES, flashAttentionSource, flashBackwardSmem, flashForwardSmem, flashKernelName } from './flash-attention-source';
import { type Kernel, type Kernels } from './kernels';

/** The shape of one attention call: q [B, S, H, D], k and v [B, S, KV, D]. */
export interface FlashAttentionShape {
  batch: number;
  seqLen: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  dtype: DType;
}

/** Why the kernels cannot run `shape` (the caller falls back to the composed ops), or undefined. */
export function flashAttentionUnsupported(shape: FlashAttentionShape): string | undefined {
  if (!(shape.dtype in FLASH_TYPES)) return `dtype ${shape.dtype} (the kernels take bfloat16 or float16)`;
  if (!(FLASH_HEAD_DIMS as readonly number[]).includes(shape.headDim)) return `head size ${shape.headDim} (the kernels take ${FLASH_HEAD_DIMS.join(' or ')})`;
  if (shape.numHeads % shape.numKvHeads !== 0) return `${shape.numHeads} query heads over ${shape.numKvHeads} KV heads (must divide)`;
  if (shape.batch < 1 || shape.seqLen < 1) return `an empty batch [${shape.batch}, ${shape.seqLen}]`;
  if (shape.batch > 65535 || shape.numHeads > 65535) return `batch ${shape.batch} or ${shape.numHeads} heads over the grid's 65,535`;
  return undefined;
}

/**
 * The CUDA include folder NVRTC needs for the half types (`mma.h` marks the toolkit's): `LATHE_CUDA_INCLUDE`,
 * else `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`, then the newest
 * `/usr/local/cuda-*\/include` — the first that holds `mma.h`. Throws naming every place tried.
 */
export function cudaIncludeDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.LATHE_CUDA_INCLUDE) {
    if (!existsSync(join(env.LATHE_CUDA_INCLUDE, 'mma.h'))) throw new Error(`LATHE_CUDA_INCLUDE=${env.LATHE_CUDA_INCLUDE} holds no mma.h: point it at the CUDA toolkit's include folder`);
    return env.LATHE_CUDA_INCLUDE;
  }
  const versioned = (() => {
    try {
      return readdirSync('/usr/local')
        .filter((d) => /^cuda-\d+(\.\d+)?$/.test(d))
        .sort((a, b) => parseFloat(b.slice(5)) - parseFloat(a.slice(5)))
        .map((d) => `/usr/local/${d}/include`);
    } catch {
      return [];
    }
  })();
  const tried = [env.CUDA_HOME && join(env.CUDA_HOME, 'include'), env.CUDA_PATH && join(env.CUDA_PATH, 'include'), '/usr/local/cuda/include', ...versioned].filter((d): d is string => !!d);
  const found = tried.find((d) => existsSync(join(d, 'mma.h')));
  if (!found) throw new Error(`flash attention: no CUDA include folder with mma.h (tried ${tried.join(', ')}); install the CUDA toolkit's headers (apt cuda-cudart-dev-13-0 / cuda-nvrtc-dev) or set LATHE_CUDA_INCLUDE`);
  return found;
}

type Ptr = ArgValue<'ptr'>;
type FwdSig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'];
type LseSig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'];
type PreSig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32'];
type BwdSig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'];
type DqSig = readonly ['ptr', 'ptr', 'i64'];

interface Variant {
  fwd: Kernel<FwdSig>;
  lse: Kernel<LseSig>;
  pre: Kernel<PreSig>;
  bwd: Kernel<BwdSig>;
  dq: Kernel<DqSig>;
}

/** Addresses (or device tensors) of a forward call: inputs q, k, v, seqlens_k; outputs out, lse. */
export interface FlashForwardArgs {
  q: Ptr;
  k: Ptr;
  v: Ptr;
  /** int32 [B]: each row's length − 1 (GroupQueryAttention's seqlens_k). */
  seqlensK: Ptr;
  /** [B, S, H, D], written (0 at padding rows). */
  out: Ptr;
  /** float32 [B, H, S], written: each row's log-sum-exp of the scaled scores (0 at padding). */
  lse: Ptr;
}

/** Addresses of a backward call: the forward's inputs and outputs, dOut, scratch and the gradients. */
export interface FlashBackwardArgs {
  q: Ptr;
  k: Ptr;
  v: Ptr;
  seqlensK: Ptr;
  out: Ptr;
  lse: Ptr;
  /** [B, S, H, D]: d(loss)/d(out), expected 0 at padding rows. */
  dOut: Ptr;
  /** float32 [B, H, S] scratch: rowsum(dOut ∘ out). */
  delta: Ptr;
  /** float32 [B, S, H, D] scratch: dq accumulated across key tiles. */
  dqAcc: Ptr;
  dq: Ptr;
  dk: Ptr;
  dv: Ptr;
}

/** The compiled flash-attention kernels of one device. */
export class FlashAttention {
  private constructor(
    readonly kernels: Kernels,
    private readonly variants: Map<string, Variant>,
  ) {}

  /**
   * Compiles (or loads from the cache) every variant — bf16/fp16 × head size 64/128 — with the
   * CUDA headers of `includeDir` (default: `cudaIncludeDir()`), and raises each kernel's dynamic
   * shared-memory limit to what its launch uses.
   */
  static compile(kernels: Kernels, opts: { includeDir?: string } = {}): FlashAttention {
    const include = opts.includeDir ?? cudaIncludeDir();
    const mod = kernels.compile(flashAttentionSource, { name: 'lathe_flash_attention', options: [`-I${include}`, '--std=c++17'] });
    const variants = new Map<string, Variant>();
    for (const dtype of Object.keys(FLASH_TYPES) as (keyof typeof FLASH_TYPES)[]) {
      for (const d of FLASH_HEAD_DIMS) {
        const v: Variant = {
          fwd: mod.kernel(flashKernelName('flash_fwd', dtype, d), ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'] as const),
          lse: mod.kernel(flashKernelName('flash_lse', dtype, d), ['ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'] as const),
          pre: mod.kernel(flashKernelName('flash_bwd_pre', dtype, d), ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32'] as const),
          bwd: mod.kernel(flashKernelName('flash_bwd', dtype, d), ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'] as const),
          dq: mod.kernel(flashKernelName('flash_bwd_dq', dtype, d), ['ptr', 'ptr', 'i64'] as const),
        };
        kernels.driver.setMaxDynamicSharedBytes(v.fwd.handle, flashForwardSmem(d));
        kernels.driver.setMaxDynamicSharedBytes(v.lse.handle, flashForwardSmem(d));
        kernels.driver.setMaxDynamicSharedBytes(v.bwd.handle, flashBackwardSmem(d));
        variants.set(`${dtype}/${d}`, v);
      }
    }
    return new FlashAttention(kernels, variants);
  }

  private variant(shape: FlashAttentionShape): Variant {
    const why = flashAttentionUnsupported(shape);
    if (why) throw new Error(`flash attention kernels do not support ${why}`);
    return this.variants.get(`${shape.dtype}/${shape.headDim}`)!;
  }

  /** Queues the forward on `stream` (default: the kernels' stream). */
  forward(shape: FlashAttentionShape, a: FlashForwardArgs, stream?: Handle): void {
    const v = this.variant(shape);
    const { batch: B, seqLen: S, numHeads: H, numKvHeads: KV, headDim: D } = shape;
    v.fwd.launch({ grid: [Math.ceil(S / FLASH_BM), H, B], block: FLASH_THREADS, sharedBytes: flashForwardSmem(D), stream }, a.q, a.k, a.v, a.seqlensK, a.out, a.lse, S, H, KV, 1 / Math.sqrt(D));
  }

  /**
   * Queues the log-sum-exp alone (the forward's loop without V: the same bits) into `lse`: for the backward after a
   * forward that keeps none (GroupQueryAttention's).
   */
  logSumExp(shape: FlashAttentionShape, a: { q: Ptr; k: Ptr; seqlensK: Ptr; lse: Ptr }, stream?: Handle): void {
    const v = this.variant(shape);
    const { batch: B, seqLen: S, numHeads: H, numKvHeads: KV, headDim: D } = shape;
    v.lse.launch({ grid: [Math.ceil(S / FLASH_BM), H, B], block: FLASH_THREADS, sharedBytes: flashForwardSmem(D), stream }, a.q, a.k, a.seqlensK, a.lse, S, H, KV, 1 / Math.sqrt(D));
  }

  /** Queues the backward (D and the dq accumulator, the key-tile pass, dq's conversion) on `stream`. */
  backward(shape: FlashAttentionShape, a: FlashBackwardArgs, stream?: Handle): void {
    const v = this.variant(shape);
    const { batch: B, seqLen: S, numHeads: H, numKvHeads: KV, headDim: D } = shape;
    const rows = B * S * H;
    v.pre.launch({ grid: Math.ceil(rows / (FLASH_THREADS / 32)), block: FLASH_THREADS, stream }, a.out, a.dOut, a.seqlensK, a.delta, a.dqAcc, B, S, H);
    v.bwd.launch({ grid: [Math.ceil(S / FLASH_BN), KV, B], block: FLASH_THREADS, sharedBytes: flashBackwardSmem(D), stream }, a.q, a.k, a.v, a.dOut, a.lse, a.delta, a.seqlensK, a.dqAcc, a.dk, a.dv, S, H, KV, 1 / Math.sqrt(D));
    const n = rows * D;
    v.dq.launch({ grid: Math.min(Math.ceil(n / FLASH_THREADS), this.kernels.smCount * 16), block: FLASH_THREADS, stream }, a.dqAcc, a.dq, n);
  }
}

/** The shape of a call from device tensors q [B, S, H, D] and k [B, S, KV, D]. */
export function flashShapeOf(q: { dims: readonly number[]; dtype: DType }, k: { dims: readonly number[] }): FlashAttentionShape {
  if (q.dims.length !== 4 || k.dims.length !== 4) throw new Error(`flash attention: q and k must be [B, S, heads, headDim], got [${q.dims.join(', ')}] and [${k.dims.join(', ')}]`);
  const [batch, seqLen, numHeads, headDim] = q.dims;
  return { batch, seqLen, numHeads, numKvHeads: k.dims[2], headDim, dtype: q.dtype };
}

/**
 * Attention on the host in float64 (float32 results): the same causal, right-padded, grouped-query
 * rule as the kernels, with their padding conventions (out, lse, dq = 0 at padding rows). For the
 * CPU path of the custom ops and for tests.
 */
export function flashAttentionReference(
  shape: FlashAttentionShape,
  x: { q: Float32Array; k: Float32Array; v: Float32Array; seqlensK: Int32Array; dOut?: Float32Array },
): { out: Float32Array; lse: Float32Array; dq?: Float32Array; dk?: Float32Array; dv?: Float32Array } {
  const { batch: B, seqLen: S, numHeads: H, numKvHeads: KV, headDim: D } = shape;
  const G = H / KV;
  const scale = 1 / Math.sqrt(D);
  const out = new Float32Array(B * S * H * D);
  const lse = new Float32Array(B * H * S);
  const grads = x.dOut ? { dq: new Float32Array(out.length), dk: new Float32Array(x.k.length), dv: new Float32Array(x.v.length) } : undefined;
  const qAt = (b: number, i: number, h: number) => ((b * S + i) * H + h) * D;
  const kAt = (b: number, j: number, h: number) => ((b * S + j) * KV + h) * D;
  for (let b = 0; b < B; b++) {
    const len = x.seqlensK[b] + 1;
    for (let h = 0; h < H; h++) {
      const kh = Math.floor(h / G);
      for (let i = 0; i < Math.min(len, S); i++) {
        const qi = qAt(b, i, h);
        const s = new Float64Array(i + 1);
        let mx = -Infinity;
        for (let j = 0; j <= i; j++) {
          let acc = 0;
          const kj = kAt(b, j, kh);
          for (let d = 0; d < D; d++) acc += x.q[qi + d] * x.k[kj + d];
          s[j] = acc * scale;
          mx = Math.max(mx, s[j]);
        }
        let sum = 0;
        for (let j = 0; j <= i; j++) sum += Math.exp(s[j] - mx);
        const L = mx + Math.log(sum);
        lse[(b * H + h) * S + i] = L;
        const o = new Float64Array(D);
        const p = s.map((sj) => Math.exp(sj - L));
        for (let j = 0; j <= i; j++) for (let d = 0, kj = kAt(b, j, kh); d < D; d++) o[d] += p[j] * x.v[kj + d];
        out.set(o, qi);
        if (!grads) continue;
        let rowDot = 0;
        for (let d = 0; d < D; d++) rowDot += x.dOut![qi + d] * o[d];
        for (let j = 0; j <= i; j++) {
          const kj = kAt(b, j, kh);
          let dp = 0;
          for (let d = 0; d < D; d++) dp += x.dOut![qi + d] * x.v[kj + d];
          const ds = p[j] * (dp - rowDot);
          for (let d = 0; d < D; d++) {
            grads.dq[qi + d] += scale * ds * x.k[kj + d];
            grads.dk[kj + d] += scale * ds * x.q[qi + d];
            grads.dv[kj + d] += p[j] * x.dOut![qi + d];
          }
        }
      }
    }
  }
  return { out, lse, ...grads };
}

/** GroupQueryAttention-style inputs of one attention call: flat heads, as the decoder builds them. */
export interface FlashAttendInputs {
  /** [B, S, H·D], RoPE applied. */
  query: Tensor;
  /** [B, S, KV·D], RoPE applied. */
  key: Tensor;
  /** [B, S, KV·D]. */
  value: Tensor;
  /** int32 [B]: each row's length − 1. */
  seqlensK: Tensor;
  /** int32 scalar T (GroupQueryAttention reads it; the kernels do not). */
  totalSequenceLength: Tensor;
}

/** The graph side of the kernels: build attention nodes, and the domain to pass to the session. */
export interface FlashAttentionOps extends CustomOps {
  /**
   * Causal attention of right-padded rows, output [B, S, H·D] (0 at padding rows), differentiable
   * in query, key and value. `mode` `kernels`: the kernels' forward and backward. `backward`:
   * GroupQueryAttention's forward (ONNX Runtime's flash kernel) and the kernels' backward, which
   * recomputes the log-sum-exp (the forward's loop without V) since that forward keeps none.
   */
  attend(x: FlashAttendInputs, heads: { numHeads: number; kvNumHeads: number }, mode?: FlashAttentionMode): Tensor;
}

/** Which side of attention the kernels take: both, or the backward after GroupQueryAttention's forward. */
export type FlashAttentionMode = 'kernels' | 'backward';

/**
 * Flash attention as two custom ops of a new domain, for graphs run on `provider`: on CUDA their
 * computes launch `kernels` (which must be the kernels whose stream the device's sessions run on),
 * on the CPU they compute {@link flashAttentionReference} on the host (float32 also accepted there).
 * Node `FlashAttention` (q, k, v, seqlens_k → out, lse) has a gradient rule that emits
 * `FlashAttentionGrad` (q, k, v, seqlens_k, out, lse, dOut → dq, dk, dv and two scratch outputs
 * ORT allocates and the step ignores).
 */
export function flashAttentionOps(provider: DeviceKind, kernels?: FlashAttention): FlashAttentionOps {
  if (provider === 'cuda' && !kernels) throw new Error('flashAttentionOps: CUDA needs the compiled FlashAttention kernels (FlashAttention.compile on the kernels of the device)');
  const family = opFamily({ name: 'flashAttentionOps', domainPrefix: 'lathe.flash', provider, cudaDtypes: ['bfloat16', 'float16'] });
  const ops = new Map<DType, { fwd: OpDef<object>; bwd: OpDef<object>; bwdGqa: OpDef<object> }>();
  for (const dt of family.dtypes) {
    const fwdName = `FlashAttention_${dt}`;
    const bwdName = `FlashAttentionGrad_${dt}`;
    const fwd = family.domain.add({
      name: fwdName,
      inputs: [dt, dt, dt, 'int32'],
      outputs: [dt, 'float32'],
      provider,
      infer: ([q]) => {
        const [B, S, H] = q.shape;
        return [
          { dtype: dt, shape: [...q.shape] },
          { dtype: 'float32', shape: [B, H, S] },
        ];
      },
      compute: (ctx) => {
        const [q, k, v, seqlens] = ctx.inputs;
        const shape = flashShapeOf(q, k);
        const [B, S, H] = q.dims;
        const out = ctx.output(0, q.dims);
        const lse = ctx.output(1, [B, H, S]);
        if (kernels) {
          kernels.forward(shape, { q: q.data, k: k.data, v: v.data, seqlensK: seqlens.data, out, lse });
          return;
        }
        const n = (t: typeof q) => t.dims.reduce((a, b) => a * b, 1);
        const r = flashAttentionReference(shape, { q: readF32(q.data, n(q)), k: readF32(k.data, n(k)), v: readF32(v.data, n(v)), seqlensK: readI32(seqlens.data, B) });
        writeHost(out, r.out);
        writeHost(lse, r.lse);
      },
    });
    const bwd = family.domain.add({
      name: bwdName,
      inputs: [dt, dt, dt, 'int32', dt, 'float32', dt],
      outputs: [dt, dt, dt, 'float32', 'float32'],
      provider,
      infer: ([q, k, v]) => {
        const [B, S, H, D] = q.shape;
        return [
          { dtype: dt, shape: [...q.shape] },
          { dtype: dt, shape: [...k.shape] },
          { dtype: dt, shape: [...v.shape] },
          { dtype: 'float32', shape: [B, H, S] },
          { dtype: 'float32', shape: [B, S, H, D] },
        ];
      },
      compute: (ctx) => {
        const [q, k, v, seqlens, out, lse, dOut] = ctx.inputs;
        const shape = flashShapeOf(q, k);
        const [B, S, H] = q.dims;
        const dq = ctx.output(0, q.dims);
        const dk = ctx.output(1, k.dims);
        const dv = ctx.output(2, v.dims);
        const delta = ctx.output(3, [B, H, S]);
        const dqAcc = ctx.output(4, q.dims);
        if (kernels) {
          kernels.backward(shape, { q: q.data, k: k.data, v: v.data, seqlensK: seqlens.data, out: out.data, lse: lse.data, dOut: dOut.data, delta, dqAcc, dq, dk, dv });
          return;
        }
        const n = (t: typeof q) => t.dims.reduce((a, b) => a * b, 1);
        const r = flashAttentionReference(shape, { q: readF32(q.data, n(q)), k: readF32(k.data, n(k)), v: readF32(v.data, n(v)), seqlensK: readI32(seqlens.data, B), dOut: readF32(dOut.data, n(dOut)) });
        writeHost(dq, r.dq!);
        writeHost(dk, r.dk!);
        writeHost(dv, r.dv!);
        writeHost(delta, new Float32Array(B * H * S));
        writeHost(dqAcc, r.dq!);
      },
    });
    // The backward after GroupQueryAttention's forward: the log-sum-exp first, then the same backward.
    const bwdGqa = family.domain.add({
      name: `FlashAttentionGradAfterGqa_${dt}`,
      inputs: [dt, dt, dt, 'int32', dt, dt],
      outputs: [dt, dt, dt, 'float32', 'float32', 'float32'],
      provider,
      infer: ([q, k, v]) => {
        const [B, S, H, D] = q.shape;
        return [
          { dtype: dt, shape: [...q.shape] },
          { dtype: dt, shape: [...k.shape] },
          { dtype: dt, shape: [...v.shape] },
          { dtype: 'float32', shape: [B, H, S] },
          { dtype: 'float32', shape: [B, H, S] },
          { dtype: 'float32', shape: [B, S, H, D] },
        ];
      },
      compute: (ctx) => {
        const [q, k, v, seqlens, out, dOut] = ctx.inputs;
        const shape = flashShapeOf(q, k);
        const [B, S, H] = q.dims;
        const dq = ctx.output(0, q.dims);
        const dk = ctx.output(1, k.dims);
        const dv = ctx.output(2, v.dims);
        const lse = ctx.output(3, [B, H, S]);
        const delta = ctx.output(4, [B, H, S]);
        const dqAcc = ctx.output(5, q.dims);
        if (kernels) {
          kernels.logSumExp(shape, { q: q.data, k: k.data, seqlensK: seqlens.data, lse });
          kernels.backward(shape, { q: q.data, k: k.data, v: v.data, seqlensK: seqlens.data, out: out.data, lse, dOut: dOut.data, delta, dqAcc, dq, dk, dv });
          return;
        }
        const n = (t: typeof q) => t.dims.reduce((a, b) => a * b, 1);
        const r = flashAttentionReference(shape, { q: readF32(q.data, n(q)), k: readF32(k.data, n(k)), v: readF32(v.data, n(v)), seqlensK: readI32(seqlens.data, B), dOut: readF32(dOut.data, n(dOut)) });
        writeHost(dq, r.dq!);
        writeHost(dk, r.dk!);
        writeHost(dv, r.dv!);
        writeHost(lse, r.lse);
        writeHost(delta, new Float32Array(B * H * S));
        writeHost(dqAcc, r.dq!);
      },
    });
    ops.set(dt, { fwd, bwd, bwdGqa });
  }
  const attend = (x: FlashAttendInputs, heads: { numHeads: number; kvNumHeads: number }, mode: FlashAttentionMode = 'kernels'): Tensor => {
    const { query, key, value, seqlensK } = x;
    family.supports(query.dtype);
    const set = ops.get(query.dtype)!;
    const [B, S, W] = query.shape;
    if (query.shape.length !== 3 || key.shape.length !== 3 || value.shape.length !== 3 || typeof W !== 'number') throw new Error('flashAttentionOps.attend: query, key and value must be [B, S, heads·headDim] with a static width');
    const { numHeads: H, kvNumHeads: KV } = heads;
    const D = W / H;
    const split = (t: Tensor, n: number) => L.reshape(t, [B, S, n, D]);
    const flat = (t: Tensor) => L.reshape(t, [B, S, -1]);
    if (mode === 'kernels') {
      const withGrad: OpDef<object> = {
        ...set.fwd,
        nonDiffInputs: [3],
        grad: ({ inputs, outputs, dy }) => {
          const [dOut] = dy;
          if (!dOut) return [null, null, null, null];
          const [dq, dk, dv] = L.applyOp(set.bwd, [inputs[0]!, inputs[1]!, inputs[2]!, inputs[3]!, outputs[0]!, outputs[1]!, dOut], {});
          return [dq, dk, dv, null];
        },
      };
      return flat(L.applyOp(withGrad, [split(query, H), split(key, KV), split(value, KV), seqlensK], {})[0]);
    }
    // GroupQueryAttention's node with the kernels' backward as its gradient rule.
    const gqa: OpDef<L.GroupQueryAttentionAttrs> = {
      ...L.groupQueryAttentionOp,
      grad: ({ inputs, outputs, dy }) => {
        const [dOut, dPresentKey, dPresentValue] = dy;
        if (dPresentKey || dPresentValue) throw new Error('flashAttentionOps.attend: the kernels\' backward takes no gradient through the present key/value outputs');
        if (!dOut) return inputs.map(() => null);
        const [dq, dk, dv] = L.applyOp(set.bwdGqa, [split(inputs[0]!, H), split(inputs[1]!, KV), split(inputs[2]!, KV), inputs[5]!, split(outputs[0], H), split(dOut, H)], {});
        return [flat(dq), flat(dk), flat(dv), ...inputs.slice(3).map(() => null)];
      },
    };
    const [out] = L.applyOp(gqa, [query, key, value, null, null, seqlensK, x.totalSequenceLength, null, null], { numHeads: H, kvNumHeads: KV, doRotary: false });
    return out;
  };
  return { domain: family.domain, attend, check: family.check, dispose: family.dispose };
}

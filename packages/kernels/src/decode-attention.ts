/**
 * Lathe's decode attention on its kernel layer: `DecodeAttention` compiles the kernels of
 * decode-attention-source.ts and launches them on the kernels' stream; `decodeAttentionOps` puts a
 * decode step's attention in a graph as one custom op — the new key/value appended in place into the
 * static cache (RoPE and Qwen3's QK-norm inside), split-KV attention over each row's length, the
 * chunks merged — so a KV engine's decode step stays one session that ORT can capture as a CUDA
 * graph: every launch reads lengths from device memory and covers the cache length, so a replay is
 * right for any lengths. An fp8 (e4m3) cache adds per-vector scales and a quantize op for the
 * prefill's presents. A packed form of the op (`attendPacked`) reads q, k and v as column ranges of
 * one projection (q/k/v as one MatMul over concatenated weights) through the append's row strides.
 * On the CPU the ops compute the same step on the host (float32, float64 arithmetic) — the
 * reference the tests compare with.
 */
import * as L from '@lathe/onnx';
import { type DType, type OpDef, type Tensor, type TensorType } from '@lathe/onnx';
import { type DeviceKind } from '@lathe/runtime';
import { type ArgValue } from './args';
import { opFamily, readBytes, readF32, readI32, writeHost, type CustomOps } from './custom-op';
import { type Handle } from './driver';
import { cudaIncludeDir } from './flash-attention';
import { type Kernel, type Kernels } from './kernels';
import {
  DECODE_GROUPS,
  DECODE_HEAD_DIMS,
  DECODE_THREADS,
  DECODE_TYPES,
  FP8_E4M3_MAX,
  decodeAppendSmem,
  decodeAttentionSourceFor,
  decodeGroupsOf,
  decodeKernelName,
  decodeSplitChunk,
  decodeSplitSmem,
  type DecodeCacheKind,
} from './decode-attention-source';

/** One decode step's attention: one query per row, the cache [rows, numKvHeads, maxLength, headDim]. */
export interface DecodeAttentionShape {
  rows: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  maxLength: number;
  /** q, k, v and the output (the cache too unless fp8). */
  dtype: DType;
  cache: DecodeCacheKind;
}

/** Chunks of a row's positions, each one split CTA of `cache` at `group` query heads per KV head (the scratch's [R, H, chunks, ·]). */
export function decodeChunks(maxLength: number, cache: DecodeCacheKind, group: number): number {
  return Math.ceil(maxLength / decodeSplitChunk(cache, group));
}

/** Why the kernels cannot run `shape` on `provider` (the caller keeps GroupQueryAttention), or undefined. */
export function decodeAttentionUnsupported(shape: Omit<DecodeAttentionShape, 'rows' | 'maxLength'>, provider: DeviceKind = 'cuda'): string | undefined {
  const { dtype, headDim, numHeads, numKvHeads } = shape;
  if (numKvHeads < 1 || numHeads % numKvHeads !== 0) return `${numHeads} query heads over ${numKvHeads} KV heads (must divide)`;
  if (headDim % 2 !== 0) return `head size ${headDim} (RoPE needs an even one)`;
  if (provider === 'cpu') return dtype === 'float32' ? undefined : `dtype ${dtype} on the CPU (its reference takes float32)`;
  if (!(dtype in DECODE_TYPES)) return `dtype ${dtype} (the kernels take bfloat16 or float16)`;
  if (!(DECODE_HEAD_DIMS as readonly number[]).includes(headDim)) return `head size ${headDim} (the kernels take ${DECODE_HEAD_DIMS.join(' or ')})`;
  const G = numHeads / numKvHeads;
  if (!(DECODE_GROUPS as readonly number[]).includes(G)) return `${G} query heads per KV head (${numHeads}/${numKvHeads}; the kernels take ${DECODE_GROUPS[0]} to ${DECODE_GROUPS[DECODE_GROUPS.length - 1]})`;
  return undefined;
}

type Ptr = ArgValue<'ptr'>;
type AppendSig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'f32', 'ptr', 'i32', 'i32', 'i32', 'i32', 'i32'];
type SplitSig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'];
type CombineSig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32'];
type SplitFusedSig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'];
type QuantizeSig = readonly ['ptr', 'ptr', 'ptr', 'i64'];
type CopySig = readonly ['ptr', 'ptr', 'i64'];

/** Addresses (or device tensors) of one step. */
export interface DecodeStepArgs {
  /** [R, 1, H·D], before QK-norm and RoPE (rows `qStride` elements apart). */
  q: Ptr;
  /** [R, 1, KV·D], before QK-norm and RoPE (rows `kvStride` elements apart). */
  k: Ptr;
  /** [R, 1, KV·D] (rows `kvStride` elements apart). */
  v: Ptr;
  /**
   * Elements between rows of q (default H·D) and of k and v (default KV·D): (H + 2·KV)·D for each
   * when q, k and v are column ranges of one packed projection (see {@link packedQkvArgs}).
   */
  qStride?: number;
  kvStride?: number;
  /** The cache [R, KV, M, D] (T, or e4m3 bytes): the new entry is written at each row's seqlens. */
  cacheK: Ptr;
  cacheV: Ptr;
  /** float32 [R, KV, M] (fp8 caches only; 0n otherwise). */
  kScale?: Ptr;
  vScale?: Ptr;
  /** int32 [R]: each row's new position (its length − 1). */
  seqlens: Ptr;
  /** [maxPositions, D/2] in T. */
  cos: Ptr;
  sin: Ptr;
  /** [D] in T: Qwen3's q_norm/k_norm weights, or 0n for none. */
  qNorm?: Ptr;
  kNorm?: Ptr;
  /** The norm's epsilon (with qNorm/kNorm). */
  epsilon?: number;
  /** [R, 1, H·D], written. */
  out: Ptr;
  /** Scratch: float32 [R, H, D], [R, H, chunks, D], [R, H, chunks]. */
  qRot: Ptr;
  oPart: Ptr;
  lsePart: Ptr;
}

/** The kernels of a step, in launch order (a benchmark may time them apart). */
export type DecodeStepPart = 'append' | 'split' | 'combine';
const ALL_PARTS: readonly DecodeStepPart[] = ['append', 'split', 'combine'];

/**
 * How a step merges a row's chunks: `separate` launches the combine kernel after the split; `fused`
 * folds it into the split (the last CTA of each row and KV head merges, counted on a persistent
 * int32 counter buffer), one launch fewer with the same output bit for bit.
 */
export type DecodeCombine = 'separate' | 'fused';

/** Options of {@link DecodeAttention.step}. */
export interface DecodeStepOptions {
  /** Default `separate`. With `fused` the `split` part launches the fused kernel and `combine` launches nothing. */
  combine?: DecodeCombine;
}

/** Options of {@link DecodeAttention.compile}. */
export interface DecodeCompileOptions {
  /** The CUDA headers' folder (default: `cudaIncludeDir()`). */
  includeDir?: string;
  /**
   * Query heads per KV head whose splits the module builds (default: every group of DECODE_GROUPS,
   * 1 to 8). A model needs one: `[numHeads / numKvHeads]` compiles an eighth of the splits, and the
   * compile cache keys on the source, so each set is its own cached image.
   */
  groups?: readonly number[];
}

/** The compiled decode-attention kernels of one device. */
export class DecodeAttention {
  private readonly fns = new Map<string, Kernel<readonly ('ptr' | 'i32' | 'f32' | 'i64')[]>>();
  /** The fused combine's counters (int32, zero between launches) and how many words they hold. */
  private counters: { ptr: Handle; words: number } | undefined;
  /** Smaller counter buffers a larger step replaced: kept until dispose, since a captured graph may still replay with one. */
  private readonly retired: Handle[] = [];

  private constructor(
    readonly kernels: Kernels,
    private readonly mod: ReturnType<Kernels['compile']>,
    /** The query heads per KV head the module has splits for, ascending. */
    readonly groups: readonly number[],
  ) {}

  /**
   * Compiles (or loads from the cache) the module, with the CUDA headers of `opts.includeDir` and the
   * splits of `opts.groups` (default every group; see {@link DecodeCompileOptions}).
   */
  static compile(kernels: Kernels, opts: DecodeCompileOptions = {}): DecodeAttention {
    const include = opts.includeDir ?? cudaIncludeDir();
    const groups = decodeGroupsOf(opts.groups);
    const source = decodeAttentionSourceFor({ groups });
    return new DecodeAttention(kernels, kernels.compile(source, { name: 'lathe_decode_attention', options: [`-I${include}`, '--std=c++17'] }), groups);
  }

  private fn<S extends readonly ('ptr' | 'i32' | 'f32' | 'i64')[]>(name: string, sig: S): Kernel<S> {
    let k = this.fns.get(name);
    if (!k) {
      k = this.mod.kernel(name, sig);
      this.fns.set(name, k);
    }
    return k as unknown as Kernel<S>;
  }

  /**
   * The fused combine's counters for `words` (rows × KV heads), allocated zeroed (the memset queued
   * on `stream`) or grown outside a capture: a graph keeps the address it captured, so a capture
   * that needs more than exist is refused.
   */
  private countersFor(words: number, stream: Handle): Handle {
    if (this.counters && this.counters.words >= words) return this.counters.ptr;
    const driver = this.kernels.driver;
    if (driver.isCapturing(stream)) {
      throw new Error(
        `decode attention: the fused combine needs ${words} counters (rows × KV heads) but ${this.counters?.words ?? 0} exist, and the stream is capturing a CUDA graph (which cannot allocate); run a step of the largest batch before capturing`,
      );
    }
    const ptr = driver.alloc(words * 4);
    driver.memsetD32(ptr, 0, words, stream);
    if (this.counters) this.retired.push(this.counters.ptr);
    this.counters = { ptr, words };
    return ptr;
  }

  /**
   * Queues append, split and combine (or only `parts` of them) on `stream` (default: the kernels'
   * stream); `opts.combine` `fused` merges in the split (see {@link DecodeCombine}). Fused steps
   * share one counter buffer, so they must run in order on one stream.
   */
  step(shape: DecodeAttentionShape, a: DecodeStepArgs, stream?: Handle, parts: readonly DecodeStepPart[] = ALL_PARTS, opts: DecodeStepOptions = {}): void {
    const why = decodeAttentionUnsupported(shape);
    if (why) throw new Error(`decode attention kernels do not support ${why}`);
    const { rows: R, numHeads: H, numKvHeads: KV, headDim: D, maxLength: M, cache } = shape;
    const t = shape.dtype as keyof typeof DECODE_TYPES;
    const G = H / KV;
    if (!this.groups.includes(G)) throw new Error(`decode attention: this module was compiled for ${this.groups.join(', ')} query heads per KV head, not ${G} (${H}/${KV}); DecodeAttention.compile(kernels, { groups: [${G}] }) or without groups for all`);
    const C = decodeChunks(M, cache, G);
    if (R > 65535) throw new Error(`decode attention: ${R} rows past the grid's 65,535`);
    const append = this.fn(decodeKernelName.append(t, cache, D), ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'f32', 'ptr', 'i32', 'i32', 'i32', 'i32', 'i32'] as AppendSig);
    const split = this.fn(decodeKernelName.split(t, cache, D, G), ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'] as SplitSig);
    const combine = this.fn(decodeKernelName.combine(t, D, decodeSplitChunk(cache, G)), ['ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32'] as CombineSig);
    const kS = a.kScale ?? 0n;
    const vS = a.vScale ?? 0n;
    const fused = opts.combine === 'fused';
    if (parts.includes('append')) append.launch({ grid: [R, KV], block: D, sharedBytes: decodeAppendSmem(D), stream }, a.q, a.k, a.v, a.cacheK, a.cacheV, kS, vS, a.seqlens, a.cos, a.sin, a.qNorm ?? 0n, a.kNorm ?? 0n, a.epsilon ?? 1e-6, a.qRot, M, H, KV, a.qStride ?? H * D, a.kvStride ?? KV * D);
    if (fused) {
      if (!parts.includes('split')) return;
      const on = stream ?? this.kernels.stream;
      const splitFused = this.fn(decodeKernelName.splitFused(t, cache, D, G), ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'f32'] as SplitFusedSig);
      const counters = this.countersFor(R * KV, on);
      splitFused.launch({ grid: [C, KV, R], block: DECODE_THREADS, sharedBytes: decodeSplitSmem(D, G, cache), stream: on }, a.qRot, a.cacheK, a.cacheV, kS, vS, a.seqlens, a.oPart, a.lsePart, a.out, counters, M, KV, C, 1 / Math.sqrt(D));
      return;
    }
    if (parts.includes('split')) split.launch({ grid: [C, KV, R], block: DECODE_THREADS, sharedBytes: decodeSplitSmem(D, G, cache), stream }, a.qRot, a.cacheK, a.cacheV, kS, vS, a.seqlens, a.oPart, a.lsePart, M, KV, C, 1 / Math.sqrt(D));
    if (parts.includes('combine')) combine.launch({ grid: R * H, block: D, stream }, a.oPart, a.lsePart, a.seqlens, a.out, M, H, C);
  }

  /** Queues the quantization of `rows` vectors of `headDim` T values into e4m3 bytes and per-vector scales. */
  quantize(dtype: DType, headDim: number, a: { x: Ptr; y: Ptr; scale: Ptr; rows: number }, stream?: Handle): void {
    if (!(dtype in DECODE_TYPES) || !(DECODE_HEAD_DIMS as readonly number[]).includes(headDim)) throw new Error(`decode attention: no quantize kernel for ${dtype}, head size ${headDim}`);
    const warps = DECODE_THREADS / 32;
    const k = this.fn(decodeKernelName.quantize(dtype as keyof typeof DECODE_TYPES, headDim), ['ptr', 'ptr', 'ptr', 'i64'] as QuantizeSig);
    if (a.rows > 0) k.launch({ grid: Math.ceil(a.rows / warps), block: DECODE_THREADS, stream }, a.x, a.y, a.scale, a.rows);
  }

  /** Frees the fused combine's counters (after the work using them is done; the compiled module stays with the kernels). */
  dispose(): void {
    for (const p of this.retired.splice(0)) this.kernels.driver.free(p);
    if (this.counters) this.kernels.driver.free(this.counters.ptr);
    this.counters = undefined;
  }

  /** Queues a device copy of `bytes` (a multiple of 4). */
  copy(src: Ptr, dst: Ptr, bytes: number, stream?: Handle): void {
    if (bytes % 4 !== 0) throw new Error(`decode attention: copy of ${bytes} bytes (a multiple of 4 expected)`);
    const k = this.fn(decodeKernelName.copy(), ['ptr', 'ptr', 'i64'] as CopySig);
    const n = bytes / 4;
    if (n > 0) k.launch({ grid: Math.min(Math.ceil(n / DECODE_THREADS), this.kernels.smCount * 16), block: DECODE_THREADS, stream }, src, dst, n);
  }
}

/**
 * The q, k and v arguments of a step that reads them from one packed projection at `qkv`
 * ([R, 1, (H + 2·KV)·D]: q its first H·D columns, then k, then v, as the concatenated q/k/v weight
 * orders them): k and v by byte offset, every row (H + 2·KV)·D elements apart.
 */
export function packedQkvArgs(qkv: bigint, shape: Pick<DecodeAttentionShape, 'numHeads' | 'numKvHeads' | 'headDim' | 'dtype'>): Pick<DecodeStepArgs, 'q' | 'k' | 'v' | 'qStride' | 'kvStride'> {
  const { numHeads: H, numKvHeads: KV, headDim: D } = shape;
  const head = BigInt(L.dtypeBytes(shape.dtype) * D);
  const stride = (H + 2 * KV) * D;
  return { q: qkv, k: qkv + BigInt(H) * head, v: qkv + BigInt(H + KV) * head, qStride: stride, kvStride: stride };
}

// ---- the host rule ------------------------------------------------------------------------------

/** q [R, H·D], k and v [R, KV·D] copied out of a packed qkv [R, (H + 2·KV)·D] (the packed op's host rule reads it so). */
export function unpackQkv(qkv: Float32Array, shape: Pick<DecodeAttentionShape, 'rows' | 'numHeads' | 'numKvHeads' | 'headDim'>): { q: Float32Array; k: Float32Array; v: Float32Array } {
  const { rows: R, numHeads: H, numKvHeads: KV, headDim: D } = shape;
  const W = (H + 2 * KV) * D;
  if (qkv.length !== R * W) throw new Error(`unpackQkv: ${qkv.length} values for ${R} rows of (${H} + 2·${KV})·${D}`);
  const q = new Float32Array(R * H * D);
  const k = new Float32Array(R * KV * D);
  const v = new Float32Array(R * KV * D);
  for (let r = 0; r < R; r++) {
    q.set(qkv.subarray(r * W, r * W + H * D), r * H * D);
    k.set(qkv.subarray(r * W + H * D, r * W + (H + KV) * D), r * KV * D);
    v.set(qkv.subarray(r * W + (H + KV) * D, (r + 1) * W), r * KV * D);
  }
  return { q, k, v };
}


/** e4m3 (bias 7, no infinities, ±448 largest): round to nearest even, saturating — `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)`. */
export function e4m3Encode(x: number): number {
  if (Number.isNaN(x)) return 0x7f;
  const sign = x < 0 || Object.is(x, -0) ? 0x80 : 0;
  const a = Math.abs(x);
  if (a >= FP8_E4M3_MAX) return sign | 0x7e;
  const even = (y: number) => {
    const r = Math.round(y);
    return Math.abs(y - Math.trunc(y)) === 0.5 ? 2 * Math.round(y / 2) : r;
  };
  if (a < 2 ** -6) return sign | even(a * 512);
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e--;
  if (2 ** (e + 1) <= a) e++;
  let E = e + 7;
  let m = even((a / 2 ** e - 1) * 8);
  if (m === 8) {
    m = 0;
    E++;
  }
  if (E > 15 || (E === 15 && m === 7)) return sign | 0x7e;
  return sign | (E << 3) | m;
}

/** The value of an e4m3 byte. */
export function e4m3Decode(b: number): number {
  const E = (b >> 3) & 15;
  const m = b & 7;
  const v = E === 0 ? m * 2 ** -9 : (1 + m / 8) * 2 ** (E - 7);
  return b & 0x80 ? -v : v;
}

/** Inputs of {@link decodeAttentionReference}: flat host arrays in the layouts of {@link DecodeStepArgs}. */
export interface DecodeReferenceInputs {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
  /** float32 values, or e4m3 bytes for an fp8 cache: updated in place at each row's position. */
  cacheK: Float32Array | Uint8Array;
  cacheV: Float32Array | Uint8Array;
  /** fp8 only: float32 [R, KV, M], updated in place. */
  kScale?: Float32Array;
  vScale?: Float32Array;
  seqlens: Int32Array;
  cos: Float32Array;
  sin: Float32Array;
  qNorm?: Float32Array;
  kNorm?: Float32Array;
  epsilon?: number;
}

/**
 * One decode step on the host in float64 with the kernels' roundings (`round`: to the compute dtype;
 * float32 by default): QK-norm, RoPE at each row's position, the new key/value written (or quantized
 * by the vector's amax) into the cache in place, attention over positions 0..seqlens[r]. Returns the
 * output [R, 1, H·D] and the rotated queries. Rows whose position is outside the cache are skipped
 * (output 0), as the kernels skip them.
 */
export function decodeAttentionReference(shape: DecodeAttentionShape, x: DecodeReferenceInputs, round: (v: number) => number = Math.fround): { out: Float32Array; qRot: Float32Array } {
  const { rows: R, numHeads: H, numKvHeads: KV, headDim: D, maxLength: M, cache } = shape;
  const G = H / KV;
  const half = D / 2;
  const fp8 = cache === 'float8e4m3';
  const eps = x.epsilon ?? 1e-6;
  const scale = 1 / Math.sqrt(D);
  const out = new Float32Array(R * H * D);
  const qRot = new Float32Array(R * H * D);
  const read = (c: Float32Array | Uint8Array, s: Float32Array | undefined, vec: number, d: number) => (fp8 ? e4m3Decode(c[vec * D + d]) * s![vec] : c[vec * D + d]);
  const write = (c: Float32Array | Uint8Array, s: Float32Array | undefined, vec: number, y: Float64Array) => {
    if (!fp8) {
      for (let d = 0; d < D; d++) c[vec * D + d] = y[d];
      return;
    }
    let amax = 0;
    for (let d = 0; d < D; d++) amax = Math.max(amax, Math.abs(y[d]));
    const a = Math.fround(amax);
    const inv = a > 0 ? Math.fround(FP8_E4M3_MAX / a) : 0;
    for (let d = 0; d < D; d++) c[vec * D + d] = e4m3Encode(Math.fround(y[d] * inv));
    s![vec] = Math.fround(a / FP8_E4M3_MAX);
  };
  for (let r = 0; r < R; r++) {
    const pos = x.seqlens[r];
    if (pos < 0 || pos >= M) continue;
    const prep = (src: Float32Array, at: number, w: Float32Array | undefined) => {
      const y = new Float64Array(D);
      let ss = 0;
      for (let d = 0; d < D; d++) {
        y[d] = src[at + d];
        ss += y[d] * y[d];
      }
      if (w) for (let d = 0; d < D; d++) y[d] = round((y[d] / Math.sqrt(ss / D + eps)) * w[d]);
      const z = new Float64Array(D);
      for (let d = 0; d < D; d++) {
        const c = x.cos[pos * half + (d % half)];
        const s = x.sin[pos * half + (d % half)];
        z[d] = round(d < half ? y[d] * c - y[d + half] * s : y[d] * c + y[d - half] * s);
      }
      return z;
    };
    for (let h = 0; h < KV; h++) {
      const vec0 = (r * KV + h) * M;
      write(x.cacheK, x.kScale, vec0 + pos, prep(x.k, (r * KV + h) * D, x.kNorm));
      write(x.cacheV, x.vScale, vec0 + pos, Float64Array.from(x.v.subarray((r * KV + h) * D, (r * KV + h + 1) * D)));
      for (let g = 0; g < G; g++) {
        const at = (r * H + h * G + g) * D;
        const q = prep(x.q, at, x.qNorm);
        qRot.set(q, at);
        const s = new Float64Array(pos + 1);
        let mx = -Infinity;
        for (let p = 0; p <= pos; p++) {
          let acc = 0;
          for (let d = 0; d < D; d++) acc += q[d] * read(x.cacheK, x.kScale, vec0 + p, d);
          s[p] = acc * scale;
          mx = Math.max(mx, s[p]);
        }
        let den = 0;
        for (let p = 0; p <= pos; p++) den += Math.exp(s[p] - mx);
        for (let d = 0; d < D; d++) {
          let o = 0;
          for (let p = 0; p <= pos; p++) o += (Math.exp(s[p] - mx) / den) * read(x.cacheV, x.vScale, vec0 + p, d);
          out[at + d] = round(o);
        }
      }
    }
  }
  return { out, qRot };
}

/** e4m3 bytes and per-vector scales of `x` [N·D] (the quantize op's host rule). */
export function quantizeE4m3Reference(x: Float32Array, headDim: number): { data: Uint8Array; scale: Float32Array } {
  const rows = x.length / headDim;
  const data = new Uint8Array(x.length);
  const scale = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    let amax = 0;
    for (let d = 0; d < headDim; d++) amax = Math.max(amax, Math.abs(x[r * headDim + d]));
    const inv = amax > 0 ? Math.fround(FP8_E4M3_MAX / amax) : 0;
    for (let d = 0; d < headDim; d++) data[r * headDim + d] = e4m3Encode(Math.fround(x[r * headDim + d] * inv));
    scale[r] = Math.fround(amax / FP8_E4M3_MAX);
  }
  return { data, scale };
}

// ---- the graph side -----------------------------------------------------------------------------

/** A decode step's attention inputs, as a KV engine's decode graph has them. */
export interface DecodeAttendInputs extends DecodeAttendCommon {
  /** [R, 1, H·D], before QK-norm and RoPE. */
  query: Tensor;
  /** [R, 1, KV·D], before QK-norm and RoPE. */
  key: Tensor;
  /** [R, 1, KV·D]. */
  value: Tensor;
}

/**
 * A decode step's attention inputs with q, k and v as one packed projection: the output of the
 * layer's q/k/v as one MatMul over their concatenated weights, read in place (no Split).
 */
export interface DecodePackedAttendInputs extends DecodeAttendCommon {
  /** [R, 1, (H + 2·KV)·D] before QK-norm and RoPE: q in columns [0, H·D), k in [H·D, (H + KV)·D), v after. */
  qkv: Tensor;
}

/** The inputs of a decode step's attention besides q, k and v. */
export interface DecodeAttendCommon {
  /** The layer's cache [R, KV, M, D] (the compute dtype, or uint8 e4m3 bytes), bound in place. */
  cacheKey: Tensor;
  cacheValue: Tensor;
  /** fp8 caches: float32 [R, KV, M]. */
  keyScale?: Tensor;
  valueScale?: Tensor;
  /** int32 [R]: each row's new position. */
  seqlens: Tensor;
  /** RoPE tables [maxPositions, D/2] in the compute dtype (non-interleaved). */
  rotary: { cos: Tensor; sin: Tensor };
  /** Qwen3's per-head RMSNorm weights [D], applied to q and k before RoPE. */
  qkNorm?: { q: Tensor; k: Tensor };
}

/** The op's outputs: attention [R, 1, H·D] and the updated cache (and scales). */
export interface DecodeAttendOutputs {
  output: Tensor;
  presentKey: Tensor;
  presentValue: Tensor;
  presentKeyScale?: Tensor;
  presentValueScale?: Tensor;
}

/** The graph side of the kernels: decode-attention and quantize nodes, and the domain to pass to sessions. */
export interface DecodeAttentionOps extends CustomOps {
  /** How the cache is held. */
  cache: DecodeCacheKind;
  /** How the CUDA computes merge a row's chunks (the CPU form computes the host reference either way). */
  combine: DecodeCombine;
  /** The RMSNorm epsilon of the Q/K norm (nodes given `qkNorm`). */
  qkNormEpsilon: number;
  /** The cache tensors' element type: the compute dtype, or uint8 for e4m3. */
  cacheDtype(dtype: DType): DType;
  /** A decode step's attention over the layer's cache (see {@link DecodeAttendInputs}). */
  attend(x: DecodeAttendInputs, heads: { numHeads: number; kvNumHeads: number }): DecodeAttendOutputs;
  /** {@link attend} reading q, k and v from one packed projection (op `DecodeAttentionPacked_*`: the append's row strides skip the other parts). */
  attendPacked(x: DecodePackedAttendInputs, heads: { numHeads: number; kvNumHeads: number }): DecodeAttendOutputs;
  /** e4m3 bytes (uint8, x's shape) and float32 scales (x's shape without the last dim) of a cache in the compute dtype. */
  quantize(x: Tensor): { data: Tensor; scale: Tensor };
  /**
   * Computes whose present was not the past's buffer (the cache copied over first: a whole cache a
   * layer, so a bound engine should see 0), and computes in all.
   */
  stats: { cacheCopies: number; computes: number };
}

/**
 * The decode step's attention as custom ops of a new domain, for graphs run on `provider`: on CUDA
 * their computes launch `kernels` (which must be the kernels whose stream the device's sessions run
 * on), on the CPU they compute {@link decodeAttentionReference} on the host (float32). `cache`
 * `float8e4m3` holds the cache as e4m3 bytes with per-vector scales. `qkNormEpsilon`: the model's
 * RMSNorm epsilon for its Q/K norm (when `attend` gets `qkNorm`). `combine` `fused` (default
 * `separate`): the CUDA computes merge the chunks inside the split kernel (see {@link DecodeCombine});
 * the counters it needs are allocated by the first compute, so run one regular step of the largest
 * batch before a CUDA graph captures.
 */
export function decodeAttentionOps(provider: DeviceKind, kernels?: DecodeAttention, opts: { cache?: DecodeCacheKind; qkNormEpsilon?: number; combine?: DecodeCombine } = {}): DecodeAttentionOps {
  if (provider === 'cuda' && !kernels) throw new Error('decodeAttentionOps: CUDA needs the compiled DecodeAttention kernels (DecodeAttention.compile on the kernels of the device)');
  const cache = opts.cache ?? 'native';
  const fp8 = cache === 'float8e4m3';
  const eps = opts.qkNormEpsilon ?? 1e-6;
  const combine = opts.combine ?? 'separate';
  const family = opFamily({ name: 'decodeAttentionOps', domainPrefix: 'lathe.decode', provider, cudaDtypes: ['bfloat16', 'float16'] });
  const count = (dims: readonly number[]) => dims.reduce((a, b) => a * b, 1);
  const stats = { cacheCopies: 0, computes: 0 };
  const ops = new Map<string, OpDef<object>>();
  const quantizeOps = new Map<DType, OpDef<object>>();
  for (const dt of family.dtypes) {
    const cacheDt: DType = fp8 ? 'uint8' : dt;
    for (const [norm, packed] of [false, true].flatMap((n) => [false, true].map((p) => [n, p] as const))) {
      const name = `DecodeAttention${packed ? 'Packed' : ''}_${dt}_${norm ? 'qknorm' : 'plain'}`;
      // q, k, v (or qkv), seqlens, cos, sin, cacheK, cacheV, [kScale, vScale], [qNorm, kNorm]
      const qkvIns = packed ? 1 : 3;
      const inputs: DType[] = [...new Array<DType>(qkvIns).fill(dt), 'int32', dt, dt, cacheDt, cacheDt, ...(fp8 ? (['float32', 'float32'] as DType[]) : []), ...(norm ? [dt, dt] : [])];
      // out, presentK, presentV, [presentKScale, presentVScale], qRot, oPart, lsePart
      const outputs: DType[] = [dt, cacheDt, cacheDt, ...(fp8 ? (['float32', 'float32'] as DType[]) : []), 'float32', 'float32', 'float32'];
      const op = family.domain.add({
        name,
        inputs,
        outputs,
        provider,
        infer: (ins: TensorType[]) => {
          const q = ins[0];
          const ck = ins[qkvIns + 3];
          const [R, , W] = q.shape;
          const [, KV, M, D] = ck.shape;
          const known = typeof W === 'number' && typeof D === 'number' && typeof KV === 'number';
          const H = known ? W / D - (packed ? 2 * KV : 0) : 'H';
          const G = typeof H === 'number' && typeof KV === 'number' ? H / KV : undefined;
          const C = typeof M === 'number' && G !== undefined ? decodeChunks(M, cache, G) : `decode_chunks_${cache}_${G ?? 'g'}`;
          return [
            { dtype: dt, shape: packed ? [R, 1, typeof H === 'number' && typeof D === 'number' ? H * D : 'HD'] : [...q.shape] },
            { dtype: cacheDt, shape: [...ck.shape] },
            { dtype: cacheDt, shape: [...ck.shape] },
            ...(fp8 ? [0, 1].map(() => ({ dtype: 'float32' as DType, shape: [R, KV, M] })) : []),
            { dtype: 'float32', shape: [R, H, D] },
            { dtype: 'float32', shape: [R, H, C, D] },
            { dtype: 'float32', shape: [R, H, C] },
          ];
        },
        compute: (ctx) => {
          const qkv = ctx.inputs.slice(0, qkvIns);
          const [seqlens, cos, sin, ck, cv] = ctx.inputs.slice(qkvIns, qkvIns + 5);
          const [kS, vS] = fp8 ? ctx.inputs.slice(qkvIns + 5, qkvIns + 7) : [];
          const [qn, kn] = norm ? ctx.inputs.slice(qkvIns + (fp8 ? 7 : 5)) : [];
          const [R, KV, M, D] = ck.dims;
          const H = qkv[0].dims[2] / D - (packed ? 2 * KV : 0);
          const shape: DecodeAttentionShape = { rows: R, numHeads: H, numKvHeads: KV, headDim: D, maxLength: M, dtype: dt, cache };
          const C = decodeChunks(M, cache, H / KV);
          const out = ctx.output(0, [R, 1, H * D]);
          const pk = ctx.output(1, ck.dims);
          const pv = ctx.output(2, cv.dims);
          const pks = fp8 ? ctx.output(3, [R, KV, M]) : 0n;
          const pvs = fp8 ? ctx.output(4, [R, KV, M]) : 0n;
          const s = fp8 ? 5 : 3;
          const qRot = ctx.output(s, [R, H, D]);
          const oPart = ctx.output(s + 1, [R, H, C, D]);
          const lsePart = ctx.output(s + 2, [R, H, C]);
          const cacheBytes = count(ck.dims) * (fp8 ? 1 : L.dtypeBytes(dt));
          stats.computes++;
          if (pk !== ck.data || pv !== cv.data) stats.cacheCopies++;
          if (kernels) {
            // The engine binds each present to its past (the append writes in place); else copy the past over first.
            if (pk !== ck.data) kernels.copy(ck.data, pk, cacheBytes);
            if (pv !== cv.data) kernels.copy(cv.data, pv, cacheBytes);
            if (fp8 && pks !== kS.data) kernels.copy(kS.data, pks, R * KV * M * 4);
            if (fp8 && pvs !== vS.data) kernels.copy(vS.data, pvs, R * KV * M * 4);
            const qkvArgs = packed ? packedQkvArgs(qkv[0].data, shape) : { q: qkv[0].data, k: qkv[1].data, v: qkv[2].data };
            kernels.step(shape, { ...qkvArgs, cacheK: pk, cacheV: pv, kScale: pks, vScale: pvs, seqlens: seqlens.data, cos: cos.data, sin: sin.data, qNorm: qn?.data, kNorm: kn?.data, epsilon: eps, out, qRot, oPart, lsePart }, undefined, undefined, { combine });
            return;
          }
          const host = (t: typeof ck) => (fp8 ? readBytes(t.data, count(t.dims)) : readF32(t.data, count(t.dims)));
          const qkvHost = packed ? unpackQkv(readF32(qkv[0].data, count(qkv[0].dims)), shape) : { q: readF32(qkv[0].data, count(qkv[0].dims)), k: readF32(qkv[1].data, count(qkv[1].dims)), v: readF32(qkv[2].data, count(qkv[2].dims)) };
          const x: DecodeReferenceInputs = {
            ...qkvHost,
            cacheK: host(ck),
            cacheV: host(cv),
            kScale: kS && readF32(kS.data, R * KV * M),
            vScale: vS && readF32(vS.data, R * KV * M),
            seqlens: readI32(seqlens.data, R),
            cos: readF32(cos.data, count(cos.dims)),
            sin: readF32(sin.data, count(sin.dims)),
            qNorm: qn && readF32(qn.data, D),
            kNorm: kn && readF32(kn.data, D),
            epsilon: eps,
          };
          const r = decodeAttentionReference(shape, x);
          writeHost(out, r.out);
          writeHost(pk, x.cacheK);
          writeHost(pv, x.cacheV);
          if (fp8) {
            writeHost(pks, x.kScale!);
            writeHost(pvs, x.vScale!);
          }
          writeHost(qRot, r.qRot);
          writeHost(oPart, new Float32Array(R * H * C * D));
          writeHost(lsePart, new Float32Array(R * H * C));
        },
      });
      ops.set(`${dt}/${norm}/${packed}`, op);
    }
    quantizeOps.set(
      dt,
      family.domain.add({
        name: `QuantizeE4m3_${dt}`,
        inputs: [dt],
        outputs: ['uint8', 'float32'],
        provider,
        infer: ([x]) => [
          { dtype: 'uint8', shape: [...x.shape] },
          { dtype: 'float32', shape: x.shape.slice(0, -1) },
        ],
        compute: (ctx) => {
          const [x] = ctx.inputs;
          const D = x.dims[x.dims.length - 1];
          const rows = count(x.dims) / D;
          const y = ctx.output(0, x.dims);
          const scale = ctx.output(1, x.dims.slice(0, -1));
          if (kernels) {
            kernels.quantize(dt, D, { x: x.data, y, scale, rows });
            return;
          }
          const r = quantizeE4m3Reference(readF32(x.data, count(x.dims)), D);
          writeHost(y, r.data);
          writeHost(scale, r.scale);
        },
      }),
    );
  }
  // The op of x's dtype and norm, after checking the shape and cache the node will get.
  const opFor = (x: DecodeAttendCommon, dt: DType, heads: { numHeads: number; kvNumHeads: number }, packed: boolean): OpDef<object> => {
    family.supports(dt);
    const op = ops.get(`${dt}/${!!x.qkNorm}/${packed}`)!;
    const D = x.cacheKey.shape[3];
    if (typeof D === 'number') {
      const why = decodeAttentionUnsupported({ dtype: dt, headDim: D, numHeads: heads.numHeads, numKvHeads: heads.kvNumHeads, cache }, provider);
      if (why) throw new Error(`decodeAttentionOps: unsupported ${why}`);
    }
    if (fp8 && (!x.keyScale || !x.valueScale)) throw new Error('decodeAttentionOps: an fp8 cache needs keyScale and valueScale');
    if (x.cacheKey.dtype !== (fp8 ? 'uint8' : dt)) throw new Error(`decodeAttentionOps: the cache is ${x.cacheKey.dtype}, expected ${fp8 ? 'uint8 (e4m3)' : dt}`);
    return op;
  };
  const apply = (op: OpDef<object>, qkv: Tensor[], x: DecodeAttendCommon): DecodeAttendOutputs => {
    const ins = [...qkv, x.seqlens, x.rotary.cos, x.rotary.sin, x.cacheKey, x.cacheValue, ...(fp8 ? [x.keyScale!, x.valueScale!] : []), ...(x.qkNorm ? [x.qkNorm.q, x.qkNorm.k] : [])];
    const outs = L.applyOp(op, ins, {});
    return { output: outs[0], presentKey: outs[1], presentValue: outs[2], ...(fp8 ? { presentKeyScale: outs[3], presentValueScale: outs[4] } : {}) };
  };
  const attend = (x: DecodeAttendInputs, heads: { numHeads: number; kvNumHeads: number }): DecodeAttendOutputs => apply(opFor(x, x.query.dtype, heads, false), [x.query, x.key, x.value], x);
  const attendPacked = (x: DecodePackedAttendInputs, heads: { numHeads: number; kvNumHeads: number }): DecodeAttendOutputs => {
    const { numHeads: H, kvNumHeads: KV } = heads;
    const [W, D] = [x.qkv.shape[2], x.cacheKey.shape[3]];
    if (x.qkv.rank !== 3 || (typeof W === 'number' && typeof D === 'number' && W !== (H + 2 * KV) * D)) throw new Error(`decodeAttentionOps.attendPacked: qkv ${x.qkv} is not [R, 1, (${H} + 2·${KV})·${D}] (q, k, v of ${H} query and ${KV} KV heads)`);
    return apply(opFor(x, x.qkv.dtype, heads, true), [x.qkv], x);
  };
  const quantize = (x: Tensor) => {
    const op = quantizeOps.get(x.dtype);
    if (!op) throw new Error(`decodeAttentionOps (${provider}): no quantize kernel for dtype ${x.dtype}`);
    const [data, scale] = L.applyOp(op, [x], {});
    return { data, scale };
  };
  return { domain: family.domain, cache, combine, qkNormEpsilon: eps, stats, cacheDtype: (dt) => (fp8 ? 'uint8' : dt), attend, attendPacked, quantize, check: family.check, dispose: family.dispose };
}

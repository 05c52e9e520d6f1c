/**
 * The CUDA C++ of Lathe's decode attention (one new token per row over a static KV cache), compiled
 * by NVRTC: split-KV ("flash-decoding") so a step reads the cache at bandwidth whatever the batch.
 *
 * Layouts are the KV engine's: the cache [R, KV, M, D] (row r's position p of KV head h at
 * ((r·KV + h)·M + p)·D), bound as both the past and the present of each layer so the new key/value
 * land in place; seqlens int32 [R] holds each row's new position (GroupQueryAttention's seqlens_k);
 * q [R, 1, H·D], k/v [R, 1, KV·D] (or one packed qkv [R, 1, (H + 2·KV)·D]: q, k and v its column
 * ranges, read through row strides); cos/sin [maxPositions, D/2] (non-interleaved RoPE, as the engine's
 * GroupQueryAttention). An fp8 cache holds e4m3 bytes and one float32 scale per (row, KV head,
 * position) for keys and for values ([R, KV, M]): amax/448 of that head's vector.
 *
 * Kernels (T = bf16 or fp16 — q, k, v and the output; C = the cache element, T or fp8; D = 64 or 128;
 * G = query heads per KV head, 1 to 8: nothing in the kernels assumes a power of two):
 * - `da_append_<t>[_fp8]_d<D>`: a CTA of D threads per (row, KV head): the optional per-head RMSNorm
 *   of q and k (Qwen3's q_norm/k_norm), RoPE at the row's position, the rotated queries to a float32
 *   scratch [R, H, D] (rounded to T first, as GroupQueryAttention keeps them), the key and value
 *   written (or quantized) into the cache at that position.
 * - `da_split_<c>_d<D>_g<G>`: a CTA of 128 threads per (chunk of positions, KV head, row), shaped by
 *   {@link decodeSplitPlan}: the scores of all G query heads of the KV head against the chunk's keys
 *   (each key read once, one load a thread: 16 bytes native, 8 e4m3), the chunk's softmax, and P·V;
 *   writes the chunk's normalized output and log-sum-exp. An e4m3 cache goes in chunks of 512
 *   positions up to G 4 (256 past it; a native one 256, 128 past G 4), its per-position scales
 *   loaded at the start (coalesced, off the streaming loops) and applied in the softmax pass; the
 *   value pass's first loads are issued before the softmax, and the P·V rows are summed by warp
 *   shuffles before one [warps][G][D] exchange. The grid covers the cache length M (a CUDA graph
 *   replays the launch); CTAs past the row's length exit.
 * - `da_combine_<t>_d<D>_c<CHUNK>`: merges a row's chunks by their log-sum-exps into the output [R, 1, H·D].
 * - `da_splitc_<c>[_<t>]_d<D>_g<G>`: the split with the combine folded in ("last CTA done"): each CTA
 *   that does not exit counts itself done on an int32 counter per (row, KV head) after its partials
 *   are fenced; the one that completes its row's count resets the counter to 0 and merges the G query
 *   heads' chunks into the output exactly as the combine does (bit-identical), so a step is two
 *   launches. An e4m3 cache's build names T (its output), as `da_splitc_fp8_bf16_d128_g2`.
 * - `da_quantize_<t>_d<D>`: a [N, D] cache in T → e4m3 bytes and per-row scales (the prefill's).
 * - `da_copy32`: word copy, for a present buffer ORT did not alias to the past.
 */

/** Threads of a split (and quantize) CTA. */
export const DECODE_THREADS = 128;
/** Head sizes with a build. */
export const DECODE_HEAD_DIMS = [64, 128] as const;
/** Query heads per KV head with a build (Qwen2.5-7B has 7, Qwen3-14B and Qwen2.5-14B/32B 5). */
export const DECODE_GROUPS = [1, 2, 3, 4, 5, 6, 7, 8] as const;
/** Passes of a split CTA whose cache loads are issued together (`da_split`'s U) where no plan names its own. */
export const DECODE_SPLIT_UNROLL = 4;
/** Largest finite e4m3 value: a vector's amax maps to it. */
export const FP8_E4M3_MAX = 448;

/** Element types with a build, by dtype name, with their C type and kernel-name suffix. */
export const DECODE_TYPES = { bfloat16: { c: '__nv_bfloat16', suffix: 'bf16' }, float16: { c: '__half', suffix: 'fp16' } } as const;

/** How the cache is held: in the compute dtype, or as e4m3 bytes with per-vector scales. */
export type DecodeCacheKind = 'native' | 'float8e4m3';

/** The split kernel's build: positions per CTA, cache elements per thread and load, loads in flight, and its CTA bound. */
export interface DecodeSplitPlan {
  /** Cache positions per CTA (the grid's x is the cache length over it). */
  chunk: number;
  /** Cache elements a thread takes per position, in one load. */
  elems: number;
  /** Passes whose cache loads are issued together (`da_split`'s U). */
  unroll: number;
  /** `__launch_bounds__`' minimum resident CTAs an SM (registers capped to fit), or 0 for none. */
  minBlocks: number;
}

/** Which groups a module builds (see {@link decodeAttentionSourceFor}). */
export interface DecodeSourceOptions {
  /** Query heads per KV head to build splits for (default: every one of {@link DECODE_GROUPS}). */
  groups?: readonly number[];
}

/** `groups` checked against {@link DECODE_GROUPS}, sorted and without repeats (every group when undefined). */
export function decodeGroupsOf(groups?: readonly number[]): number[] {
  if (groups === undefined) return [...DECODE_GROUPS];
  const bad = groups.filter((g) => !(DECODE_GROUPS as readonly number[]).includes(g));
  if (bad.length > 0) throw new Error(`decode attention: no build for ${bad.join(', ')} query heads per KV head (the kernels take ${DECODE_GROUPS.join(', ')})`);
  if (groups.length === 0) throw new Error('decode attention: groups is empty (name at least one of ' + DECODE_GROUPS.join(', ') + ')');
  return [...new Set(groups)].sort((a, b) => a - b);
}

/**
 * The plan of the split kernel for `cache` and `group` query heads per KV head (the same for both head
 * sizes): up to G 4 the fastest variants of `decode-check --phases sweep` at G 2 and G 4 (docs/guides/kernels.md) —
 * an e4m3 cache 512 positions a CTA, 8 bytes a load, 8 passes in flight (G ≤ 2 also bounded to 8 CTAs an SM), a
 * native one 256 positions, 16-byte loads, 4 passes, 8 CTAs an SM; G 1 and 3 take their neighbours'. Past G 4 (not
 * swept) the earlier plan: 256 e4m3 and 128 native positions, 8 elements a thread, 4 passes, no bound.
 */
export function decodeSplitPlan(group: number, cache: DecodeCacheKind = 'native'): DecodeSplitPlan {
  if (cache === 'float8e4m3') return group <= 4 ? { chunk: 512, elems: 8, unroll: 8, minBlocks: group <= 2 ? 8 : 0 } : { chunk: 256, elems: 8, unroll: DECODE_SPLIT_UNROLL, minBlocks: 0 };
  return group <= 4 ? { chunk: 256, elems: 8, unroll: 4, minBlocks: 8 } : { chunk: 128, elems: 8, unroll: DECODE_SPLIT_UNROLL, minBlocks: 0 };
}

/** Cache positions per split CTA of `cache` at `group` (the chunk count and the combine follow it). */
export function decodeSplitChunk(cache: DecodeCacheKind, group: number): number {
  return decodeSplitPlan(group, cache).chunk;
}

/** Every chunk size a plan of {@link DECODE_GROUPS} uses, ascending (one combine build each). */
export function decodeSplitChunks(): number[] {
  const all = DECODE_GROUPS.flatMap((g) => (['native', 'float8e4m3'] as const).map((c) => decodeSplitChunk(c, g)));
  return [...new Set(all)].sort((a, b) => a - b);
}

/**
 * Dynamic shared memory of a split CTA (bytes): scores [G][chunk], max/sum per head, each warp's P·V
 * partials [warps][G][D]; e4m3 adds the chunk's key and value scales [2][chunk]. `chunk` defaults to
 * the plan's (a sweep variant passes its own).
 */
export function decodeSplitSmem(headDim: number, group: number, cache: DecodeCacheKind = 'native', chunk: number = decodeSplitPlan(group, cache).chunk): number {
  const scales = cache === 'float8e4m3' ? 2 * chunk : 0;
  return 4 * (group * chunk + 2 * group + (DECODE_THREADS / 32) * group * headDim + scales);
}

/** Dynamic shared memory of an append CTA (bytes): the RoPE partner exchange and the block reductions. */
export function decodeAppendSmem(headDim: number): number {
  return 4 * (headDim + 32);
}

type TypeName = keyof typeof DECODE_TYPES;

/** Kernel names, e.g. `da_split_fp8_d128_g2`, `da_combine_bf16_d128_c256`. */
export const decodeKernelName = {
  append: (t: TypeName, cache: DecodeCacheKind, d: number) => `da_append_${DECODE_TYPES[t].suffix}${cache === 'float8e4m3' ? '_fp8' : ''}_d${d}`,
  split: (t: TypeName, cache: DecodeCacheKind, d: number, g: number) => `da_split_${cache === 'float8e4m3' ? 'fp8' : DECODE_TYPES[t].suffix}_d${d}_g${g}`,
  combine: (t: TypeName, d: number, chunk: number) => `da_combine_${DECODE_TYPES[t].suffix}_d${d}_c${chunk}`,
  splitFused: (t: TypeName, cache: DecodeCacheKind, d: number, g: number) => `da_splitc_${cache === 'float8e4m3' ? `fp8_${DECODE_TYPES[t].suffix}` : DECODE_TYPES[t].suffix}_d${d}_g${g}`,
  quantize: (t: TypeName, d: number) => `da_quantize_${DECODE_TYPES[t].suffix}_d${d}`,
  copy: () => 'da_copy32',
};

/** A split build's `__launch_bounds__` arguments: the CTA's threads, and the plan's minimum CTAs an SM when it has one. */
function splitBounds(minBlocks: number): string {
  return minBlocks > 0 ? `DA_THREADS, ${minBlocks}` : 'DA_THREADS';
}

/** The split's entry point for cache element `C`, built as {@link decodeSplitPlan} says. */
function splitEntry(t: TypeName, C: string, cache: DecodeCacheKind, D: number, G: number): string {
  const { chunk, elems, unroll, minBlocks } = decodeSplitPlan(G, cache);
  return `extern "C" __global__ void __launch_bounds__(${splitBounds(minBlocks)}) ${decodeKernelName.split(t, cache, D, G)}(const float* q, const ${C}* cache_k, const ${C}* cache_v, const float* k_scale, const float* v_scale, const int* seqlens, float* o_part, float* lse_part, int M, int KV, int n_chunks, float scale) { da_split<${C}, ${D}, ${G}, ${chunk}, ${elems}, float, false, ${unroll}>(q, cache_k, cache_v, k_scale, v_scale, seqlens, o_part, lse_part, M, KV, n_chunks, scale); }`;
}

/** The split with the combine folded in: `out` [R, 1, H·D] in T and `counters` int32 [R·KV] (zero between launches) besides the split's arguments. */
function splitFusedEntry(t: TypeName, C: string, cache: DecodeCacheKind, D: number, G: number): string {
  const { chunk, elems, unroll, minBlocks } = decodeSplitPlan(G, cache);
  const T = DECODE_TYPES[t].c;
  return `extern "C" __global__ void __launch_bounds__(${splitBounds(minBlocks)}) ${decodeKernelName.splitFused(t, cache, D, G)}(const float* q, const ${C}* cache_k, const ${C}* cache_v, const float* k_scale, const float* v_scale, const int* seqlens, float* o_part, float* lse_part, ${T}* out, int* counters, int M, int KV, int n_chunks, float scale) { da_split<${C}, ${D}, ${G}, ${chunk}, ${elems}, ${T}, true, ${unroll}>(q, cache_k, cache_v, k_scale, v_scale, seqlens, o_part, lse_part, M, KV, n_chunks, scale, out, counters); }`;
}

function entryPoints(groups: readonly number[]): string {
  const out: string[] = [];
  const fp8 = 'unsigned char';
  // A combine for each chunk size a cache kind's split uses.
  const chunks = decodeSplitChunks();
  for (const [t, { c: T }] of Object.entries(DECODE_TYPES) as [TypeName, (typeof DECODE_TYPES)[TypeName]][]) {
    for (const D of DECODE_HEAD_DIMS) {
      for (const [C, cache] of [
        [T, 'native'],
        [fp8, 'float8e4m3'],
      ] as const) {
        out.push(
          `extern "C" __global__ void __launch_bounds__(${D}) ${decodeKernelName.append(t, cache, D)}(const ${T}* q, const ${T}* k, const ${T}* v, ${C}* cache_k, ${C}* cache_v, float* k_scale, float* v_scale, const int* seqlens, const ${T}* cos_t, const ${T}* sin_t, const ${T}* q_norm, const ${T}* k_norm, float eps, float* q_out, int M, int H, int KV, int q_stride, int kv_stride) { da_append<${T}, ${C}, ${D}>(q, k, v, cache_k, cache_v, k_scale, v_scale, seqlens, cos_t, sin_t, q_norm, k_norm, eps, q_out, M, H, KV, q_stride, kv_stride); }`,
        );
      }
      for (const G of groups) out.push(splitEntry(t, T, 'native', D, G));
      for (const G of groups) out.push(splitFusedEntry(t, T, 'native', D, G), splitFusedEntry(t, fp8, 'float8e4m3', D, G));
      for (const chunk of chunks) {
        out.push(
          `extern "C" __global__ void __launch_bounds__(${D}) ${decodeKernelName.combine(t, D, chunk)}(const float* o_part, const float* lse_part, const int* seqlens, ${T}* out, int M, int H, int n_chunks) { da_combine<${T}, ${D}, ${chunk}>(o_part, lse_part, seqlens, out, M, H, n_chunks); }`,
        );
      }
      out.push(
        `extern "C" __global__ void __launch_bounds__(DA_THREADS) ${decodeKernelName.quantize(t, D)}(const ${T}* x, unsigned char* y, float* scale, i64 rows) { da_quantize<${T}, ${D}>(x, y, scale, rows); }`,
      );
    }
  }
  // The fp8 split reads no T (its queries are float32): one build per head size and group.
  for (const D of DECODE_HEAD_DIMS) for (const G of groups) out.push(splitEntry('bfloat16', fp8, 'float8e4m3', D, G));
  out.push(`extern "C" __global__ void __launch_bounds__(DA_THREADS) ${decodeKernelName.copy()}(const unsigned* src, unsigned* dst, i64 n) { for (i64 i = (i64)blockIdx.x * DA_THREADS + threadIdx.x; i < n; i += (i64)gridDim.x * DA_THREADS) dst[i] = src[i]; }`);
  return out.join('\n');
}

/** The kernels' templates without their entry points (the CPU emulation test instantiates them itself). */
export const decodeAttentionCore = String.raw`
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#ifndef DA_EMULATION
#include <cuda_fp8.h>
#endif

#ifndef DA_SHARED
#define DA_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

#define DA_THREADS ${DECODE_THREADS}
#define DA_FP8_MAX ${FP8_E4M3_MAX}.0f

typedef long long i64;

template <typename T> __device__ __forceinline__ float da_f(T x);
template <> __device__ __forceinline__ float da_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float da_f<__half>(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T da_t(float x);
template <> __device__ __forceinline__ __nv_bfloat16 da_t<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half da_t<__half>(float x) { return __float2half(x); }
// x rounded to T and back: the value a T tensor would hold.
template <typename T> __device__ __forceinline__ float da_round(float x) { return da_f<T>(da_t<T>(x)); }

#ifndef DA_EMULATION
// e4m3 with saturation to ±448 (round to nearest even), and two e4m3 bytes (low byte first) to floats.
__device__ __forceinline__ unsigned char fp8_from(float x) { return (unsigned char)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
__device__ __forceinline__ float2 fp8x2_to(unsigned short v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);
  return __half22float2(__half2(h));
}
#endif

__device__ __forceinline__ float da_neg_inf() { return __int_as_float(0xff800000); }
// A float of another CTA's writes: through L2 (L1 is not coherent across SMs) when CG.
template <bool CG> __device__ __forceinline__ float da_ld(const float* p) {
  if constexpr (CG) return __ldcg(p);
  else return *p;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// Sum (or max) over a block of N threads (N a multiple of 32), with 32 floats of scratch; every thread gets it.
template <int N, bool MAX>
__device__ __forceinline__ float block_reduce(float x, float* scratch) {
  x = MAX ? warp_max(x) : warp_sum(x);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float y = scratch[0];
  for (int w = 1; w < N / 32; ++w) y = MAX ? fmaxf(y, scratch[w]) : y + scratch[w];
  __syncthreads();
  return y;
}

// Writes element d of a head vector (already rounded to T) at cache row 'at': as T, or quantized by
// the vector's amax (every thread of the block takes part in the reduction).
template <typename T, typename C, int D>
__device__ __forceinline__ void da_store(C* cache, float* scale, i64 at, int d, float x, float* scratch) {
  if constexpr (sizeof(C) == 1) {
    const float amax = block_reduce<D, true>(fabsf(x), scratch);
    const float inv = amax > 0.0f ? DA_FP8_MAX / amax : 0.0f;
    cache[at * D + d] = fp8_from(x * inv);
    if (d == 0) scale[at] = amax / DA_FP8_MAX;
  } else {
    cache[at * D + d] = da_t<T>(x);
  }
}

// q_stride and kv_stride: elements between rows of q and of k/v (H·D and KV·D for separate tensors;
// (H + 2·KV)·D when q, k and v are column ranges of one packed [R, 1, (H + 2·KV)·D] projection).
template <typename T, typename C, int D>
__device__ void da_append(const T* q, const T* k, const T* v, C* cache_k, C* cache_v, float* k_scale, float* v_scale, const int* seqlens, const T* cos_t, const T* sin_t,
                          const T* q_norm, const T* k_norm, float eps, float* q_out, int M, int H, int KV, int q_stride, int kv_stride) {
  DA_SHARED(smem);
  float* part = reinterpret_cast<float*>(smem);  // [D]: the RoPE partner exchange
  float* scratch = part + D;                     // [32]: block reductions
  const int r = blockIdx.x, h = blockIdx.y, d = threadIdx.x, G = H / KV;
  const int pos = seqlens[r];
  if (pos < 0 || pos >= M) return;
  constexpr int HALF = D / 2;
  const float c = da_f<T>(cos_t[(i64)pos * HALF + d % HALF]), s = da_f<T>(sin_t[(i64)pos * HALF + d % HALF]);
  const i64 at = ((i64)r * KV + h) * M + pos;
  // The group's G query heads, then the key head: norm, RoPE, rounded to T.
  for (int g = 0; g <= G; ++g) {
    const bool key = g == G;
    const T* w = key ? k_norm : q_norm;
    float x = da_f<T>(key ? k[(i64)r * kv_stride + h * D + d] : q[(i64)r * q_stride + (h * G + g) * D + d]);
    if (w) {
      const float ss = block_reduce<D, false>(x * x, scratch);
      x = da_round<T>(x * rsqrtf(ss / D + eps) * da_f<T>(w[d]));
    }
    part[d] = x;
    __syncthreads();
    const float other = part[(d + HALF) % D];
    __syncthreads();
    const float y = da_round<T>(d < HALF ? x * c - other * s : x * c + other * s);
    if (key) da_store<T, C, D>(cache_k, k_scale, at, d, y, scratch);
    else q_out[((i64)r * H + h * G + g) * D + d] = y;
  }
  da_store<T, C, D>(cache_v, v_scale, at, d, da_f<T>(v[(i64)r * kv_stride + h * D + d]), scratch);
}

// E cache elements as one load (16 or 8 bytes), and unpacked to floats.
template <int BYTES> struct RawBytes { typedef uint4 t; };
template <> struct RawBytes<8> { typedef uint2 t; };
template <typename C, int E>
__device__ __forceinline__ void unpack_e(const typename RawBytes<E * sizeof(C)>::t& u, float (&f)[E]) {
  if constexpr (sizeof(C) == 1) {
    const unsigned short* e = reinterpret_cast<const unsigned short*>(&u);
#pragma unroll
    for (int i = 0; i < E / 2; ++i) {
      const float2 p = fp8x2_to(e[i]);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  } else {
    const C* e = reinterpret_cast<const C*>(&u);
#pragma unroll
    for (int i = 0; i < E; ++i) f[i] = da_f<C>(e[i]);
  }
}

// CHUNK positions a CTA, E elements a thread (one load), the e4m3 scales applied in the softmax pass,
// and the P·V partial rows summed by shuffles within each warp first.
// FUSED: the combine folded in — the CTA that completes its (row, KV head)'s count of done chunks
// merges them into out (T) and resets the counter; a row of length 0 gets zeros from its chunk 0.
template <int D, int CHUNK, bool CG>
__device__ __forceinline__ float da_merge(const float* o_part, const float* lse_part, i64 rh, int len, int n_chunks, int d);
// U: passes whose loads are issued together (the builds a step launches take their plan's; the sweep varies it).
template <typename C, int D, int G, int CHUNK, int E, typename T = float, bool FUSED = false, int U = ${DECODE_SPLIT_UNROLL}>
__device__ void da_split(const float* q, const C* cache_k, const C* cache_v, const float* k_scale, const float* v_scale, const int* seqlens, float* o_part, float* lse_part,
                         int M, int KV, int n_chunks, float scale, T* out = nullptr, int* counters = nullptr) {
  constexpr int TPR = D / E;               // threads per cache row
  constexpr int RPI = DA_THREADS / TPR;    // cache rows per pass of the block
  constexpr int W = DA_THREADS / 32;       // warps
  constexpr bool FP8 = sizeof(C) == 1;
  static_assert(TPR <= 32 && 32 % TPR == 0, "a cache row's threads lie in one warp");
  typedef typename RawBytes<E * sizeof(C)>::t Raw;
  DA_SHARED(smem);
  float* sc = reinterpret_cast<float*>(smem);  // [G][CHUNK]: scores, then exp(score − max) (× the value scale)
  float* ml = sc + G * CHUNK;                  // [G][2]: max, sum
  float* red = ml + 2 * G;                     // [W][G][D]: each warp's P·V partials
  float* ksh = red + W * G * D;                // e4m3 [2][CHUNK]: the chunk's key and value scales
  float* vsh = ksh + CHUNK;
  const int c = blockIdx.x, h = blockIdx.y, r = blockIdx.z, tid = threadIdx.x;
  const int len = min(seqlens[r] + 1, M);
  const int start = c * CHUNK;
  if (start >= len) {
    if constexpr (FUSED)
      if (len <= 0 && c == 0)
        for (int e = tid; e < G * D; e += DA_THREADS) out[((i64)r * KV * G + h * G) * D + e] = da_t<T>(0.0f);
    return;
  }
  const int n = min(CHUNK, len - start);
  const int sub = tid % TPR, row = tid / TPR, d0 = sub * E;
  const int warp = tid / 32, lane = tid % 32;
  const int H = KV * G;
  const i64 base = ((i64)r * KV + h) * M + start;
  // The scales' loads go out first and land in shared memory after the key pass, off the softmax's path.
  constexpr int SPT = FP8 ? (CHUNK + DA_THREADS - 1) / DA_THREADS : 1;
  float ksr[SPT], vsr[SPT];
  if constexpr (FP8) {
#pragma unroll
    for (int i = 0; i < SPT; ++i) {
      const int j = tid + i * DA_THREADS;
      ksr[i] = j < n ? k_scale[base + j] : 0.0f;
      vsr[i] = j < n ? v_scale[base + j] : 0.0f;
    }
  }
  float qr[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int i = 0; i < E; ++i) qr[g][i] = q[((i64)r * H + h * G + g) * D + d0 + i] * scale;
  const Raw* K = reinterpret_cast<const Raw*>(cache_k);
  const Raw* V = reinterpret_cast<const Raw*>(cache_v);

  // Scores (unscaled by the key scale): a row's TPR threads each take E elements, then sum across them.
  for (int j0 = 0; j0 < n; j0 += RPI * U) {
    Raw raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * RPI + row;
      raw[u] = j < n ? K[(base + j) * TPR + sub] : Raw{};
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * RPI + row;
      float f[E];
      unpack_e<C, E>(raw[u], f);
      float p[G];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < E; ++i) a += qr[g][i] * f[i];
        p[g] = a;
      }
#pragma unroll
      for (int o = TPR / 2; o > 0; o >>= 1)
#pragma unroll
        for (int g = 0; g < G; ++g) p[g] += __shfl_xor_sync(0xffffffffu, p[g], o);
      if (sub == 0 && j < n)
#pragma unroll
        for (int g = 0; g < G; ++g) sc[g * CHUNK + j] = p[g];
    }
  }
  if constexpr (FP8) {
#pragma unroll
    for (int i = 0; i < SPT; ++i) {
      const int j = tid + i * DA_THREADS;
      if (j < CHUNK) {
        ksh[j] = ksr[i];
        vsh[j] = vsr[i];
      }
    }
  }
  // The value pass's first loads go out before the softmax (they do not depend on it).
  Raw raw_v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int j = u * RPI + row;
    raw_v[u] = j < n ? V[(base + j) * TPR + sub] : Raw{};
  }
  __syncthreads();

  // The chunk's softmax, a warp per head, with the key scales in and the value scales folded into the weights.
  for (int g = warp; g < G; g += W) {
    float m = da_neg_inf();
    for (int j = lane; j < n; j += 32) {
      const float s = FP8 ? sc[g * CHUNK + j] * ksh[j] : sc[g * CHUNK + j];
      sc[g * CHUNK + j] = s;
      m = fmaxf(m, s);
    }
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float e = __expf(sc[g * CHUNK + j] - m);
      sc[g * CHUNK + j] = FP8 ? e * vsh[j] : e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) {
      ml[2 * g] = m;
      ml[2 * g + 1] = l;
    }
  }
  __syncthreads();

  // P·V: each thread its E columns over its rows; the rows of a warp summed by shuffles, the warps through shared memory.
  float acc[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int i = 0; i < E; ++i) acc[g][i] = 0.0f;
  for (int j0 = 0; j0 < n; j0 += RPI * U) {
    if (j0 > 0)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = j0 + u * RPI + row;
        raw_v[u] = j < n ? V[(base + j) * TPR + sub] : Raw{};
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * RPI + row;
      if (j >= n) continue;
      float f[E];
      unpack_e<C, E>(raw_v[u], f);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float p = sc[g * CHUNK + j];
#pragma unroll
        for (int i = 0; i < E; ++i) acc[g][i] += p * f[i];
      }
    }
  }
#pragma unroll
  for (int o = TPR; o < 32; o <<= 1)
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int i = 0; i < E; ++i) acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], o);
  if (lane < TPR)
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int i = 0; i < E; ++i) red[(warp * G + g) * D + d0 + i] = acc[g][i];
  __syncthreads();
  for (int e = tid; e < G * D; e += DA_THREADS) {
    const int g = e / D, d = e % D;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) o += red[(w * G + g) * D + d];
    const i64 at = ((i64)r * H + h * G + g) * n_chunks + c;
    o_part[at * D + d] = o / ml[2 * g + 1];
    if (d == 0) lse_part[at] = ml[2 * g] + logf(ml[2 * g + 1]);
  }
  if constexpr (FUSED) {
    // Every thread's partials visible device-wide before thread 0 counts the CTA done.
    __threadfence();
    __syncthreads();
    int* last = reinterpret_cast<int*>(sc);  // the scores are no longer read
    if (tid == 0) {
      int* counter = counters + (i64)r * KV + h;
      const int done = atomicAdd(counter, 1);
      const bool is_last = done == (len + CHUNK - 1) / CHUNK - 1;
      // Every other CTA of the row has counted: the next layer and the next graph replay find 0.
      if (is_last) *counter = 0;
      __threadfence();
      *last = is_last;
    }
    __syncthreads();
    if (!*last) return;
    for (int e = tid; e < G * D; e += DA_THREADS) {
      const int g = e / D, d = e % D;
      const i64 rh = (i64)r * H + h * G + g;
      out[rh * D + d] = da_t<T>(da_merge<D, CHUNK, true>(o_part, lse_part, rh, len, n_chunks, d));
    }
  }
}

// Element d of query head rh (r·H + head) merged over the ceil(len / CHUNK) chunks of its row: the chunks' outputs weighted by exp(lse − max lse).
template <int D, int CHUNK, bool CG>
__device__ __forceinline__ float da_merge(const float* o_part, const float* lse_part, i64 rh, int len, int n_chunks, int d) {
  const int n = (len + CHUNK - 1) / CHUNK;
  const float* L = lse_part + rh * n_chunks;
  float mx = da_neg_inf();
  for (int c = 0; c < n; ++c) mx = fmaxf(mx, da_ld<CG>(L + c));
  float num = 0.0f, den = 0.0f;
  for (int c = 0; c < n; ++c) {
    const float w = __expf(da_ld<CG>(L + c) - mx);
    den += w;
    num += w * da_ld<CG>(o_part + (rh * n_chunks + c) * D + d);
  }
  return num / den;
}

// A CTA of D threads per (row, query head).
template <typename T, int D, int CHUNK>
__device__ void da_combine(const float* o_part, const float* lse_part, const int* seqlens, T* out, int M, int H, int n_chunks) {
  const int rh = blockIdx.x, r = rh / H, d = threadIdx.x;
  const int len = min(seqlens[r] + 1, M);
  if (len <= 0) {
    out[(i64)rh * D + d] = da_t<T>(0.0f);
    return;
  }
  out[(i64)rh * D + d] = da_t<T>(da_merge<D, CHUNK, false>(o_part, lse_part, rh, len, n_chunks, d));
}

// A warp per cache row of D elements: e4m3 bytes scaled by the row's amax, and the scale (amax/448).
template <typename T, int D>
__device__ void da_quantize(const T* x, unsigned char* y, float* scale, i64 rows) {
  constexpr int E = D / 32;
  const i64 row = (i64)blockIdx.x * (DA_THREADS / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float v[E];
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    v[e] = da_f<T>(x[row * D + lane * E + e]);
    amax = fmaxf(amax, fabsf(v[e]));
  }
  amax = warp_max(amax);
  const float inv = amax > 0.0f ? DA_FP8_MAX / amax : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) y[row * D + lane * E + e] = fp8_from(v[e] * inv);
  if (lane == 0) scale[row] = amax / DA_FP8_MAX;
}
`;

/**
 * The source of a module: every kernel for every element type, cache kind and head size, with the
 * splits of `opts.groups` only (default: every group of {@link DECODE_GROUPS}).
 */
export function decodeAttentionSourceFor(opts: DecodeSourceOptions = {}): string {
  return `${decodeAttentionCore}\n${entryPoints(decodeGroupsOf(opts.groups))}\n`;
}

/** The whole source: every kernel for every element type, cache kind, head size and group. */
export const decodeAttentionSource = decodeAttentionSourceFor();

// ---- the split's tuning sweep (decode-check --phases sweep) ------------------------------------

/** One build of `da_split` for the tuning sweep: the template's parameters and the entry's `__launch_bounds__` minimum. */
export interface DecodeSplitVariant {
  cache: DecodeCacheKind;
  /** The element type of a native cache (an e4m3 split reads no T; its variants name bfloat16). */
  dtype: TypeName;
  headDim: number;
  group: number;
  /** Cache positions per CTA. */
  chunk: number;
  /** Cache elements a thread takes per position, in one load (8 or 16 bytes). */
  elems: number;
  /** Passes whose loads are issued together (`da_split`'s U). */
  unroll: number;
  /** `__launch_bounds__`'s minimum resident CTAs an SM, or 0 for none. */
  minBlocks: number;
}

/** The values the sweep crosses: chunk and elements a thread by cache kind, then loads issued together and the CTAs-an-SM bound. */
export const DECODE_SWEEP_SPACE = {
  float8e4m3: { chunk: [128, 256, 512], elems: [8, 16] },
  native: { chunk: [64, 128, 256], elems: [8] },
  unroll: [2, 4, 8],
  minBlocks: [0, 4, 8],
} as const;

/** The variant a step launches today for `cache`, `group` and `headDim` ({@link decodeSplitPlan}'s build). */
export function decodeSplitDefaultVariant(cache: DecodeCacheKind, group: number, headDim: number, dtype: TypeName = 'bfloat16'): DecodeSplitVariant {
  return { cache, dtype, headDim, group, ...decodeSplitPlan(group, cache) };
}

/** Whether two variants are the same build. */
export function sameDecodeSplitVariant(a: DecodeSplitVariant, b: DecodeSplitVariant): boolean {
  return a.cache === b.cache && a.dtype === b.dtype && a.headDim === b.headDim && a.group === b.group && a.chunk === b.chunk && a.elems === b.elems && a.unroll === b.unroll && a.minBlocks === b.minBlocks;
}

/** Every variant of {@link DECODE_SWEEP_SPACE} for `cache`, `group` and `headDim`, the default first. */
export function decodeSplitSweepVariants(cache: DecodeCacheKind, group: number, headDim: number, dtype: TypeName = 'bfloat16'): DecodeSplitVariant[] {
  const def = decodeSplitDefaultVariant(cache, group, headDim, dtype);
  const out = [def];
  const { chunk: chunks, elems: elemsList } = DECODE_SWEEP_SPACE[cache];
  for (const chunk of chunks)
    for (const elems of elemsList)
      for (const unroll of DECODE_SWEEP_SPACE.unroll)
        for (const minBlocks of DECODE_SWEEP_SPACE.minBlocks) {
          const v: DecodeSplitVariant = { cache, dtype, headDim, group, chunk, elems, unroll, minBlocks };
          if (!sameDecodeSplitVariant(v, def)) out.push(v);
        }
  return out;
}

/** A sweep variant's entry point, e.g. `da_sweep_fp8_d128_g2_c256_e16_u4_b0`. */
export function decodeSweepKernelName(v: DecodeSplitVariant): string {
  const c = v.cache === 'float8e4m3' ? 'fp8' : DECODE_TYPES[v.dtype].suffix;
  return `da_sweep_${c}_d${v.headDim}_g${v.group}_c${v.chunk}_e${v.elems}_u${v.unroll}_b${v.minBlocks}`;
}

/** The sweep's combine into float32 (so variants compare without T's rounding), e.g. `da_sweep_combine_f32_d128_c256`. */
export function decodeSweepCombineName(headDim: number, chunk: number): string {
  return `da_sweep_combine_f32_d${headDim}_c${chunk}`;
}

/** Why `v` cannot be built (a thread's load is not 8 or 16 bytes, or a cache row's threads do not tile a warp), or undefined. */
export function decodeSplitVariantInvalid(v: DecodeSplitVariant): string | undefined {
  const bytes = v.elems * (v.cache === 'float8e4m3' ? 1 : 2);
  if (bytes !== 8 && bytes !== 16) return `${v.elems} elements a thread are ${bytes} bytes (a load takes 8 or 16)`;
  const tpr = v.headDim / v.elems;
  if (!Number.isInteger(tpr) || tpr > 32 || 32 % tpr !== 0) return `${v.headDim / v.elems} threads a cache row (must divide 32)`;
  if (v.unroll < 1 || v.chunk < 1 || v.minBlocks < 0) return `unroll ${v.unroll}, chunk ${v.chunk}, min blocks ${v.minBlocks}`;
  if (!(DECODE_GROUPS as readonly number[]).includes(v.group)) return `group ${v.group}`;
  return undefined;
}

/**
 * A module of the sweep's `variants` (the split's arguments, as {@link decodeKernelName}'s split) from
 * the same `da_split` template the step's builds instantiate, and a float32 combine for each of their
 * (head size, chunk). Its own module, so a variant that fails to compile leaves the step's kernels alone.
 */
export function decodeSplitSweepSource(variants: readonly DecodeSplitVariant[]): string {
  const out: string[] = [];
  const names = new Set<string>();
  const combines = new Map<string, [number, number]>();
  for (const v of variants) {
    const why = decodeSplitVariantInvalid(v);
    if (why) throw new Error(`decodeSplitSweepSource: ${decodeSweepKernelName(v)}: ${why}`);
    const name = decodeSweepKernelName(v);
    if (names.has(name)) continue;
    names.add(name);
    const C = v.cache === 'float8e4m3' ? 'unsigned char' : DECODE_TYPES[v.dtype].c;
    const bounds = splitBounds(v.minBlocks);
    out.push(
      `extern "C" __global__ void __launch_bounds__(${bounds}) ${name}(const float* q, const ${C}* cache_k, const ${C}* cache_v, const float* k_scale, const float* v_scale, const int* seqlens, float* o_part, float* lse_part, int M, int KV, int n_chunks, float scale) { da_split<${C}, ${v.headDim}, ${v.group}, ${v.chunk}, ${v.elems}, float, false, ${v.unroll}>(q, cache_k, cache_v, k_scale, v_scale, seqlens, o_part, lse_part, M, KV, n_chunks, scale); }`,
    );
    combines.set(`${v.headDim}/${v.chunk}`, [v.headDim, v.chunk]);
  }
  for (const [D, chunk] of combines.values()) {
    out.push(
      `extern "C" __global__ void __launch_bounds__(${D}) ${decodeSweepCombineName(D, chunk)}(const float* o_part, const float* lse_part, const int* seqlens, float* out, int M, int H, int n_chunks) { da_combine<float, ${D}, ${chunk}>(o_part, lse_part, seqlens, out, M, H, n_chunks); }`,
    );
  }
  // float as a combine's output type: the merge written as it is computed.
  const floatOut = 'template <> __device__ __forceinline__ float da_f<float>(float x) { return x; }\ntemplate <> __device__ __forceinline__ float da_t<float>(float x) { return x; }';
  return `${decodeAttentionCore}\n${floatOut}\n${out.join('\n')}\n`;
}

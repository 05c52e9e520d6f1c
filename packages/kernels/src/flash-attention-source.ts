/**
 * The CUDA C++ of Lathe's flash attention (FlashAttention-2's algorithm), compiled by NVRTC. Tensor
 * cores through `nvcuda::wmma` (bf16/fp16 16×16×16 fragments, fp32 accumulators): fragments are
 * loaded from and stored to shared memory, and every elementwise step (masking, softmax, dS) reads
 * plain shared-memory tiles, so no fragment layout is assumed — the simplest tensor-core form to
 * get right without a device at hand.
 *
 * Layouts are GroupQueryAttention's: q/out [B, S, H, D], k/v [B, S, KV, D] (contiguous), right-padded
 * rows of length seqlens_k[b] + 1, causal; the log-sum-exp and D = rowsum(dO ∘ O) are fp32 [B, H, S].
 * Query rows past a row's length are padding: the forward writes 0 there (output and log-sum-exp)
 * and the backward gives them no gradient.
 *
 * Kernels (T = bf16 or fp16, D = 64 or 128; names `<kernel>_<bf16|fp16>_d<D>`):
 * - `flash_fwd`: a CTA per (64 query rows, head, batch row). Pass 1 computes each row's max and sum
 *   of exp over the key tiles (the log-sum-exp), pass 2 accumulates exp(s − lse)·V in wmma
 *   accumulators: two passes over QKᵀ instead of rescaling O online, because a wmma accumulator's
 *   rows cannot be rescaled without knowing its layout.
 * - `flash_lse`: pass 1 alone (the log-sum-exp), for the backward after GroupQueryAttention's forward.
 * - `flash_bwd_pre`: D per row, and zeroes the fp32 dQ accumulator.
 * - `flash_bwd`: a CTA per (64 keys, KV head, batch row), looping over the G query heads of the KV
 *   head and the query tiles at or below the diagonal: P rebuilt from the log-sum-exp, dS = P ∘ (dP − D)
 *   in fp32 from P as rounded to T, P and dS rounded to T for their products; dK and dV accumulate
 *   in registers (the G-head sum inside the CTA), dQ partials go to the fp32 accumulator by atomicAdd.
 * - `flash_bwd_dq`: the fp32 dQ accumulator to T.
 */

/** Query rows per tile (4 warps × 16 rows). */
export const FLASH_BM = 64;
/** Keys per tile. */
export const FLASH_BN = 64;
/** Threads per CTA. */
export const FLASH_THREADS = 128;
/** Head sizes with a build. */
export const FLASH_HEAD_DIMS = [64, 128] as const;

/** Element types with a build, by dtype name, with their C type and kernel-name suffix. */
export const FLASH_TYPES = { bfloat16: { c: '__nv_bfloat16', suffix: 'bf16' }, float16: { c: '__half', suffix: 'fp16' } } as const;

/** Dynamic shared memory of a forward CTA (bytes): Q, K, V tiles, scores, P and a per-warp scratch. */
export function flashForwardSmem(headDim: number): number {
  const ldt = headDim + 8;
  return (FLASH_BM + 2 * FLASH_BN) * ldt * 2 + FLASH_BM * (FLASH_BN + 4) * 4 + FLASH_BM * (FLASH_BN + 8) * 2 + (FLASH_THREADS / 32) * 256 * 4;
}

/**
 * Dynamic shared memory of a backward CTA (bytes): K, V, Q, dO tiles, one fp32 tile (S, then dP), P
 * and dS, L and D, scratch — 107.5 KB at head size 128, so two CTAs fit an sm_90 SM.
 */
export function flashBackwardSmem(headDim: number): number {
  const ldt = headDim + 8;
  return (2 * FLASH_BN + 2 * FLASH_BM) * ldt * 2 + FLASH_BM * (FLASH_BN + 4) * 4 + 2 * FLASH_BM * (FLASH_BN + 8) * 2 + 2 * FLASH_BM * 4 + (FLASH_THREADS / 32) * 256 * 4;
}

/** The kernel name for a dtype and head size, e.g. `flash_fwd_bf16_d128`. */
export function flashKernelName(kernel: 'flash_fwd' | 'flash_lse' | 'flash_bwd_pre' | 'flash_bwd' | 'flash_bwd_dq', dtype: keyof typeof FLASH_TYPES, headDim: number): string {
  return `${kernel}_${FLASH_TYPES[dtype].suffix}_d${headDim}`;
}

/** The whole source: every kernel for every element type and head size. */
export const flashAttentionSource = String.raw`
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

#ifndef FA_SHARED
// Dynamic shared memory (over 48 KB: the launcher raises the kernel's limit).
#define FA_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

#define BM ${FLASH_BM}
#define BN ${FLASH_BN}
#define THREADS ${FLASH_THREADS}
#define WARPS (THREADS / 32)
#define LDS (BN + 4)   // fp32 score tiles: a padded row keeps wmma's 32-byte alignment and spreads banks
#define LDP (BN + 8)   // T probability tiles

typedef long long i64;

template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Rows [r0, r0 + ROWS) of head 'head' of x [B, S, heads, D] into the tile t [ROWS][D + 8]; rows at
// or past 'limit' (the row's length) are zeros, so masked products stay finite.
template <typename T, int D, int ROWS>
__device__ __forceinline__ void load_tile(T* t, const T* x, int b, int r0, int limit, int S, int heads, int head) {
  const int LDT = D + 8;
  const int PER_ROW = D / 8;  // 16-byte vectors per row
  for (int idx = threadIdx.x; idx < ROWS * PER_ROW; idx += THREADS) {
    const int r = idx / PER_ROW, c = (idx % PER_ROW) * 8;
    const int row = r0 + r;
    uint4 val;
    val.x = val.y = val.z = val.w = 0u;
    if (row < limit) val = *reinterpret_cast<const uint4*>(x + (((i64)b * S + row) * heads + head) * D + c);
    *reinterpret_cast<uint4*>(t + r * LDT + c) = val;
  }
}

// out[warp's 16 rows][BN] (fp32, ld LDS) = a[warp's rows][D] · bt[BN][D]ᵀ, both T tiles of ld D + 8.
template <typename T, int D>
__device__ __forceinline__ void tile_scores(const T* a, const T* bt, float* out, int warp) {
  const int LDT = D + 8;
  for (int n = 0; n < BN; n += 16) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::fill_fragment(c, 0.0f);
    for (int kk = 0; kk < D; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;  // bt's rows read as columns: bᵀ
      wmma::load_matrix_sync(fa, a + warp * 16 * LDT + kk, LDT);
      wmma::load_matrix_sync(fb, bt + n * LDT + kk, LDT);
      wmma::mma_sync(c, fa, fb, c);
    }
    wmma::store_matrix_sync(out + warp * 16 * LDS + n, c, LDS, wmma::mem_row_major);
  }
}

// LSE_ONLY: pass 1 alone, for a backward after a forward that keeps no log-sum-exp (GroupQueryAttention's).
template <typename T, int D, bool LSE_ONLY>
__device__ __forceinline__ void flash_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const int* __restrict__ seqlens_k,
                                          T* __restrict__ o, float* __restrict__ lse, int S, int H, int KV, float scale) {
  const int LDT = D + 8;
  FA_SHARED(smem);
  T* Qs = reinterpret_cast<T*>(smem);
  T* Ks = Qs + BM * LDT;
  T* Vs = Ks + BN * LDT;
  float* Ss = reinterpret_cast<float*>(Vs + BN * LDT);
  T* Ps = reinterpret_cast<T*>(Ss + BM * LDS);
  float* scratch = reinterpret_cast<float*>(Ps + BM * LDP);

  const int m0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (H / KV);
  const int len = seqlens_k[b] + 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Each lane owns one of its warp's 16 rows and half of each key tile's columns.
  const int r = lane & 15, half = lane >> 4;
  const int rr = warp * 16 + r, i = m0 + rr;
  const bool row_valid = i < len;
  const int kEnd = m0 < len ? min(m0 + BM, len) : 0;  // the tile's queries see keys j <= i < len (none: all padding)

  load_tile<T, D, BM>(Qs, q, b, m0, len, S, H, h);
  // Pass 1: the row's max and sum of exp over all its keys → log-sum-exp.
  float mrow = neg_inf(), lrow = 0.0f;
  for (int n0 = 0; n0 < kEnd; n0 += BN) {
    __syncthreads();  // the previous tile's readers are done with Ks
    load_tile<T, D, BN>(Ks, k, b, n0, len, S, KV, kvh);
    __syncthreads();
    tile_scores<T, D>(Qs, Ks, Ss, warp);
    __syncwarp();
    float tmax = neg_inf();
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int j = n0 + c;
      if (row_valid && j <= i) tmax = fmaxf(tmax, Ss[rr * LDS + c] * scale);
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 16));
    const float mnew = fmaxf(mrow, tmax);
    float tsum = 0.0f;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int j = n0 + c;
      if (row_valid && j <= i) tsum += __expf(Ss[rr * LDS + c] * scale - mnew);
    }
    tsum += __shfl_xor_sync(0xffffffffu, tsum, 16);
    if (mnew != neg_inf()) {
      lrow = (mrow == neg_inf() ? 0.0f : lrow * __expf(mrow - mnew)) + tsum;
      mrow = mnew;
    }
    __syncwarp();  // Ss is rewritten by the next tile
  }
  const float lse_i = row_valid ? mrow + logf(lrow) : 0.0f;  // a valid row sees key 0, so lrow >= 1
  if (half == 0 && i < S) lse[((i64)b * H + h) * S + i] = lse_i;
  if constexpr (!LSE_ONLY) {
    // Pass 2: O = Σ exp(s − lse) · V, in wmma accumulators (warp's 16 rows × D).
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[D / 16];
    for (int t = 0; t < D / 16; ++t) wmma::fill_fragment(acc[t], 0.0f);
    for (int n0 = 0; n0 < kEnd; n0 += BN) {
      __syncthreads();
      load_tile<T, D, BN>(Ks, k, b, n0, len, S, KV, kvh);
      load_tile<T, D, BN>(Vs, v, b, n0, len, S, KV, kvh);
      __syncthreads();
      tile_scores<T, D>(Qs, Ks, Ss, warp);
      __syncwarp();
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const int j = n0 + c;
        const float p = (row_valid && j <= i) ? __expf(Ss[rr * LDS + c] * scale - lse_i) : 0.0f;
        Ps[rr * LDP + c] = from_f<T>(p);
      }
      __syncwarp();
      for (int kk = 0; kk < BN; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fp;
        wmma::load_matrix_sync(fp, Ps + warp * 16 * LDP + kk, LDP);
        for (int t = 0; t < D / 16; ++t) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fv;
          wmma::load_matrix_sync(fv, Vs + kk * LDT + t * 16, LDT);
          wmma::mma_sync(acc[t], fp, fv, acc[t]);
        }
      }
    }
    // O through a per-warp 16×16 scratch (padding rows written as 0).
    float* sc = scratch + warp * 256;
    for (int t = 0; t < D / 16; ++t) {
      wmma::store_matrix_sync(sc, acc[t], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int row = m0 + warp * 16 + e / 16;
        if (row < S) o[(((i64)b * S + row) * H + h) * D + t * 16 + e % 16] = from_f<T>(row < len ? sc[e] : 0.0f);
      }
      __syncwarp();
    }
  }
}

// One warp per (b, i, h) row: delta = Σ_d dO·O (0 at padding), and that row of dq_acc zeroed.
template <typename T, int D>
__device__ __forceinline__ void flash_bwd_pre(const T* __restrict__ o, const T* __restrict__ dout, const int* __restrict__ seqlens_k,
                                              float* __restrict__ delta, float* __restrict__ dq_acc, int B, int S, int H) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const i64 row = (i64)blockIdx.x * WARPS + warp;
  if (row >= (i64)B * S * H) return;
  const int h = (int)(row % H), i = (int)((row / H) % S), b = (int)(row / ((i64)H * S));
  float s = 0.0f;
  for (int d = lane; d < D; d += 32) {
    s += to_f<T>(o[row * D + d]) * to_f<T>(dout[row * D + d]);
    dq_acc[row * D + d] = 0.0f;
  }
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) delta[((i64)b * H + h) * S + i] = i < seqlens_k[b] + 1 ? s : 0.0f;
}

template <typename T, int D>
__device__ __forceinline__ void flash_bwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
                                          const float* __restrict__ lse, const float* __restrict__ delta, const int* __restrict__ seqlens_k,
                                          float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv, int S, int H, int KV, float scale) {
  const int LDT = D + 8;
  FA_SHARED(smem);
  T* Ks = reinterpret_cast<T*>(smem);
  T* Vs = Ks + BN * LDT;
  T* Qs = Vs + BN * LDT;
  T* dOs = Qs + BM * LDT;
  float* Ss = reinterpret_cast<float*>(dOs + BM * LDT);  // S, then dP (one fp32 tile keeps two CTAs per SM)
  T* Ps = reinterpret_cast<T*>(Ss + BM * LDS);
  T* dSs = Ps + BM * LDP;
  float* Ls = reinterpret_cast<float*>(dSs + BM * LDP);
  float* Ds = Ls + BM;
  float* scratch = Ds + BM;

  const int n0 = blockIdx.x * BN, kvh = blockIdx.y, b = blockIdx.z;
  const int G = H / KV;
  const int len = seqlens_k[b] + 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane & 15, half = lane >> 4;
  const int rr = warp * 16 + r;
  float* sc = scratch + warp * 256;

  // dK and dV of the warp's 16 keys, summed over the G heads and every query tile.
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> dKf[D / 16], dVf[D / 16];
  for (int t = 0; t < D / 16; ++t) {
    wmma::fill_fragment(dKf[t], 0.0f);
    wmma::fill_fragment(dVf[t], 0.0f);
  }
  if (n0 < len) {
    load_tile<T, D, BN>(Ks, k, b, n0, len, S, KV, kvh);
    load_tile<T, D, BN>(Vs, v, b, n0, len, S, KV, kvh);
    for (int g = 0; g < G; ++g) {
      const int h = kvh * G + g;
      for (int m0 = (n0 / BM) * BM; m0 < len; m0 += BM) {
        __syncthreads();  // the previous tile's readers are done with Qs, dOs, Ps, dSs
        load_tile<T, D, BM>(Qs, q, b, m0, len, S, H, h);
        load_tile<T, D, BM>(dOs, dout, b, m0, len, S, H, h);
        for (int idx = threadIdx.x; idx < BM; idx += THREADS) {
          const int i = m0 + idx;
          Ls[idx] = i < len ? lse[((i64)b * H + h) * S + i] : 0.0f;
          Ds[idx] = i < len ? delta[((i64)b * H + h) * S + i] : 0.0f;
        }
        __syncthreads();
        tile_scores<T, D>(Qs, Ks, Ss, warp);
        __syncwarp();
        const int i = m0 + rr;
        for (int c = half * 32; c < half * 32 + 32; ++c) {
          const int j = n0 + c;
          Ps[rr * LDP + c] = from_f<T>(i < len && j <= i ? __expf(Ss[rr * LDS + c] * scale - Ls[rr]) : 0.0f);
        }
        __syncwarp();  // the warp's rows of Ss are read: dP goes there
        tile_scores<T, D>(dOs, Vs, Ss, warp);
        __syncwarp();
        // dS = P ∘ (dP − D) with P as rounded for its product (the composed rule's rounding of P too)
        for (int c = half * 32; c < half * 32 + 32; ++c) {
          const int j = n0 + c;
          dSs[rr * LDP + c] = from_f<T>(i < len && j <= i ? to_f<T>(Ps[rr * LDP + c]) * (Ss[rr * LDS + c] - Ds[rr]) : 0.0f);
        }
        __syncthreads();  // dV and dK read every query row of P and dS
        // dV += Pᵀ · dO and dK += dSᵀ · Q over this tile's queries (Pᵀ read column-major).
        for (int kk = 0; kk < BM; kk += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> fpt, fdst;
          wmma::load_matrix_sync(fpt, Ps + kk * LDP + warp * 16, LDP);
          wmma::load_matrix_sync(fdst, dSs + kk * LDP + warp * 16, LDP);
          for (int t = 0; t < D / 16; ++t) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fo, fq;
            wmma::load_matrix_sync(fo, dOs + kk * LDT + t * 16, LDT);
            wmma::mma_sync(dVf[t], fpt, fo, dVf[t]);
            wmma::load_matrix_sync(fq, Qs + kk * LDT + t * 16, LDT);
            wmma::mma_sync(dKf[t], fdst, fq, dKf[t]);
          }
        }
        // dQ of the warp's 16 query rows += dS · K · scale, added into the fp32 accumulator.
        for (int t = 0; t < D / 16; ++t) {
          wmma::fragment<wmma::accumulator, 16, 16, 16, float> fdq;
          wmma::fill_fragment(fdq, 0.0f);
          for (int kk = 0; kk < BN; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fds;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fk;
            wmma::load_matrix_sync(fds, dSs + warp * 16 * LDP + kk, LDP);
            wmma::load_matrix_sync(fk, Ks + kk * LDT + t * 16, LDT);
            wmma::mma_sync(fdq, fds, fk, fdq);
          }
          wmma::store_matrix_sync(sc, fdq, 16, wmma::mem_row_major);
          __syncwarp();
          for (int e = lane; e < 256; e += 32) {
            const int row = m0 + warp * 16 + e / 16;
            if (row < len) atomicAdd(dq_acc + (((i64)b * S + row) * H + h) * D + t * 16 + e % 16, sc[e] * scale);
          }
          __syncwarp();
        }
      }
    }
  }
  // dK (scaled: s = scale · q·k) and dV of the warp's keys; keys past the row's length get 0.
  for (int t = 0; t < D / 16; ++t) {
    wmma::store_matrix_sync(sc, dKf[t], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int key = n0 + warp * 16 + e / 16;
      if (key < S) dk[(((i64)b * S + key) * KV + kvh) * D + t * 16 + e % 16] = from_f<T>(sc[e] * scale);
    }
    __syncwarp();
    wmma::store_matrix_sync(sc, dVf[t], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int key = n0 + warp * 16 + e / 16;
      if (key < S) dv[(((i64)b * S + key) * KV + kvh) * D + t * 16 + e % 16] = from_f<T>(sc[e]);
    }
    __syncwarp();
  }
}

template <typename T>
__device__ __forceinline__ void flash_bwd_dq(const float* __restrict__ dq_acc, T* __restrict__ dq, i64 n) {
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) dq[idx] = from_f<T>(dq_acc[idx]);
}

#define FA_INSTANCES(SUF, T, D)                                                                                                   \
  extern "C" __global__ void __launch_bounds__(THREADS) flash_fwd_##SUF##_d##D(const T* q, const T* k, const T* v, const int* seqlens_k, \
      T* o, float* lse, int S, int H, int KV, float scale) { flash_fwd<T, D, false>(q, k, v, seqlens_k, o, lse, S, H, KV, scale); }  \
  extern "C" __global__ void __launch_bounds__(THREADS) flash_lse_##SUF##_d##D(const T* q, const T* k, const int* seqlens_k, float* lse,  \
      int S, int H, int KV, float scale) { flash_fwd<T, D, true>(q, k, nullptr, seqlens_k, nullptr, lse, S, H, KV, scale); }         \
  extern "C" __global__ void __launch_bounds__(THREADS) flash_bwd_pre_##SUF##_d##D(const T* o, const T* dout, const int* seqlens_k,   \
      float* delta, float* dq_acc, int B, int S, int H) { flash_bwd_pre<T, D>(o, dout, seqlens_k, delta, dq_acc, B, S, H); }        \
  extern "C" __global__ void __launch_bounds__(THREADS) flash_bwd_##SUF##_d##D(const T* q, const T* k, const T* v, const T* dout,      \
      const float* lse, const float* delta, const int* seqlens_k, float* dq_acc, T* dk, T* dv, int S, int H, int KV, float scale) {    \
    flash_bwd<T, D>(q, k, v, dout, lse, delta, seqlens_k, dq_acc, dk, dv, S, H, KV, scale);                                           \
  }                                                                                                                                 \
  extern "C" __global__ void __launch_bounds__(THREADS) flash_bwd_dq_##SUF##_d##D(const float* dq_acc, T* dq, i64 n) { flash_bwd_dq<T>(dq_acc, dq, n); }

FA_INSTANCES(bf16, __nv_bfloat16, 64)
FA_INSTANCES(bf16, __nv_bfloat16, 128)
FA_INSTANCES(fp16, __half, 64)
FA_INSTANCES(fp16, __half, 128)
`;

/**
 * The CUDA C++ of Lathe's flash attention (FlashAttention-2's algorithm), compiled by NVRTC, on
 * tensor cores through `mma.sync.m16n8k16` PTX (bf16/fp16 in, fp32 accumulators) with operands read
 * from shared memory by `ldmatrix` and tiles copied in by `cp.async`. The fragment layouts are PTX's
 * fixed ones, so softmax, masks and dS work on accumulators in registers and an accumulator passes
 * straight into the next product's A operand (wmma hides its layout, which forced the first version
 * to move every score tile through shared memory and to run the forward in two passes).
 *
 * Layouts are GroupQueryAttention's: q/out [B, S, H, D], k/v [B, S, KV, D] (contiguous), right-padded
 * rows of length seqlens_k[b] + 1, causal; the log-sum-exp and D = rowsum(dO ∘ O) are fp32 [B, H, S].
 * Query rows past a row's length are padding: the forward writes 0 there (output and log-sum-exp)
 * and the backward gives them no gradient.
 *
 * Kernels (T = bf16 or fp16, D = 64 or 128; names `<kernel>_<bf16|fp16>_d<D>`):
 * - `flash_fwd`: one pass, a CTA of 4 warps per (64 query rows, head, batch row), each warp 16 rows:
 *   Q's fragments in registers, K/V tiles double-buffered, the online softmax rescaling O's
 *   accumulators, P passed from S's accumulators to P·V's operand, O and the log-sum-exp written once.
 * - `flash_lse`: the same loop without V (the log-sum-exp alone, the same bits), for the backward
 *   after GroupQueryAttention's forward.
 * - `flash_bwd_pre`: D per row, and zeroes the fp32 dQ accumulator.
 * - `flash_bwd`: a CTA per (64 keys, KV head, batch row), each warp 16 keys, looping over the G query
 *   heads of the KV head and the query tiles at or below the diagonal: Sᵀ and dPᵀ with keys as rows,
 *   P rebuilt from the log-sum-exp, dS = P ∘ (dP − D) in fp32 from P as rounded to T, P and dS
 *   rounded to T for their products; dK and dV accumulate in registers (the G-head sum inside the
 *   CTA), dQ partials go to the fp32 accumulator by atomicAdd.
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

/**
 * Dynamic shared memory of a forward CTA (bytes): two buffers each of K and V (Q first lands in K's
 * second, O is staged in K's first) — 68 KB at head size 128, so three CTAs fit an sm_90 SM.
 */
export function flashForwardSmem(headDim: number): number {
  return 4 * FLASH_BN * (headDim + 8) * 2;
}

/**
 * Dynamic shared memory of a backward CTA (bytes): K and V, two buffers each of Q and dO, dSᵀ, two
 * of L and D — 112 KB at head size 128, so two CTAs fit an sm_90 SM.
 */
export function flashBackwardSmem(headDim: number): number {
  return (2 * FLASH_BN + 4 * FLASH_BM) * (headDim + 8) * 2 + FLASH_BN * (FLASH_BM + 8) * 2 + 4 * FLASH_BM * 4;
}

/** The kernel name for a dtype and head size, e.g. `flash_fwd_bf16_d128`. */
export function flashKernelName(kernel: 'flash_fwd' | 'flash_lse' | 'flash_bwd_pre' | 'flash_bwd' | 'flash_bwd_dq', dtype: keyof typeof FLASH_TYPES, headDim: number): string {
  return `${kernel}_${FLASH_TYPES[dtype].suffix}_d${headDim}`;
}

/** The whole source: every kernel for every element type and head size. */
export const flashAttentionSource = String.raw`
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef FA_SHARED
// Dynamic shared memory (over 48 KB: the launcher raises the kernel's limit).
#define FA_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

#define BM ${FLASH_BM}
#define BN ${FLASH_BN}
#define THREADS ${FLASH_THREADS}
#define WARPS (THREADS / 32)

typedef long long i64;
static_assert(BM == BN, "the backward starts its query tiles at its key tile");

template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// The forward's primitives: cp.async copies, ldmatrix loads, mma.sync m16n8k16 and ex2 (test/emulation/emu.h
// defines FA_EMULATION and gives CPU versions with the same per-lane fragment layouts).
#ifndef FA_EMULATION
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// 16 bytes global → shared without a register round trip; pred false writes 16 zero bytes (src unread).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Four 8×8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i gets its fragment.
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
// The same, each matrix transposed.
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
template <typename T> struct MmaType;
template <> struct MmaType<__nv_bfloat16> { static constexpr bool bf16 = true; };
template <> struct MmaType<__half> { static constexpr bool bf16 = false; };
// d (16×8 fp32) += a (16×16, row) · b (16×8, col), the PTX fragment layouts.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (MmaType<T>::bf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// p[0] += a, p[1] += b (global, 8-byte aligned): one vector reduction on sm_90, half the L2 atomics of two scalar ones.
__device__ __forceinline__ void red_add2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
#endif

// Two values rounded to T, packed low-first as one 32-bit fragment register.
template <typename T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  const T a = from_f<T>(lo), b = from_f<T>(hi);
  return (unsigned)*reinterpret_cast<const unsigned short*>(&a) | ((unsigned)*reinterpret_cast<const unsigned short*>(&b) << 16);
}

// Rows [r0, r0 + ROWS) of head 'head' of x [B, S, heads, D] into the tile t [ROWS][D + 8] by cp.async; rows
// at or past 'limit' are zero-filled, so masked products stay finite.
template <typename T, int D, int ROWS>
__device__ __forceinline__ void async_tile(T* t, const T* x, int b, int r0, int limit, int S, int heads, int head) {
  const int LDT = D + 8;
  const int PER_ROW = D / 8;
  for (int idx = threadIdx.x; idx < ROWS * PER_ROW; idx += THREADS) {
    const int r = idx / PER_ROW, c = (idx % PER_ROW) * 8;
    const int row = r0 + r;
    const bool in = row < limit;
    cp_async16(t + r * LDT + c, in ? x + (((i64)b * S + row) * heads + head) * D + c : x, in);
  }
}

// FlashAttention-2's forward in one pass: a CTA per (BM query rows, head, batch row), 4 warps of 16 rows.
// Q's fragments stay in registers; K/V tiles are double-buffered by cp.async; S = QKᵀ and O live in
// mma.sync accumulators, so the online softmax (running max and sum, fp32) rescales O in registers and
// P goes from S's accumulator layout straight into the A operand of P·V. Key tiles past the causal
// limit are never loaded; only the diagonal and ragged-end tiles are masked element by element.
// LSE_ONLY: the log-sum-exp alone, for a backward after a forward that keeps none (GroupQueryAttention's).
template <typename T, int D, bool LSE_ONLY>
__device__ __forceinline__ void flash_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const int* __restrict__ seqlens_k,
                                          T* __restrict__ o, float* __restrict__ lse, int S, int H, int KV, float scale) {
  constexpr int LDT = D + 8;  // 272-byte rows at D = 128: ldmatrix's 8 row addresses fall in 8 distinct bank groups
  FA_SHARED(smem);
  T* Ks = reinterpret_cast<T*>(smem);  // [2][BN][LDT]
  T* Vs = Ks + 2 * BN * LDT;           // [2][BN][LDT]
  T* Qs = Ks + BN * LDT;               // Q lands in K's second buffer, free until the first prefetch (BM == BN)

  const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;  // the longest (last) query tiles start first under the causal mask
  const int h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (H / KV);
  const int len = min(seqlens_k[b] + 1, S);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t4 = lane & 3;
  const int i0 = m0 + warp * 16 + g, i1 = i0 + 8;  // the lane's two rows (fragment rows g and g + 8)
  const int nTiles = m0 < len ? (min(m0 + BM, len) + BN - 1) / BN : 0;  // keys j <= i < len; none for an all-padding tile
  const float sl2 = scale * 1.4426950408889634f;  // exp(x · scale) = 2^(x · sl2)

  float acc[LSE_ONLY ? 1 : D / 8][4];
  if constexpr (!LSE_ONLY) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
  }
  float mr0 = neg_inf(), mr1 = neg_inf(), lr0 = 0.0f, lr1 = 0.0f;  // raw-score max; the lane's part of the sum
  unsigned qf[D / 16][4];

  if (nTiles > 0) {
    async_tile<T, D, BM>(Qs, q, b, m0, len, S, H, h);
    async_tile<T, D, BN>(Ks, k, b, 0, len, S, KV, kvh);
    if constexpr (!LSE_ONLY) async_tile<T, D, BN>(Vs, v, b, 0, len, S, KV, kvh);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) ldsm_x4(qf[kc], Qs + (warp * 16 + (lane & 15)) * LDT + kc * 16 + (lane >> 4) * 8);
    __syncthreads();  // every warp holds its Q fragments before K's second buffer is overwritten
  }
  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: the matrix this lane addresses, and its row there
  for (int t = 0; t < nTiles; ++t) {
    const int n0 = t * BN;
    const T* Kt = Ks + (t & 1) * BN * LDT;
    const T* Vt = Vs + (t & 1) * BN * LDT;
    if (t + 1 < nTiles) {  // the other buffer was released by the previous iteration's barrier
      async_tile<T, D, BN>(Ks + ((t + 1) & 1) * BN * LDT, k, b, n0 + BN, len, S, KV, kvh);
      if constexpr (!LSE_ONLY) async_tile<T, D, BN>(Vs + ((t + 1) & 1) * BN * LDT, v, b, n0 + BN, len, S, KV, kvh);
      cp_async_commit();
    }
    float s[BN / 8][4];
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        // matrices: keys +0..7 / +8..15 (mi / 2) × head dims +0..7 / +8..15 (mi % 2) → b0, b1 of two key octets
        unsigned kb[4];
        ldsm_x4(kb, Kt + (np * 16 + (mi >> 1) * 8 + mr) * LDT + kc * 16 + (mi & 1) * 8);
        mma16816<T>(s[2 * np], qf[kc], kb[0], kb[1]);
        mma16816<T>(s[2 * np + 1], qf[kc], kb[2], kb[3]);
      }
    }
    if (n0 + BN - 1 > m0 || n0 + BN > len) {  // the diagonal tile or the row's ragged end
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = n0 + nt * 8 + 2 * t4 + (e & 1), i = e < 2 ? i0 : i1;
          if (j > i || i >= len) s[nt][e] = neg_inf();
        }
    }
    float mx0 = mr0, mx1 = mr1;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float base0 = mx0 == neg_inf() ? 0.0f : mx0 * sl2, base1 = mx1 == neg_inf() ? 0.0f : mx1 * sl2;  // a fully masked row stays 0, not NaN
    const float al0 = fast_exp2(mr0 * sl2 - base0), al1 = fast_exp2(mr1 * sl2 - base1);
    mr0 = mx0;
    mr1 = mx1;
    lr0 *= al0;
    lr1 *= al1;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      s[nt][0] = fast_exp2(fmaf(s[nt][0], sl2, -base0));
      s[nt][1] = fast_exp2(fmaf(s[nt][1], sl2, -base0));
      s[nt][2] = fast_exp2(fmaf(s[nt][2], sl2, -base1));
      s[nt][3] = fast_exp2(fmaf(s[nt][3], sl2, -base1));
      lr0 += s[nt][0] + s[nt][1];
      lr1 += s[nt][2] + s[nt][3];
    }
    if constexpr (!LSE_ONLY) {
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        acc[dt][0] *= al0;
        acc[dt][1] *= al0;
        acc[dt][2] *= al1;
        acc[dt][3] *= al1;
      }
#pragma unroll
      for (int kc = 0; kc < BN / 16; ++kc) {
        // S's accumulators of key octets 2kc and 2kc + 1 are exactly P's A fragment for keys 16kc..16kc + 15
        const unsigned pa[4] = {pack2<T>(s[2 * kc][0], s[2 * kc][1]), pack2<T>(s[2 * kc][2], s[2 * kc][3]), pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          // transposed matrices: keys +0..7 / +8..15 (mi % 2) × head dims +0..7 / +8..15 (mi / 2) → b0, b1 of two dim octets
          unsigned vb[4];
          ldsm_x4_t(vb, Vt + (kc * 16 + (mi & 1) * 8 + mr) * LDT + dp * 16 + (mi >> 1) * 8);
          mma16816<T>(acc[2 * dp], pa, vb[0], vb[1]);
          mma16816<T>(acc[2 * dp + 1], pa, vb[2], vb[3]);
        }
      }
    }
    cp_async_wait_all();
    __syncthreads();  // the next tile has landed, and every warp is done with this one's buffers
  }
  lr0 += __shfl_xor_sync(0xffffffffu, lr0, 1);
  lr0 += __shfl_xor_sync(0xffffffffu, lr0, 2);
  lr1 += __shfl_xor_sync(0xffffffffu, lr1, 1);
  lr1 += __shfl_xor_sync(0xffffffffu, lr1, 2);
  const bool v0 = i0 < len, v1 = i1 < len;  // a valid row sees key 0, so its sum is >= 1
  if (t4 == 0) {
    if (i0 < S) lse[((i64)b * H + h) * S + i0] = v0 ? mr0 * scale + logf(lr0) : 0.0f;
    if (i1 < S) lse[((i64)b * H + h) * S + i1] = v1 ? mr1 * scale + logf(lr1) : 0.0f;
  }
  if constexpr (!LSE_ONLY) {
    // O / sum (0 at padding rows) through the warp's own rows of K's first buffer (released by the
    // loop's last barrier), then 16-byte stores
    const float inv0 = v0 ? 1.0f / lr0 : 0.0f, inv1 = v1 ? 1.0f / lr1 : 0.0f;
    T* Os = Ks + warp * 16 * LDT;
    __syncwarp();
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<unsigned*>(Os + g * LDT + dt * 8 + 2 * t4) = pack2<T>(acc[dt][0] * inv0, acc[dt][1] * inv0);
      *reinterpret_cast<unsigned*>(Os + (g + 8) * LDT + dt * 8 + 2 * t4) = pack2<T>(acc[dt][2] * inv1, acc[dt][3] * inv1);
    }
    __syncwarp();
    for (int e = lane; e < 16 * (D / 8); e += 32) {
      const int r = e / (D / 8), c = (e % (D / 8)) * 8;
      const int row = m0 + warp * 16 + r;
      if (row < S) *reinterpret_cast<uint4*>(o + (((i64)b * S + row) * H + h) * D + c) = *reinterpret_cast<const uint4*>(Os + r * LDT + c);
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

// The T pair of a fragment register as floats (low half first).
template <typename T>
__device__ __forceinline__ float lo_f(unsigned r) {
  const unsigned short u = (unsigned short)(r & 0xffffu);
  return to_f<T>(*reinterpret_cast<const T*>(&u));
}
template <typename T>
__device__ __forceinline__ float hi_f(unsigned r) {
  const unsigned short u = (unsigned short)(r >> 16);
  return to_f<T>(*reinterpret_cast<const T*>(&u));
}

// dst (16 rows × BM columns, fp32 accumulators) = a's 16 rows of the tile at A (row-major, ld LDT) · the BM
// rows of B (row-major [BM][LDT])ᵀ: S or dP with the warp's 16 keys as rows and a query tile as columns.
template <typename T, int D>
__device__ __forceinline__ void warp_abt(float (&dst)[BM / 8][4], const T* A, const T* B) {
  constexpr int LDT = D + 8;
  const int lane = threadIdx.x % 32, mi = lane >> 3, mr = lane & 7;
#pragma unroll
  for (int nt = 0; nt < BM / 8; ++nt) dst[nt][0] = dst[nt][1] = dst[nt][2] = dst[nt][3] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    unsigned af[4];
    ldsm_x4(af, A + (lane & 15) * LDT + kc * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < BM / 16; ++np) {
      unsigned bf[4];
      ldsm_x4(bf, B + (np * 16 + (mi >> 1) * 8 + mr) * LDT + kc * 16 + (mi & 1) * 8);
      mma16816<T>(dst[2 * np], af, bf[0], bf[1]);
      mma16816<T>(dst[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

// acc (16 rows × D) += a (16 × BM, A fragments in registers) · B (row-major [BM][LDT]): dV += Pᵀ·dO, dK += dSᵀ·Q.
template <typename T, int D>
__device__ __forceinline__ void warp_ab_acc(float (&acc)[D / 8][4], const unsigned (&a)[BM / 16][4], const T* B) {
  constexpr int LDT = D + 8;
  const int lane = threadIdx.x % 32, mi = lane >> 3, mr = lane & 7;
#pragma unroll
  for (int kc = 0; kc < BM / 16; ++kc) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      unsigned bf[4];
      ldsm_x4_t(bf, B + (kc * 16 + (mi & 1) * 8 + mr) * LDT + dp * 16 + (mi >> 1) * 8);
      mma16816<T>(acc[2 * dp], a[kc], bf[0], bf[1]);
      mma16816<T>(acc[2 * dp + 1], a[kc], bf[2], bf[3]);
    }
  }
}

// FlashAttention-2's backward with mma.sync: a CTA per (BN keys, KV head, batch row), each warp owning 16
// keys, looping over the G query heads and the query tiles at or below the diagonal (Q, dO, lse and D
// double-buffered by cp.async). The warp computes Sᵀ and dPᵀ with its keys as rows, so Pᵀ and dSᵀ are
// already A fragments of dV += Pᵀ·dO and dK += dSᵀ·Q, accumulated in registers over every tile (the G-head
// sum inside the CTA); dSᵀ goes through shared memory for dQ = dS·K, added into the fp32 accumulator by
// atomicAdd. P and dS are rounded to T for their products, dS = P ∘ (dP − D) from P as rounded.
template <typename T, int D>
__device__ __forceinline__ void flash_bwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
                                          const float* __restrict__ lse, const float* __restrict__ delta, const int* __restrict__ seqlens_k,
                                          float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv, int S, int H, int KV, float scale) {
  constexpr int LDT = D + 8, LDD = BM + 8;
  FA_SHARED(smem);
  T* Ks = reinterpret_cast<T*>(smem);
  T* Vs = Ks + BN * LDT;
  T* Qs = Vs + BN * LDT;       // [2][BM][LDT]
  T* dOs = Qs + 2 * BM * LDT;  // [2][BM][LDT]
  T* dSs = dOs + 2 * BM * LDT;  // [BN][LDD]: dSᵀ, keys × queries
  float* Ls = reinterpret_cast<float*>(dSs + BN * LDD);  // [2][BM]: lse · log2 e
  float* Ds = Ls + 2 * BM;                               // [2][BM]

  const int n0 = blockIdx.x * BN, kvh = blockIdx.y, b = blockIdx.z;
  const int G = H / KV;
  const int len = min(seqlens_k[b] + 1, S);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t4 = lane & 3, mi = lane >> 3, mr = lane & 7;
  const int j0 = n0 + warp * 16 + g, j1 = j0 + 8;  // the lane's two keys (fragment rows g and g + 8)
  const float sl2 = scale * 1.4426950408889634f;
  const int nq = n0 < len ? (len - n0 + BM - 1) / BM : 0;  // query tiles from the diagonal (BM == BN) to the row's end
  const int total = G * nq;

  float dKa[D / 8][4], dVa[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dKa[dt][e] = dVa[dt][e] = 0.0f;

  // Query tile 'it' (head kvh·G + it / nq, rows n0 + (it % nq)·BM) into buffer 'buf'.
  auto stage = [&](int it, int buf) {
    const int hh = kvh * G + it / nq, m0 = n0 + (it % nq) * BM;
    async_tile<T, D, BM>(Qs + buf * BM * LDT, q, b, m0, len, S, H, hh);
    async_tile<T, D, BM>(dOs + buf * BM * LDT, dout, b, m0, len, S, H, hh);
    for (int idx = threadIdx.x; idx < BM; idx += THREADS) {
      const int i = m0 + idx;
      Ls[buf * BM + idx] = i < len ? lse[((i64)b * H + hh) * S + i] * 1.4426950408889634f : 0.0f;
      Ds[buf * BM + idx] = i < len ? delta[((i64)b * H + hh) * S + i] : 0.0f;
    }
  };
  if (total > 0) {
    async_tile<T, D, BN>(Ks, k, b, n0, len, S, KV, kvh);
    async_tile<T, D, BN>(Vs, v, b, n0, len, S, KV, kvh);
    stage(0, 0);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
  }
  for (int it = 0; it < total; ++it) {
    const int buf = it & 1;
    const int hh = kvh * G + it / nq, m0 = n0 + (it % nq) * BM;
    if (it + 1 < total) {  // the other buffers were released by the previous iteration's last barrier
      stage(it + 1, buf ^ 1);
      cp_async_commit();
    }
    const T* Qt = Qs + buf * BM * LDT;
    const T* dOt = dOs + buf * BM * LDT;
    const float* Lt = Ls + buf * BM;
    const float* Dt = Ds + buf * BM;
    const bool edge = m0 < n0 + BN - 1 || m0 + BM > len;  // the diagonal tile or the rows' ragged end

    // Pᵀ = exp(Sᵀ·scale − lse), masked, rounded to T: the A fragments of dV += Pᵀ·dO
    unsigned pa[BM / 16][4];
    {
      float s[BM / 8][4];
      warp_abt<T, D>(s, Ks + warp * 16 * LDT, Qt);
#pragma unroll
      for (int nt = 0; nt < BM / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = nt * 8 + 2 * t4 + (e & 1), i = m0 + c, j = e < 2 ? j0 : j1;
          const float p = fast_exp2(fmaf(s[nt][e], sl2, -Lt[c]));
          s[nt][e] = edge && !(j <= i && i < len) ? 0.0f : p;
        }
#pragma unroll
      for (int kc = 0; kc < BM / 16; ++kc) {
        pa[kc][0] = pack2<T>(s[2 * kc][0], s[2 * kc][1]);
        pa[kc][1] = pack2<T>(s[2 * kc][2], s[2 * kc][3]);
        pa[kc][2] = pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
        pa[kc][3] = pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
      }
    }
    warp_ab_acc<T, D>(dVa, pa, dOt);
    // dSᵀ = Pᵀ ∘ (dPᵀ − D), rounded to T in place of P: the A fragments of dK += dSᵀ·Q
    {
      float dp[BM / 8][4];
      warp_abt<T, D>(dp, Vs + warp * 16 * LDT, dOt);
#pragma unroll
      for (int kc = 0; kc < BM / 16; ++kc)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int nt = 2 * kc + (r >> 1), e = (r & 1) * 2;  // register r holds row g (+8 for odd r), key octet nt
          const int c = nt * 8 + 2 * t4;
          const float d0 = lo_f<T>(pa[kc][r]) * (dp[nt][e] - Dt[c]), d1 = hi_f<T>(pa[kc][r]) * (dp[nt][e + 1] - Dt[c + 1]);
          pa[kc][r] = pack2<T>(d0, d1);
        }
    }
    warp_ab_acc<T, D>(dKa, pa, Qt);
    // dSᵀ to shared memory: dQ sums over all BN keys, four warps' rows
#pragma unroll
    for (int kc = 0; kc < BM / 16; ++kc)
#pragma unroll
      for (int r = 0; r < 4; ++r) *reinterpret_cast<unsigned*>(dSs + (warp * 16 + g + (r & 1) * 8) * LDD + kc * 16 + (r >> 1) * 8 + 2 * t4) = pa[kc][r];
    __syncthreads();
    // dQ of the warp's 16 query rows += dS (16 × BN, read transposed) · K · scale
    {
      unsigned da[BN / 16][4];
#pragma unroll
      for (int kc = 0; kc < BN / 16; ++kc) ldsm_x4_t(da[kc], dSs + (kc * 16 + (mi >> 1) * 8 + mr) * LDD + warp * 16 + (mi & 1) * 8);
      const int r0 = m0 + warp * 16 + g;
      float* dq0 = dq_acc + (((i64)b * S + r0) * H + hh) * D;
      float* dq1 = dq0 + (i64)8 * H * D;
#pragma unroll
      for (int dp2 = 0; dp2 < D / 16; ++dp2) {
        float qa[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kc = 0; kc < BN / 16; ++kc) {
          unsigned kb[4];
          ldsm_x4_t(kb, Ks + (kc * 16 + (mi & 1) * 8 + mr) * LDT + dp2 * 16 + (mi >> 1) * 8);
          mma16816<T>(qa[0], da[kc], kb[0], kb[1]);
          mma16816<T>(qa[1], da[kc], kb[2], kb[3]);
        }
#pragma unroll
        for (int h8 = 0; h8 < 2; ++h8) {
          const int col = dp2 * 16 + h8 * 8 + 2 * t4;
          if (r0 < len) red_add2(dq0 + col, qa[h8][0] * scale, qa[h8][1] * scale);
          if (r0 + 8 < len) red_add2(dq1 + col, qa[h8][2] * scale, qa[h8][3] * scale);
        }
      }
    }
    cp_async_wait_all();
    __syncthreads();  // the next tile has landed; every warp is done with this one's buffers and dSᵀ
  }
  // dK (scaled: s = scale · q·k) and dV of the warp's keys through its rows of the Q buffers, then 16-byte stores;
  // keys past the row's length have zero accumulators (their P and dS are 0)
  T* Ks_out = Qs + warp * 16 * LDT;
  T* Vs_out = dOs + warp * 16 * LDT;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    *reinterpret_cast<unsigned*>(Ks_out + g * LDT + dt * 8 + 2 * t4) = pack2<T>(dKa[dt][0] * scale, dKa[dt][1] * scale);
    *reinterpret_cast<unsigned*>(Ks_out + (g + 8) * LDT + dt * 8 + 2 * t4) = pack2<T>(dKa[dt][2] * scale, dKa[dt][3] * scale);
    *reinterpret_cast<unsigned*>(Vs_out + g * LDT + dt * 8 + 2 * t4) = pack2<T>(dVa[dt][0], dVa[dt][1]);
    *reinterpret_cast<unsigned*>(Vs_out + (g + 8) * LDT + dt * 8 + 2 * t4) = pack2<T>(dVa[dt][2], dVa[dt][3]);
  }
  __syncwarp();
  for (int e = lane; e < 16 * (D / 8); e += 32) {
    const int r = e / (D / 8), c = (e % (D / 8)) * 8;
    const int key = n0 + warp * 16 + r;
    if (key < S) {
      const i64 at = (((i64)b * S + key) * KV + kvh) * D + c;
      *reinterpret_cast<uint4*>(dk + at) = *reinterpret_cast<const uint4*>(Ks_out + r * LDT + c);
      *reinterpret_cast<uint4*>(dv + at) = *reinterpret_cast<const uint4*>(Vs_out + r * LDT + c);
    }
  }
}

template <typename T>
__device__ __forceinline__ void flash_bwd_dq(const float* __restrict__ dq_acc, T* __restrict__ dq, i64 n) {
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) dq[idx] = from_f<T>(dq_acc[idx]);
}

#define FA_INSTANCES(SUF, T, D)                                                                                                   \
  extern "C" __global__ void __launch_bounds__(THREADS, 3) flash_fwd_##SUF##_d##D(const T* q, const T* k, const T* v, const int* seqlens_k, \
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

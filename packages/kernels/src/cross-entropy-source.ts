/**
 * The CUDA C++ of Lathe's fused log-prob / log-sum-exp / entropy kernels over rows of logits, compiled
 * by NVRTC. One CTA per row reads the row once with 128-bit loads (8 bf16/fp16 or 4 fp32 values a
 * load) and keeps an online (max, Σ e^(z−m), Σ e^(z−m)·(z−m)) per thread, merged across the warp by
 * shuffles and across warps in a fixed order, where z = logit / temperature. No fp32 copy of the
 * logits is ever written.
 *
 * Kernels (T = bf16, fp16 or fp32; names `<kernel>_<bf16|fp16|fp32>`):
 * - `ce_fwd` / `ce_fwd_ent`: per row the log-sum-exp (fp32), with targets (int64, nullable) the
 *   target's log-prob z_t − lse (0 where the target falls outside [0, V): ignore-index rows), and with
 *   `_ent` the entropy −Σ p·log p = log s − t/s.
 * - `ce_bwd` / `ce_bwd_ent`: d(logits) in T from the row's lse (and entropy) and the upstream
 *   gradients of log-prob, lse and entropy (each nullable = 0):
 *   dz_j = p_j·(g_lse − g_logp − g_H·(H + z_j − lse)) + [j = target]·g_logp, d(logit) = dz / temperature.
 *   A row whose upstream gradients are all 0 (a masked token) gets zeros without its logits being read.
 *
 * Rows past 2³¹ elements are addressed in 64 bits. A row whose start is not 16-byte aligned (V not a
 * multiple of the vector) is read element by element.
 */
import { floatConversions, streamLoad } from './cuda-snippets';

/** Threads per CTA (one CTA per row). */
export const CE_THREADS = 256;

/** Element types with a build, by dtype name, with their C type and kernel-name suffix. */
export const CE_TYPES = {
  bfloat16: { c: '__nv_bfloat16', suffix: 'bf16' },
  float16: { c: '__half', suffix: 'fp16' },
  float32: { c: 'float', suffix: 'fp32' },
} as const;

/** The largest vocabulary the kernels are built and tested for. */
export const CE_MAX_VOCAB = 262_144;

/** The kernel name for a dtype, e.g. `ce_fwd_ent_bf16`. */
export function crossEntropyKernelName(kernel: 'ce_fwd' | 'ce_fwd_ent' | 'ce_bwd' | 'ce_bwd_ent', dtype: keyof typeof CE_TYPES): string {
  return `${kernel}_${CE_TYPES[dtype].suffix}`;
}

const instantiate = Object.values(CE_TYPES)
  .map(
    ({ c, suffix }) => String.raw`
extern "C" __global__ void __launch_bounds__(CE_THREADS) ce_fwd_${suffix}(const ${c}* x, const i64* targets, float* logp, float* lse, float* ent, int rows, int V, float inv_t) { ce_fwd<${c}, false>(x, targets, logp, lse, ent, rows, V, inv_t); }
extern "C" __global__ void __launch_bounds__(CE_THREADS) ce_fwd_ent_${suffix}(const ${c}* x, const i64* targets, float* logp, float* lse, float* ent, int rows, int V, float inv_t) { ce_fwd<${c}, true>(x, targets, logp, lse, ent, rows, V, inv_t); }
extern "C" __global__ void __launch_bounds__(CE_THREADS) ce_bwd_${suffix}(const ${c}* x, const i64* targets, const float* lse, const float* ent, const float* g_logp, const float* g_lse, const float* g_ent, ${c}* dx, int rows, int V, float inv_t) { ce_bwd<${c}, false>(x, targets, lse, ent, g_logp, g_lse, g_ent, dx, rows, V, inv_t); }
extern "C" __global__ void __launch_bounds__(CE_THREADS) ce_bwd_ent_${suffix}(const ${c}* x, const i64* targets, const float* lse, const float* ent, const float* g_logp, const float* g_lse, const float* g_ent, ${c}* dx, int rows, int V, float inv_t) { ce_bwd<${c}, true>(x, targets, lse, ent, g_logp, g_lse, g_ent, dx, rows, V, inv_t); }`,
  )
  .join('\n');

/** The whole source: every kernel for every element type. */
export const crossEntropySource = String.raw`
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define CE_THREADS ${CE_THREADS}
#define CE_WARPS (CE_THREADS / 32)
typedef long long i64;

${floatConversions('ce')}

__device__ __forceinline__ float ce_neg_inf() { return __int_as_float(0xff800000); }

#ifndef CE_EMULATION
// 16 bytes read once: through the non-coherent path, not kept in L1 (each logit is read once per pass).
${streamLoad('ce_ld')}
#endif

// A thread's (or a merged group's) running statistics of z: max m, s = Σ e^(z−m), t = Σ e^(z−m)·(z−m).
struct CeStat { float m, s, t; };

// Adds n values; the max moves at most once per call (once per vector, not per element).
template <bool ENT>
__device__ __forceinline__ void ce_add(CeStat& a, const float* z, int n) {
  float vm = z[0];
  for (int k = 1; k < n; ++k) vm = fmaxf(vm, z[k]);
  if (vm > a.m) {
    if (a.s > 0.f) {
      const float d = a.m - vm, c = __expf(d);
      if (ENT) a.t = c * (a.t + a.s * d);
      a.s *= c;
    }
    a.m = vm;
  }
  if (a.m == ce_neg_inf()) return;  // every value so far is −∞
  for (int k = 0; k < n; ++k) {
    const float u = z[k] - a.m, e = __expf(u);
    a.s += e;
    if (ENT) a.t += e > 0.f ? e * u : 0.f;  // e = 0 at z = −∞, where e·u would be NaN
  }
}

template <bool ENT>
__device__ __forceinline__ void ce_merge(CeStat& a, const CeStat& b) {
  const float m = fmaxf(a.m, b.m);
  if (m == ce_neg_inf()) return;
  const float da = a.s > 0.f ? a.m - m : 0.f, db = b.s > 0.f ? b.m - m : 0.f;
  const float ca = a.s > 0.f ? __expf(da) : 0.f, cb = b.s > 0.f ? __expf(db) : 0.f;
  if (ENT) a.t = ca * (a.t + a.s * da) + cb * (b.t + b.s * db);
  a.s = a.s * ca + b.s * cb;
  a.m = m;
}

template <typename T> struct CeVec { static constexpr int N = 16 / sizeof(T); };

template <typename T, bool ENT>
__device__ __forceinline__ void ce_add_vec(CeStat& st, uint4 raw, float inv_t) {
  constexpr int N = CeVec<T>::N;
  const T* e = reinterpret_cast<const T*>(&raw);
  float z[N];
  for (int k = 0; k < N; ++k) z[k] = ce_to_f<T>(e[k]) * inv_t;
  ce_add<ENT>(st, z, N);
}

// Whether a row's start is 16-byte aligned: the whole row is then read as vectors, its tail element-wise.
__device__ __forceinline__ bool ce_aligned(const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0; }

template <typename T, bool ENT>
__device__ __forceinline__ void ce_fwd(const T* x, const i64* targets, float* logp, float* lse, float* ent, int rows, int V, float inv_t) {
  constexpr int N = CeVec<T>::N;
  __shared__ float red[3][CE_WARPS];
  const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (row >= rows) return;
  const T* xr = x + (i64)row * V;
  const int nvec = ce_aligned(xr) ? V / N : 0;
  CeStat st = {ce_neg_inf(), 0.f, 0.f};
  int i = tid;
  // two loads in flight before their arithmetic
  for (; i + CE_THREADS < nvec; i += 2 * CE_THREADS) {
    const uint4 a = ce_ld(xr + (i64)i * N), b = ce_ld(xr + (i64)(i + CE_THREADS) * N);
    ce_add_vec<T, ENT>(st, a, inv_t);
    ce_add_vec<T, ENT>(st, b, inv_t);
  }
  if (i < nvec) ce_add_vec<T, ENT>(st, ce_ld(xr + (i64)i * N), inv_t);
  for (int j = nvec * N + tid; j < V; j += CE_THREADS) {
    const float z = ce_to_f<T>(xr[j]) * inv_t;
    ce_add<ENT>(st, &z, 1);
  }
  for (int o = 16; o > 0; o >>= 1) {
    CeStat b;
    b.m = __shfl_xor_sync(0xffffffffu, st.m, o);
    b.s = __shfl_xor_sync(0xffffffffu, st.s, o);
    b.t = ENT ? __shfl_xor_sync(0xffffffffu, st.t, o) : 0.f;
    ce_merge<ENT>(st, b);
  }
  if (lane == 0) {
    red[0][warp] = st.m;
    red[1][warp] = st.s;
    red[2][warp] = st.t;
  }
  __syncthreads();
  if (tid != 0) return;
  CeStat r = {red[0][0], red[1][0], red[2][0]};
  for (int w = 1; w < CE_WARPS; ++w) {
    const CeStat b = {red[0][w], red[1][w], red[2][w]};
    ce_merge<ENT>(r, b);
  }
  const float log_s = logf(r.s), L = r.m + log_s;
  lse[row] = L;
  if (ENT) ent[row] = log_s - r.t / r.s;
  if (targets) {
    const i64 t = targets[row];
    logp[row] = t >= 0 && t < V ? ce_to_f<T>(xr[t]) * inv_t - L : 0.f;
  }
}

template <typename T, bool ENT>
__device__ __forceinline__ void ce_bwd_vec(uint4 raw, T* out, int j0, i64 tgt, float L, float a, float gh, float gp, float inv_t) {
  constexpr int N = CeVec<T>::N;
  const T* e = reinterpret_cast<const T*>(&raw);
  uint4 res;
  T* d = reinterpret_cast<T*>(&res);
  for (int k = 0; k < N; ++k) {
    const float u = ce_to_f<T>(e[k]) * inv_t - L, p = __expf(u);
    float dz = ENT ? p * (a - gh * u) : p * a;
    if (j0 + k == tgt) dz += gp;
    d[k] = ce_from_f<T>(dz * inv_t);
  }
  *reinterpret_cast<uint4*>(out) = res;
}

template <typename T, bool ENT>
__device__ __forceinline__ void ce_bwd(const T* x, const i64* targets, const float* lse, const float* ent, const float* g_logp, const float* g_lse, const float* g_ent, T* dx, int rows, int V, float inv_t) {
  constexpr int N = CeVec<T>::N;
  const int row = blockIdx.x, tid = threadIdx.x;
  if (row >= rows) return;
  const T* xr = x + (i64)row * V;
  T* dr = dx + (i64)row * V;
  const float L = lse[row];
  const i64 tgt = targets ? targets[row] : -1;
  const float gp = g_logp && tgt >= 0 && tgt < V ? g_logp[row] : 0.f;
  const float gl = g_lse ? g_lse[row] : 0.f;
  const float gh = ENT && g_ent ? g_ent[row] : 0.f;
  const float H = ENT ? ent[row] : 0.f;
  // dz_j = p_j·(a − g_H·u_j) + [j = t]·g_logp with u_j = z_j − lse and a = g_lse − g_logp − g_H·H
  const float a = gl - gp - gh * H;
  const int nvec = ce_aligned(xr) && ce_aligned(dr) ? V / N : 0;
  if (gp == 0.f && gl == 0.f && gh == 0.f) {
    // a row no loss reads (a masked token): zeros, without reading its logits
    uint4 zero;
    zero.x = zero.y = zero.z = zero.w = 0u;
    for (int i = tid; i < nvec; i += CE_THREADS) *reinterpret_cast<uint4*>(dr + (i64)i * N) = zero;
    for (int j = nvec * N + tid; j < V; j += CE_THREADS) dr[j] = ce_from_f<T>(0.f);
    return;
  }
  int i = tid;
  for (; i + CE_THREADS < nvec; i += 2 * CE_THREADS) {
    const uint4 r0 = ce_ld(xr + (i64)i * N), r1 = ce_ld(xr + (i64)(i + CE_THREADS) * N);
    ce_bwd_vec<T, ENT>(r0, dr + (i64)i * N, i * N, tgt, L, a, gh, gp, inv_t);
    ce_bwd_vec<T, ENT>(r1, dr + (i64)(i + CE_THREADS) * N, (i + CE_THREADS) * N, tgt, L, a, gh, gp, inv_t);
  }
  if (i < nvec) ce_bwd_vec<T, ENT>(ce_ld(xr + (i64)i * N), dr + (i64)i * N, i * N, tgt, L, a, gh, gp, inv_t);
  for (int j = nvec * N + tid; j < V; j += CE_THREADS) {
    const float u = ce_to_f<T>(xr[j]) * inv_t - L, p = __expf(u);
    float dz = ENT ? p * (a - gh * u) : p * a;
    if (j == tgt) dz += gp;
    dr[j] = ce_from_f<T>(dz * inv_t);
  }
}
${instantiate}
`;

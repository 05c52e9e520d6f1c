/**
 * The CUDA C++ of Lathe's greedy-pick kernels, compiled by NVRTC: for each row of logits x [R, V]
 * (bf16, fp16 or fp32, row-major) the index of its first maximum (int64; ties go to the lowest index,
 * as `firstArgMax` of @lathe/rollout picks) and that token's log-probability in float32,
 *   logprob = x_t − max − log Σ_v e^(x_v − max) = −log Σ_v e^(x_v − max),
 * from one read of the row — where the composed greedy path casts the logits to float32, reduces
 * them for the argmax and runs a LogSoftmax over [R, V] before gathering one value a row.
 *
 * One CTA per row: each thread keeps an online (max, first index of the max, Σ e^(x − max)),
 * rescaling the sum when the max grows, over 16-byte vectors (8 bf16/fp16 or 4 fp32 values a load);
 * warps merge by shuffles, then thread 0 merges the warps in order (a deterministic result). A row
 * whose start is not 16-byte aligned reads its first elements one by one up to the first aligned
 * address; elements past the last whole vector are read one by one too.
 *
 * Non-finite values: NaN is never greater than anything, so it is never picked, but it makes the
 * row's sum (and logprob) NaN, as LogSoftmax's would be; a +∞ is picked (its first occurrence) with
 * logprob NaN; −∞ entries weigh 0; a row with no value above −∞ (all −∞ or NaN) gives token 0 and
 * logprob NaN.
 *
 * Kernels (names `greedy_pick_<bf16|fp16|fp32>`): (x, tokens, logprobs, rows, V), grid = rows.
 */
import { floatConversions, streamLoad } from './cuda-snippets';

/** Threads per CTA (one CTA per row). */
export const GREEDY_PICK_THREADS = 512;

/** Element types with a build, by dtype name, with their C type and kernel-name suffix. */
export const GREEDY_PICK_TYPES = {
  bfloat16: { c: '__nv_bfloat16', suffix: 'bf16' },
  float16: { c: '__half', suffix: 'fp16' },
  float32: { c: 'float', suffix: 'fp32' },
} as const;

/** The kernel name for a dtype, e.g. `greedy_pick_bf16`. */
export function greedyPickKernelName(dtype: keyof typeof GREEDY_PICK_TYPES): string {
  return `greedy_pick_${GREEDY_PICK_TYPES[dtype].suffix}`;
}

const instantiate = Object.values(GREEDY_PICK_TYPES)
  .map(
    ({ c, suffix }) => String.raw`
extern "C" __global__ void __launch_bounds__(GP_THREADS) greedy_pick_${suffix}(const ${c}* x, i64* tokens, float* logprobs, int rows, int V) { greedy_pick<${c}>(x, tokens, logprobs, rows, V); }`,
  )
  .join('\n');

/** The whole source: one kernel for every element type. `GP_THREADS` may be predefined (the emulation tests' smaller CTAs). */
export const greedyPickSource = String.raw`
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef GP_THREADS
#define GP_THREADS ${GREEDY_PICK_THREADS}
#endif
#define GP_WARPS ((GP_THREADS + 31) / 32)
typedef long long i64;

${floatConversions('gp')}

__device__ __forceinline__ float gp_neg_inf() { return __int_as_float(0xff800000); }

#ifndef GP_EMULATION
// Every logit is read once: non-coherent path, not kept in L1.
${streamLoad('gp_ld')}
#endif

// A thread's (or a merged group's) running state: max m, the lowest index holding it (V while no
// value above −∞ was seen), and s = Σ e^(x − m).
struct GpStat { float m; int idx; float s; };

// Adds n values at indices j0, j0 + 1, …: their max and its first index, then the sum. The max moves
// at most once per call; a NaN fails every comparison and so only reaches the sum.
__device__ __forceinline__ void gp_add(GpStat& a, const float* z, int n, int j0) {
  float vm = gp_neg_inf();
  int vi = -1;
  for (int k = 0; k < n; ++k)
    if (z[k] > vm) { vm = z[k]; vi = k; }
  if (vm > a.m) {
    a.s *= __expf(a.m - vm);  // e^(−∞) = 0 while nothing was seen
    a.m = vm;
    a.idx = j0 + vi;
  }
  for (int k = 0; k < n; ++k) a.s += z[k] == gp_neg_inf() ? 0.f : __expf(z[k] - a.m);
}

// a ← a ∪ b: the larger max, the lower index on a tie, both sums rescaled to the max.
__device__ __forceinline__ void gp_merge(GpStat& a, const GpStat& b) {
  if (b.m > a.m || (b.m == a.m && b.idx < a.idx)) a.idx = b.idx;
  const float m = fmaxf(a.m, b.m);
  // a part already at the max keeps its sum as is (also when m = −∞, where e^(m − m) would be NaN)
  const float ca = a.m == m ? 1.f : __expf(a.m - m), cb = b.m == m ? 1.f : __expf(b.m - m);
  a.s = a.s * ca + b.s * cb;
  a.m = m;
}

template <typename T>
__device__ __forceinline__ void gp_add_vec(GpStat& st, uint4 raw, int j0) {
  constexpr int N = 16 / sizeof(T);
  const T* e = reinterpret_cast<const T*>(&raw);
  float z[N];
#pragma unroll
  for (int k = 0; k < N; ++k) z[k] = gp_to_f<T>(e[k]);
  gp_add(st, z, N, j0);
}

template <typename T>
__device__ __forceinline__ void greedy_pick(const T* x, i64* tokens, float* logprobs, int rows, int V) {
  constexpr int N = 16 / sizeof(T);
  __shared__ float red_m[GP_WARPS], red_s[GP_WARPS];
  __shared__ int red_i[GP_WARPS];
  const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (row >= rows) return;
  const T* xr = x + (i64)row * V;
  // elements before the first 16-byte boundary (the row start is T-aligned), then whole vectors, then the rest
  const int misalign = (int)(reinterpret_cast<unsigned long long>(xr) & 15ull);
  const int head = min(V, misalign ? (16 - misalign) / (int)sizeof(T) : 0);
  const int nvec = (V - head) / N;
  const T* xv = xr + head;
  GpStat st = {gp_neg_inf(), V, 0.f};
  for (int j = tid; j < head; j += GP_THREADS) {
    const float z = gp_to_f<T>(xr[j]);
    gp_add(st, &z, 1, j);
  }
  int i = tid;
  // two loads in flight before their arithmetic
  for (; i + GP_THREADS < nvec; i += 2 * GP_THREADS) {
    const uint4 a = gp_ld(xv + (i64)i * N), b = gp_ld(xv + (i64)(i + GP_THREADS) * N);
    gp_add_vec<T>(st, a, head + i * N);
    gp_add_vec<T>(st, b, head + (i + GP_THREADS) * N);
  }
  if (i < nvec) gp_add_vec<T>(st, gp_ld(xv + (i64)i * N), head + i * N);
  for (int j = head + nvec * N + tid; j < V; j += GP_THREADS) {
    const float z = gp_to_f<T>(xr[j]);
    gp_add(st, &z, 1, j);
  }
  for (int o = 16; o > 0; o >>= 1) {
    GpStat b;
    b.m = __shfl_xor_sync(0xffffffffu, st.m, o);
    b.idx = __float_as_int(__shfl_xor_sync(0xffffffffu, __int_as_float(st.idx), o));
    b.s = __shfl_xor_sync(0xffffffffu, st.s, o);
    gp_merge(st, b);
  }
  if (lane == 0) {
    red_m[warp] = st.m;
    red_i[warp] = st.idx;
    red_s[warp] = st.s;
  }
  __syncthreads();
  if (tid != 0) return;
  GpStat r = {red_m[0], red_i[0], red_s[0]};
  for (int w = 1; w < GP_WARPS; ++w) {
    const GpStat b = {red_m[w], red_i[w], red_s[w]};
    gp_merge(r, b);
  }
  const bool none = r.idx >= V;
  tokens[row] = none ? 0 : r.idx;
  logprobs[row] = none ? __int_as_float(0x7fc00000) : -logf(r.s);
}
${instantiate}
`;

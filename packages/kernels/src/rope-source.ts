/**
 * The CUDA C++ of Lathe's rotary-embedding kernel, compiled by NVRTC: non-interleaved RoPE exactly as
 * ONNX Runtime's com.microsoft.RotaryEmbedding computes it on x [B, S, heads·headDim] with position
 * ids int64 [B, S] and cos/sin caches [maxPositions, headDim/2] in x's dtype:
 *   y[i] = x[i]·cos[p, i] − x[i + h]·s·sin[p, i],  y[i + h] = x[i + h]·cos[p, i] + x[i]·s·sin[p, i]
 * for i < h = headDim/2, p the token's position and s = ±1 (−1 is the inverse rotation: the gradient).
 * One pass: each thread reads one 16-byte vector of each half of a head (8 bf16/fp16 or 4 fp32
 * values) and the matching cos/sin vectors, computes in fp32, and writes both halves once.
 *
 * Kernels (names `rope_<bf16|fp16|fp32>`): one thread per (row, head, vector of the half-head), under 2³¹ threads;
 * positions outside [0, maxPositions) are clamped into it (ONNX Runtime leaves them undefined).
 */
import { floatConversions, streamLoad } from './cuda-snippets';

/** Threads per CTA. */
export const ROPE_THREADS = 256;

/** Element types with a build, by dtype name, with their C type, kernel-name suffix and elements per 16-byte vector. */
export const ROPE_TYPES = {
  bfloat16: { c: '__nv_bfloat16', suffix: 'bf16', vec: 8 },
  float16: { c: '__half', suffix: 'fp16', vec: 8 },
  float32: { c: 'float', suffix: 'fp32', vec: 4 },
} as const;

/** The kernel name for a dtype, e.g. `rope_bf16`. */
export function ropeKernelName(dtype: keyof typeof ROPE_TYPES): string {
  return `rope_${ROPE_TYPES[dtype].suffix}`;
}

const instantiate = Object.values(ROPE_TYPES)
  .map(
    ({ c, suffix }) => String.raw`
extern "C" __global__ void __launch_bounds__(ROPE_THREADS) rope_${suffix}(const ${c}* x, const i64* pos, const ${c}* cos_cache, const ${c}* sin_cache, ${c}* y, int items, int heads, int half, int max_pos, float sgn) { rope_kernel<${c}>(x, pos, cos_cache, sin_cache, y, items, heads, half, max_pos, sgn); }`,
  )
  .join('\n');

/** The whole source: the kernel for every element type. */
export const ropeSource = String.raw`
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define ROPE_THREADS ${ROPE_THREADS}
typedef long long i64;

${floatConversions('rope')}

#ifndef ROPE_EMULATION
// x is read once: non-coherent path, not kept in L1; the caches are small and shared across rows (default caching).
${streamLoad('rope_ld_stream')}
__device__ __forceinline__ uint4 rope_ld_cache(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
#endif

// items = rows · heads · (half / V) < 2³¹: thread t rotates elements [j·V, j·V + V) of both halves of
// one head; the index math is 32-bit (64-bit division is a long subroutine), the offsets 64-bit.
template <typename T>
__device__ __forceinline__ void rope_kernel(const T* __restrict__ x, const i64* __restrict__ pos, const T* __restrict__ cos_cache, const T* __restrict__ sin_cache, T* __restrict__ y, int items, int heads, int half, int max_pos, float sgn) {
  constexpr int V = 16 / sizeof(T);
  const unsigned t = blockIdx.x * ROPE_THREADS + threadIdx.x;
  if (t >= (unsigned)items) return;
  const unsigned per_head = (unsigned)half / V;
  const unsigned head_row = t / per_head;  // (row, head)
  const int j = (int)(t - head_row * per_head) * V;
  const unsigned row = head_row / (unsigned)heads;
  i64 p = pos[row];
  p = p < 0 ? 0 : (p >= max_pos ? max_pos - 1 : p);
  const i64 base = (i64)head_row * (2 * half) + j;
  const uint4 a = rope_ld_stream(x + base), b = rope_ld_stream(x + base + half);
  const uint4 c = rope_ld_cache(cos_cache + p * half + j), s = rope_ld_cache(sin_cache + p * half + j);
  const T* av = reinterpret_cast<const T*>(&a);
  const T* bv = reinterpret_cast<const T*>(&b);
  const T* cv = reinterpret_cast<const T*>(&c);
  const T* sv = reinterpret_cast<const T*>(&s);
  uint4 oa, ob;
  T* oav = reinterpret_cast<T*>(&oa);
  T* obv = reinterpret_cast<T*>(&ob);
#pragma unroll
  for (int k = 0; k < V; k++) {
    const float x1 = rope_to_f(av[k]), x2 = rope_to_f(bv[k]);
    const float cs = rope_to_f(cv[k]), sn = sgn * rope_to_f(sv[k]);
    oav[k] = rope_from_f<T>(x1 * cs - x2 * sn);
    obv[k] = rope_from_f<T>(x2 * cs + x1 * sn);
  }
  *reinterpret_cast<uint4*>(y + base) = oa;
  *reinterpret_cast<uint4*>(y + base + half) = ob;
}
${instantiate}
`;

/**
 * The CUDA C++ of Lathe's SwiGLU activation kernels, compiled by NVRTC: the gated product of a
 * decoder MLP on gate g and up u (same shape, any layout, n elements), with s = σ(g):
 *   forward   y = silu(g)·u = g·s·u
 *   backward  dg = dy·u·s·(1 + g·(1 − s)),  du = dy·g·s
 * One pass each: a thread reads one 16-byte vector of every input (8 bf16/fp16 or 4 fp32 values),
 * computes in fp32 and rounds each output once — where ONNX Runtime's QuickGelu, Mul and their
 * gradients take several passes over the same [rows, intermediate] tensors.
 *
 * Kernels (names `swiglu_<fwd|bwd>_<bf16|fp16|fp32>`): threads [0, nvec) take a vector each, threads
 * [nvec, nvec + tail) one element each of the last n mod V; under 2³¹ threads; 16-byte aligned buffers.
 *
 * `swiglu_packed_<t>` (inference): the forward on one packed gu [rows, 2·I] — a MatMul over the
 * concatenated gate/up weight, gate in columns [0, I) and up in [I, 2·I) of each row — into y
 * [rows, I], read in place (no Split). A thread takes one 16-byte vector of gate and of up when I is
 * a multiple of V (every row's halves then start 16-byte aligned), else one element (the scalar
 * path); y is the forward's, value for value.
 */
import { floatConversions, streamLoad } from './cuda-snippets';

/** Threads per CTA. */
export const SWIGLU_THREADS = 256;

/** Element types with a build, by dtype name, with their C type, kernel-name suffix and elements per 16-byte vector. */
export const SWIGLU_TYPES = {
  bfloat16: { c: '__nv_bfloat16', suffix: 'bf16', vec: 8 },
  float16: { c: '__half', suffix: 'fp16', vec: 8 },
  float32: { c: 'float', suffix: 'fp32', vec: 4 },
} as const;

/** The kernel name for a pass and dtype, e.g. `swiglu_fwd_bf16`, `swiglu_packed_bf16`. */
export function swigluKernelName(pass: 'fwd' | 'bwd' | 'packed', dtype: keyof typeof SWIGLU_TYPES): string {
  return `swiglu_${pass}_${SWIGLU_TYPES[dtype].suffix}`;
}

const instantiate = Object.values(SWIGLU_TYPES)
  .map(
    ({ c, suffix }) => String.raw`
extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS) swiglu_fwd_${suffix}(const ${c}* g, const ${c}* u, ${c}* y, int nvec, int tail) { swiglu_fwd<${c}>(g, u, y, nvec, tail); }
extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS) swiglu_bwd_${suffix}(const ${c}* dy, const ${c}* g, const ${c}* u, ${c}* dg, ${c}* du, int nvec, int tail) { swiglu_bwd<${c}>(dy, g, u, dg, du, nvec, tail); }
extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS) swiglu_packed_${suffix}(const ${c}* gu, ${c}* y, int rows, int I, int vec) { swiglu_packed<${c}>(gu, y, rows, I, vec); }`,
  )
  .join('\n');

/** The whole source: both passes for every element type. */
export const swigluSource = String.raw`
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define SWIGLU_THREADS ${SWIGLU_THREADS}
typedef long long i64;

${floatConversions('swiglu')}

#ifndef SWIGLU_EMULATION
// Every input is read once: non-coherent path, not kept in L1.
${streamLoad('swiglu_ld')}
#endif

// σ(g) in fp32; saturates to 0 or 1 (never NaN) for large |g|.
__device__ __forceinline__ float swiglu_sigmoid(float g) { return 1.f / (1.f + __expf(-g)); }

__device__ __forceinline__ float swiglu_y(float g, float u) { return g * swiglu_sigmoid(g) * u; }

__device__ __forceinline__ void swiglu_grad(float dy, float g, float u, float& dg, float& du) {
  const float s = swiglu_sigmoid(g);
  du = dy * g * s;
  dg = dy * u * s * (1.f + g * (1.f - s));
}

// One 16-byte vector of gate and of up (16-byte aligned) → one of y: the forward's arithmetic, shared by both layouts.
template <typename T>
__device__ __forceinline__ void swiglu_fwd_vec(const T* g, const T* u, T* y) {
  constexpr int V = 16 / sizeof(T);
  const uint4 a = swiglu_ld(g), b = swiglu_ld(u);
  const T* av = reinterpret_cast<const T*>(&a);
  const T* bv = reinterpret_cast<const T*>(&b);
  uint4 r;
  T* rv = reinterpret_cast<T*>(&r);
#pragma unroll
  for (int k = 0; k < V; k++) rv[k] = swiglu_from_f<T>(swiglu_y(swiglu_to_f(av[k]), swiglu_to_f(bv[k])));
  *reinterpret_cast<uint4*>(y) = r;
}

template <typename T>
__device__ __forceinline__ void swiglu_fwd(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y, int nvec, int tail) {
  constexpr int V = 16 / sizeof(T);
  const unsigned t = blockIdx.x * SWIGLU_THREADS + threadIdx.x;
  if (t < (unsigned)nvec) {
    const i64 o = (i64)t * V;
    swiglu_fwd_vec<T>(g + o, u + o, y + o);
  } else if (t < (unsigned)nvec + (unsigned)tail) {
    const i64 o = (i64)nvec * V + (t - (unsigned)nvec);
    y[o] = swiglu_from_f<T>(swiglu_y(swiglu_to_f(g[o]), swiglu_to_f(u[o])));
  }
}

template <typename T>
__device__ __forceinline__ void swiglu_bwd(const T* __restrict__ dy, const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ dg, T* __restrict__ du, int nvec, int tail) {
  constexpr int V = 16 / sizeof(T);
  const unsigned t = blockIdx.x * SWIGLU_THREADS + threadIdx.x;
  if (t < (unsigned)nvec) {
    const i64 o = (i64)t * V;
    const uint4 d = swiglu_ld(dy + o), a = swiglu_ld(g + o), b = swiglu_ld(u + o);
    const T* dv = reinterpret_cast<const T*>(&d);
    const T* av = reinterpret_cast<const T*>(&a);
    const T* bv = reinterpret_cast<const T*>(&b);
    uint4 rg, ru;
    T* gv = reinterpret_cast<T*>(&rg);
    T* uv = reinterpret_cast<T*>(&ru);
#pragma unroll
    for (int k = 0; k < V; k++) {
      float x, z;
      swiglu_grad(swiglu_to_f(dv[k]), swiglu_to_f(av[k]), swiglu_to_f(bv[k]), x, z);
      gv[k] = swiglu_from_f<T>(x);
      uv[k] = swiglu_from_f<T>(z);
    }
    *reinterpret_cast<uint4*>(dg + o) = rg;
    *reinterpret_cast<uint4*>(du + o) = ru;
  } else if (t < (unsigned)nvec + (unsigned)tail) {
    const i64 o = (i64)nvec * V + (t - (unsigned)nvec);
    float x, z;
    swiglu_grad(swiglu_to_f(dy[o]), swiglu_to_f(g[o]), swiglu_to_f(u[o]), x, z);
    dg[o] = swiglu_from_f<T>(x);
    du[o] = swiglu_from_f<T>(z);
  }
}

// gu [rows, 2·I] → y [rows, I]; vec: a 16-byte vector a thread (I a multiple of V), else one element.
template <typename T>
__device__ __forceinline__ void swiglu_packed(const T* __restrict__ gu, T* __restrict__ y, int rows, int I, int vec) {
  constexpr int V = 16 / sizeof(T);
  const int per_row = vec ? I / V : I;
  const unsigned t = blockIdx.x * SWIGLU_THREADS + threadIdx.x;
  if (t >= (unsigned)rows * (unsigned)per_row) return;
  const unsigned row = t / (unsigned)per_row, c = t % (unsigned)per_row;
  const T* g = gu + (i64)row * 2 * I;
  T* out = y + (i64)row * I;
  if (vec) {
    const i64 o = (i64)c * V;
    swiglu_fwd_vec<T>(g + o, g + I + o, out + o);
  } else {
    out[c] = swiglu_from_f<T>(swiglu_y(swiglu_to_f(g[c]), swiglu_to_f(g[I + c])));
  }
}
${instantiate}
`;

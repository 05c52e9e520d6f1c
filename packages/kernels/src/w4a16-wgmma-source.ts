/**
 * W4A16 on Hopper's warpgroup MMA (`wgmma.mma_async`, sm_90a): for products of 64 rows and more, where
 * the mma.sync tiled kernels fall well short of cuBLAS' dense rate (docs/guides/kernels.md). The weights are
 * wgmma's A operand, dequantized in registers exactly as the tiled kernels do it (so both families share
 * one fragment layout and one rounding); the activations are its B operand, read by the tensor cores
 * from shared memory through a matrix descriptor (128-byte swizzle, K-major). Both operands arrive by
 * cp.async in their stored order (MatMulNBits' layout as it is); the fragments take their codes from
 * the chunk's bytes in wgmma's canonical order.
 */
import { w4a16Preamble, W4A16_TYPES } from './w4a16-source';

/** One wgmma build: a CTA of `wg` warpgroups, each owning 64 output columns (weight rows) × `bm` output rows. */
export interface W4A16WgBuild {
  /** Output rows a CTA (activation rows; wgmma's N): 256 dequantizes each weight fragment once for twice the MMAs of 128. */
  bm: 64 | 128 | 256;
  /** Warpgroups a CTA (64·wg output columns). */
  wg: 1 | 2;
}

/** The wgmma builds (all opt-in until a device A/B picks a default). */
export const W4A16_WG_BUILDS: readonly W4A16WgBuild[] = [
  { bm: 64, wg: 1 },
  { bm: 64, wg: 2 },
  { bm: 128, wg: 1 },
  { bm: 128, wg: 2 },
  { bm: 256, wg: 1 },
  { bm: 256, wg: 2 },
];

/**
 * Chunks of 128 K in shared memory (cp.async stages of activations and packed weights): the one
 * multiplied, the one whose MMAs may still be retiring, and the rest in flight — two for builds of 64
 * and 128 rows, one for 256 rows (four of their 64 KB activation stages do not fit in 227 KB).
 */
export function w4a16WgStages(v: W4A16WgBuild): number {
  return v.bm === 256 ? 3 : 4;
}

/** A build's label, e.g. `wg128x128` (output rows × columns a CTA). */
export function w4a16WgLabel(v: W4A16WgBuild): string {
  return `wg${v.bm}x${64 * v.wg}`;
}

/** The build named by `label` (`wg<rows>x<columns>`), or undefined. */
export function w4a16WgBuild(label: string): W4A16WgBuild | undefined {
  return W4A16_WG_BUILDS.find((v) => w4a16WgLabel(v) === label);
}

/** Output tile (rows × columns) and threads of a build. */
export function w4a16WgDims(v: W4A16WgBuild): { bm: number; bn: number; threads: number } {
  return { bm: v.bm, bn: 64 * v.wg, threads: 128 * v.wg };
}

/** Dynamic shared memory of a build (bytes): each stage's activations [bm][128] in 16 bits and weights [64·wg][64 bytes], and up to 1 KB to align the swizzled atoms. */
export function w4a16WgSmem(v: W4A16WgBuild): number {
  return w4a16WgStages(v) * (v.bm * 256 + 64 * v.wg * 64) + 1024;
}

/** The kernel's name, e.g. `w4a16_bf16_wg_m128_n128`. */
export function w4a16WgKernelName(dtype: keyof typeof W4A16_TYPES, v: W4A16WgBuild): string {
  return `w4a16_${W4A16_TYPES[dtype].suffix}_wg_m${v.bm}_n${64 * v.wg}`;
}

/** The inline-PTX wrapper of one wgmma shape: d [bm/2 fp32] += a (64×16 in four registers) · B (16×bm at desc). */
function mmaWrapper(dtype: keyof typeof W4A16_TYPES, bm: number): string {
  const regs = bm / 2;
  const t = W4A16_TYPES[dtype];
  const ptxType = dtype === 'bfloat16' ? 'bf16' : 'f16';
  const d = Array.from({ length: regs }, (_, i) => `%${i}`).join(', ');
  const outs = Array.from({ length: regs }, (_, i) => `"+f"(d[${i}])`).join(', ');
  return [
    `template <> __device__ __forceinline__ void wg_mma<${t.c}, ${bm}>(float (&d)[${regs}], const unsigned (&a)[4], unsigned long long desc) {`,
    `  asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %${regs + 5}, 0;\\n"`,
    `               "wgmma.mma_async.sync.aligned.m64n${bm}k16.f32.${ptxType}.${ptxType} {${d}}, {%${regs}, %${regs + 1}, %${regs + 2}, %${regs + 3}}, %${regs + 4}, p, 1, 1, 0;\\n}\\n"`,
    `               : ${outs}`,
    `               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));`,
    `}`,
  ].join('\n');
}

const wrappers = (Object.keys(W4A16_TYPES) as (keyof typeof W4A16_TYPES)[]).flatMap((d) => [...new Set(W4A16_WG_BUILDS.map((v) => v.bm))].map((bm) => mmaWrapper(d, bm))).join('\n');

const kernelLines = (Object.keys(W4A16_TYPES) as (keyof typeof W4A16_TYPES)[])
  .flatMap((d) => W4A16_WG_BUILDS.map((v) => `W4A16_WG_KERNEL(${W4A16_TYPES[d].c}, ${v.bm}, ${v.wg}, ${w4a16WgStages(v)}, ${w4a16WgKernelName(d, v)})`))
  .join('\n');

/**
 * The wgmma kernels alone (after {@link w4a16Preamble}; test/w4a16-emulation runs them on the CPU with wgmma
 * emulated: deferred to the wait, so a stage overwritten too early shows).
 */
export const w4a16WgKernels = String.raw`
// ---- The wgmma kernels (sm_90a): a CTA of WG warpgroups owns C's [BM rows × 64·WG columns] tile. ----
#if defined(FA_EMULATION) || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#ifndef FA_EMULATION
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// this thread's generic-proxy stores to shared memory, ordered before the async proxy's (wgmma's) reads
__device__ __forceinline__ void wg_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// keeps the compiler from moving accumulator reads or writes across a wgmma fence or wait
template <int R> __device__ __forceinline__ void wg_fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <typename T, int BM> __device__ __forceinline__ void wg_mma(float (&d)[BM / 2], const unsigned (&a)[4], unsigned long long desc);
${wrappers}
#endif

// A K-major operand in 128-byte swizzled rows at shared address addr: rows 128 bytes apart, 8-row groups 1,024
// apart (the stride), the leading offset unused by this layout (1), swizzle mode 1 (128 bytes).
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3ffffu) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

// Each warp of a warpgroup owns 16 of its 64 weight rows; lane (g, t) holds wgmma's A fragments for rows g and g + 8
// of them in the canonical order (k-step slots 2t, 2t + 1 and 2t + 8, 2t + 9: byte t and byte t + 4 of the step's 8
// bytes of codes, each byte's two nibbles the two halves of a register), dequantized from the chunk's codes in shared
// memory. Both operands come in by cp.async into ST stages of 128 K, ST − 2 chunks in flight: activations [BM][128] as two 64-wide
// atoms of 128-byte rows, the 16-byte unit u of row r at u ^ (r & 7) (the 128-byte swizzle wgmma's descriptor names),
// weights [64·WG][64 bytes]. A chunk's 8 k-steps go as two wgmma groups of 4, their fragments double-buffered: a
// group's registers are rewritten only after the wait that leaves one group in flight has retired the group before
// last. Chunk c's one barrier (after its stage landed) also follows every warpgroup's wait that retired chunk c − 2's
// MMAs, so the stage chunk c − 2 used is refilled right after it. The scales and zero points of a chunk are read a
// chunk ahead.
// W4_TRACE (a compile definition, for tools/bench/quantization/w4a16-wg-trace.ts): thread 0 of CTA (0, 0) stamps clock64 at
// 10 points of each of its first 16 chunks (12 slots a chunk), each after the values named in W4_USE have arrived (a move
// that waits for them), and writes the stamps over the start of C0 at the end.
#ifdef W4_TRACE
#define W4_MARK(c, i) \
  if (trace && (c) < 16) stamps[(c) * 12 + (i)] = clock64();
#define W4_USE(x)                                              \
  {                                                            \
    unsigned u_;                                               \
    asm volatile("mov.b32 %0, %1;\n" : "=r"(u_) : "r"(x));     \
  }
#else
#define W4_MARK(c, i)
#define W4_USE(x)
#endif
template <typename T, int BM, int WG, int ST>
__device__ __forceinline__ void w4a16_wg_body(const T* __restrict__ A, const unsigned char* __restrict__ B, const T* __restrict__ S, const unsigned char* __restrict__ Z, T* __restrict__ C0,
                                              T* __restrict__ C1, T* __restrict__ C2, int M, int N, int n1, int n2, int K, int kb, int bs_log2, unsigned char* smem_raw) {
  constexpr int BN = 64 * WG, THREADS = 128 * WG;
  static_assert(ST >= 3, "a stage multiplied, one retiring and at least one in flight");
  constexpr int A_ATOM = BM * 128, A_STAGE = 2 * A_ATOM, B_STAGE = BN * 64;
  constexpr int A_PER = BM * 16 / THREADS, B_PER = BN * 4 / THREADS;  // a thread's 16-byte copies a chunk
  static_assert(A_PER * THREADS == BM * 16 && B_PER * THREADS == BN * 4, "a chunk's copies must split evenly over the threads");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;
  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
  const int Kp = kb << bs_log2;
  const long long row_bytes = Kp >> 1;
  const int chunks = (Kp + 127) >> 7;
  const int zcols = (kb + 1) >> 1;
  const unsigned magic = W4Magic<T>::bits, magic2 = magic | (magic << 16);
  // byte t of a word in the low half, byte t of the word >> 4 in the high half: its two codes, low nibble first
  const unsigned sel = unsigned(t) | (unsigned(t + 4) << 8);
  // the swizzle works on address bits 4-9: the stages start 1,024-aligned
  unsigned char* sm = smem_raw + ((1024u - ((unsigned)__cvta_generic_to_shared(smem_raw) & 1023u)) & 1023u);
  unsigned char* As = sm;
  unsigned char* Bs = sm + ST * A_STAGE;

  // chunk c into stage st (rows past M or N, units past K or Kp, chunks past the last: zeros)
  auto load = [&](int st, int c) {
#pragma unroll
    for (int i = 0; i < A_PER; ++i) {
      const int idx = tid + THREADS * i, r = idx >> 4, u = idx & 15;
      const int m = m0 + r, k = (c << 7) + 8 * u;
      const bool v = c < chunks && m < M && k < K;
      w4_cp16(As + st * A_STAGE + (u >> 3) * A_ATOM + r * 128 + (((u & 7) ^ (r & 7)) << 4), v ? (const void*)(A + (long long)m * K + k) : (const void*)A, v);
    }
#pragma unroll
    for (int i = 0; i < B_PER; ++i) {
      const int idx = tid + THREADS * i, r = idx >> 2, u = idx & 3;
      const int n = n0 + r, k = (c << 7) + 32 * u;
      const bool v = c < chunks && n < N && k < Kp;
      w4_cp16(Bs + st * B_STAGE + r * 64 + u * 16, v ? (const void*)(B + (long long)n * row_bytes + (k >> 1)) : (const void*)B, v);
    }
  };
  // the scale and zero point of this lane's rows for each quarter (32 codes) of chunk c: quarter q holds k-steps 2q, 2q + 1
  // (a block is at least 32 codes); scale 0 past N, Kp or the last chunk, so those products are 0
  auto scales = [&](int c, unsigned (&so)[2][4], unsigned (&zo)[2][4]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int n = n0 + 64 * wg + 16 * wq + g + 8 * r;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int k = (c << 7) + 32 * q;
        w4_scale_zero<T>(S, Z, n, k, kb, zcols, bs_log2, c < chunks && k < Kp && n < N, so[r][q], zo[r][q]);
      }
    }
  };

  float d[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) d[i] = 0.0f;
  wg_fence_acc(d);
#pragma unroll
  for (int s = 0; s < ST - 2; ++s) {
    load(s, s);
    w4_cp_commit();
  }
  unsigned s2[2][4], z2[2][4];
  scales(0, s2, z2);
  unsigned frag[2][4][4];
#ifdef W4_TRACE
  const bool trace = tid == 0 && blockIdx.x == 0 && blockIdx.y == 0;
  long long stamps[192];
#endif
  for (int c = 0; c < chunks; ++c) {
    W4_MARK(c, 0)
    // chunk c has landed, for every thread (each one's proxy fence, then the barrier): wgmma reads it through the async proxy
    w4_cp_wait<ST - 3>();
    W4_MARK(c, 1)
    wg_fence_proxy();
    __syncthreads();
    // the same barrier says every warpgroup retired chunk c − 2's MMAs (the wait of chunk c − 1's first half): its
    // stage takes chunk c + ST − 2, so a chunk needs one barrier
    load((c + ST - 2) % ST, c + ST - 2);
    w4_cp_commit();
    W4_MARK(c, 2)
    unsigned sn[2][4], zn[2][4];
    scales(c + 1, sn, zn);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int q = 0; q < 4; ++q) w4_scale_zero_use<T>((c << 7) + 32 * q, bs_log2, s2[r][q], z2[r][q]);
    W4_MARK(c, 3)
    const unsigned char* bs = Bs + (c % ST) * B_STAGE;
    const unsigned a_base = (unsigned)__cvta_generic_to_shared(As + (c % ST) * A_STAGE);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // k-steps 4·half .. 4·half + 3: 32 bytes of codes a row, steps 2j and 2j + 1 in each 16
      uint4 w[2][2];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 2; ++j) w[r][j] = *reinterpret_cast<const uint4*>(bs + (64 * wg + 16 * wq + g + 8 * r) * 64 + 32 * half + 16 * j);
      W4_USE(w[1][1].w)
      W4_MARK(c, 4 + 3 * half)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int q = 2 * half + (s >> 1);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const unsigned lo = (s & 1) ? w[r][s >> 1].z : w[r][s >> 1].x, hi = (s & 1) ? w[r][s >> 1].w : w[r][s >> 1].y;
          const unsigned c0 = __byte_perm(lo, lo >> 4, sel), c1 = __byte_perm(hi, hi >> 4, sel);
          frag[half][s][r] = w4_dequant2<T>((c0 & 0x000f000fu) | magic2, z2[r][q], s2[r][q]);
          frag[half][s][r + 2] = w4_dequant2<T>((c1 & 0x000f000fu) | magic2, z2[r][q], s2[r][q]);
        }
      }
      W4_USE(frag[half][3][3])
      W4_MARK(c, 5 + 3 * half)
      wg_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int step = 4 * half + s;
        wg_mma<T, BM>(d, frag[half][s], wg_desc(a_base + (step >> 2) * A_ATOM + (step & 3) * 32));
      }
      wg_commit();
      wg_wait<1>();
      W4_MARK(c, 6 + 3 * half)
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        s2[r][q] = sn[r][q];
        z2[r][q] = zn[r][q];
      }
  }
  wg_wait<0>();
  w4_cp_wait<0>();
  wg_fence_acc(d);

  // accumulator 4j + e: weight row 16·wq + g + 8·(e >> 1) of the warpgroup's 64, activation row 8j + 2t + (e & 1)
#pragma unroll
  for (int j = 0; j < BM / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int n = n0 + 64 * wg + 16 * wq + g + 8 * (e >> 1), m = m0 + 8 * j + 2 * t + (e & 1);
      if (n >= N || m >= M) continue;
      const T v = w4_from_f<T>(d[4 * j + e]);
      if (n < n1) C0[(long long)m * n1 + n] = v;
      else if (n < n2) C1[(long long)m * (n2 - n1) + (n - n1)] = v;
      else C2[(long long)m * (N - n2) + (n - n2)] = v;
    }
#ifdef W4_TRACE
  __syncthreads();
  long long* out = reinterpret_cast<long long*>(C0);
  if (trace)
    for (int i = 0; i < 192; ++i) out[i] = i < 12 * (chunks < 16 ? chunks : 16) ? stamps[i] : 0;
#endif
}

#define W4A16_WG_KERNEL(T, BM, WG, ST, NAME)                                                                                                          \
  extern "C" __global__ void __launch_bounds__(128 * WG) NAME(const T* A, const unsigned char* B, const T* S, const unsigned char* Z, T* C0, T* C1, T* C2, \
                                                              int M, int N, int n1, int n2, int K, int kb, int bs_log2) {                          \
    W4_SHARED(smem);                                                                                                                              \
    w4a16_wg_body<T, BM, WG, ST>(A, B, S, Z, C0, C1, C2, M, N, n1, n2, K, kb, bs_log2, smem);                                                       \
  }
${kernelLines}
#endif
`;

/** The wgmma module's whole source (compiled for sm_90a only: without it the kernels are not in the module). */
export const w4a16WgSource = w4a16Preamble + w4a16WgKernels;

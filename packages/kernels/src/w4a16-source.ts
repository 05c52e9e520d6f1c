/**
 * The CUDA C++ of Lathe's W4A16 matmul (C [M, N] = A [M, K] · dequant(B)ᵀ), compiled by NVRTC: 4-bit
 * weights in ONNX Runtime's MatMulNBits layout — B uint8 [N, kBlocks, blockSize / 2] (low nibble
 * first), scales [N, kBlocks] in A's dtype, optional uint8 zero points [N, ceil(kBlocks / 2)] (low
 * nibble first, default 8), block size 32, 64 or 128 — and bf16 or fp16 activations.
 *
 * A weight-streaming kernel on tensor cores with the operands swapped: the weights are mma.sync
 * m16n8k16's A operand (16 output columns × 16 of K) and the activations its B operand (16 of K × 8
 * rows of A), so a decode batch of 1–8 rows wastes no more than an n8 tile. A CTA owns 16 output
 * columns; its warps split K in chunks of 128 and sum their fp32 accumulators through shared memory
 * at the end (in a fixed order: deterministic). In a chunk, lane (g = lane / 4, t = lane % 4) reads
 * 16 bytes (32 codes) of weight rows n0 + g and n0 + g + 8 with one 128-bit non-caching load each,
 * and the 32 activations of the same K range of its A row(s) with 128-bit loads. The order of K
 * inside a 16-wide step is free as long as both operands follow it: step s takes codes 4s..4s+3 of
 * each lane's 32, so a lane's fragments come from its own loads with no shuffles — its low nibbles
 * (codes 4s, 4s + 2) fill slots 2t, 2t + 1 and its high nibbles (4s + 1, 4s + 3) slots 2t + 8, 2t + 9,
 * and the activations are permuted to match by two byte permutes. Codes become half floats by OR-ing
 * them into the mantissa of 128 (bf16) or 1024 (fp16); (q − zp) · scale is then one exact subtract
 * and one rounding multiply in T — the same values as dequantizing in float and rounding to T.
 *
 * Kernels `w4a16_<bf16|fp16>_m<8·MT>[_n32]`: MT n8 tiles of A rows per CTA (M ≤ 8, 16, 32, 64) and NT
 * column tiles of 16 per warp (`_n32`: two, the activations read once for both; each warp then owns 32
 * columns); grid (ceil(N / (16·NT)), ceil(M / (8·MT))); blockDim 32·warps; dynamic shared memory {@link w4a16Smem}; while a warp multiplies a chunk, its next chunk's weights are in flight.
 * Arguments: A, B, scales, zero points (null: 8), C0, C1, C2, M, N, n1, n2, K, kBlocks, log2(blockSize):
 * output columns [0, n1) go to C0 [M, n1], [n1, n2) to C1 [M, n2 − n1], [n2, N) to C2 [M, N − n2] — one
 * launch for projections that share their input (q/k/v, gate/up) with their weights concatenated
 * along N, each output where its own node would have written it (n1 = n2 = N: one output). A's rows are
 * K apart and K must be a multiple of 8 (16-byte loads); weights past K (the last block's padding)
 * meet zero activations.
 */
import { streamLoad } from './cuda-snippets';

/** A rows per n8 tile count, by kernel: M ≤ 8·MT. */
export const W4A16_TILES = [1, 2, 4, 8] as const;

/** Column tiles of 16 per warp (and CTA): 2 halves the activations' reads from L2 for the same weights, with half the CTAs (4 was slower at every decode shape measured: docs/benchmarks.md). */
export const W4A16_COLUMN_TILES = [1, 2] as const;

/**
 * The builds: n8 tiles MT × column tiles NT, with the most warps a CTA runs — as many as the
 * registers allow without spills (the launch bound caps them), so K up to 2,048–4,096 takes one
 * chunk per warp and every load is in flight at once. Two column tiles are built for M ≤ 16.
 */
export const W4A16_VARIANTS: readonly { mt: (typeof W4A16_TILES)[number]; nt: (typeof W4A16_COLUMN_TILES)[number]; maxWarps: number }[] = [
  { mt: 1, nt: 1, maxWarps: 32 },
  { mt: 2, nt: 1, maxWarps: 24 },
  { mt: 4, nt: 1, maxWarps: 16 },
  { mt: 8, nt: 1, maxWarps: 8 },
  { mt: 1, nt: 2, maxWarps: 16 },
  { mt: 2, nt: 2, maxWarps: 16 },
];

/** Element types with a build, by dtype name, with their C type and kernel-name suffix. */
export const W4A16_TYPES = { bfloat16: { c: '__nv_bfloat16', suffix: 'bf16' }, float16: { c: '__half', suffix: 'fp16' } } as const;

/** The most warps a CTA of MT n8 tiles and NT column tiles runs (see {@link W4A16_VARIANTS}); throws for a combination with no build. */
export function w4a16MaxWarps(mt: number, nt = 1): number {
  const v = W4A16_VARIANTS.find((x) => x.mt === mt && x.nt === nt);
  if (!v) throw new Error(`W4A16 has no build of ${mt} n8 tiles × ${nt} column tiles (builds: ${W4A16_VARIANTS.map((x) => `${x.mt}×${x.nt}`).join(', ')})`);
  return v.maxWarps;
}

/** Dynamic shared memory of a CTA (bytes): every warp's accumulators, for the cross-warp sum (32 KB at most). */
export function w4a16Smem(warps: number, mt: number, nt = 1): number {
  return warps * nt * mt * 128 * 4;
}

/** The kernel name for a dtype and tiles, e.g. `w4a16_bf16_m16`, `w4a16_bf16_m16_n32` (two column tiles). */
export function w4a16KernelName(dtype: keyof typeof W4A16_TYPES, mt: number, nt = 1): string {
  return `w4a16_${W4A16_TYPES[dtype].suffix}_m${8 * mt}${nt === 2 ? '_n32' : ''}`;
}

const kernelLines = (Object.keys(W4A16_TYPES) as (keyof typeof W4A16_TYPES)[])
  .flatMap((d) => W4A16_VARIANTS.map((v) => `W4A16_KERNEL(${W4A16_TYPES[d].suffix}, ${W4A16_TYPES[d].c}, ${v.mt}, ${v.nt}, ${w4a16KernelName(d, v.mt, v.nt)}, ${v.maxWarps})`))
  .join('\n');

/**
 * One tiled build (`w4a16_<t>_tile_m<BM>_n<BN>[_w<warps>][_k<wk>][_c<ck>]`, the Marlin idea): a CTA of wm × wn × wk
 * warps owns an output tile of BM = 8·mt·wm rows × BN = 16·nt·wn columns (each warp 8·mt rows × 16·nt
 * columns) and loops over K in steps of wk chunks of 128, `stages` steps in flight: cp.async copies a step's
 * activations [BM, 128] and packed weights [BN, 64 bytes] per chunk into shared memory while earlier steps are
 * multiplied, so each weight byte is read from L2 once per BM rows and each activation once per BN columns.
 * With wk > 1 the warps of k-group i take chunk i of each step and the groups' fp32 accumulators are summed
 * through shared memory at the end in group order (deterministic): more warps, and more bytes in flight, for a
 * tile whose grid alone would leave SMs idle. With ck > 1 (sm_90 on) a thread-block cluster of ck CTAs (grid z)
 * shares each tile, rank r taking the r-th range of K's steps, then summing (in rank order, over distributed shared
 * memory) and writing the r-th ck-th of the tile's rows: more CTAs for a large tile (few L2 re-reads) without a workspace.
 * `auto`: a candidate of {@link w4a16TilePlan}'s default choice.
 */
export interface W4A16TileVariant {
  /** n8 tiles of rows a warp (8·mt rows). */
  mt: 2 | 4 | 8;
  /** Column tiles of 16 a warp (16·nt columns). */
  nt: 1 | 2;
  /** Warps along the rows, the columns and K. */
  wm: 1 | 2;
  wn: 2 | 4 | 8;
  wk: 1 | 2 | 4;
  stages: 2 | 3 | 4;
  /** CTAs of a thread-block cluster (grid z) splitting K, their sums added over distributed shared memory (1: none; more: sm_90 on). */
  ck: 1 | 2 | 4;
  /** CTAs an SM holds at once (the launch bound's minimum: registers capped to fit, shared memory checked by a test). */
  perSm: 1 | 2;
  auto: boolean;
}

/**
 * The tiled builds. The first three (2 × 2 warps, 3 stages: 64 × 64, 32 × 64, 32 × 32) are the original tiles, kept
 * for the microbenchmark and `tile`; the 8-warp builds give each warp 32–64 rows × 32 columns, so each dequantized
 * weight fragment feeds 4–8 mma.sync and each activation read from shared memory feeds 2, and each activation
 * read from L2 serves 64–256 columns (the original tiles: 32–64); the cluster builds (last three) split K across
 * CTAs — the default plan chooses among the `auto` builds the device runs (128 × 128, 64 × 64 k4 and 64 × 256 c4 are
 * never the fastest on an H200: 64 × 256, 64 × 128 k2 and 64 × 256 c2 beat them on every shape timed).
 * A 64 × 128 tile of 2 × 2 warps (four column tiles a warp) needs more than 255 registers.
 */
export const W4A16_TILE_VARIANTS: readonly W4A16TileVariant[] = [
  { mt: 4, nt: 2, wm: 2, wn: 2, wk: 1, stages: 3, ck: 1, perSm: 1, auto: false },
  { mt: 2, nt: 2, wm: 2, wn: 2, wk: 1, stages: 3, ck: 1, perSm: 1, auto: false },
  { mt: 2, nt: 1, wm: 2, wn: 2, wk: 1, stages: 3, ck: 1, perSm: 1, auto: false },
  { mt: 8, nt: 2, wm: 1, wn: 8, wk: 1, stages: 4, ck: 1, perSm: 1, auto: true },
  { mt: 8, nt: 2, wm: 2, wn: 4, wk: 1, stages: 4, ck: 1, perSm: 1, auto: false },
  { mt: 8, nt: 2, wm: 1, wn: 4, wk: 2, stages: 3, ck: 1, perSm: 1, auto: true },
  { mt: 4, nt: 2, wm: 1, wn: 4, wk: 2, stages: 3, ck: 1, perSm: 2, auto: true },
  { mt: 4, nt: 2, wm: 1, wn: 2, wk: 4, stages: 3, ck: 1, perSm: 1, auto: true },
  { mt: 8, nt: 2, wm: 1, wn: 2, wk: 4, stages: 2, ck: 1, perSm: 1, auto: false },
  { mt: 8, nt: 2, wm: 1, wn: 8, wk: 1, stages: 4, ck: 2, perSm: 1, auto: true },
  { mt: 8, nt: 2, wm: 1, wn: 8, wk: 1, stages: 4, ck: 4, perSm: 1, auto: false },
  { mt: 8, nt: 2, wm: 1, wn: 4, wk: 2, stages: 3, ck: 2, perSm: 1, auto: true },
];

/** Steps of K in flight in the original (2 × 2-warp) tiled kernels: one multiplied while the next two are copied. */
export const W4A16_TILE_STAGES = 3;

/** Threads of an original (2 × 2-warp) tiled kernel's CTA. */
export const W4A16_TILE_THREADS = 128;

type TileShape = Pick<W4A16TileVariant, 'mt' | 'nt'> & Partial<Pick<W4A16TileVariant, 'wm' | 'wn' | 'wk' | 'ck'>>;

/** A tile's warp layout with the original tiles' defaults (2 × 2 warps, no split of K, no cluster), and its build's stages. */
function layout(v: TileShape): { wm: number; wn: number; wk: number; ck: number; stages: number } {
  const wm = v.wm ?? 2, wn = v.wn ?? 2, wk = v.wk ?? 1, ck = v.ck ?? 1;
  const build = W4A16_TILE_VARIANTS.find((x) => x.mt === v.mt && x.nt === v.nt && x.wm === wm && x.wn === wn && x.wk === wk && x.ck === ck);
  return { wm, wn, wk, ck, stages: build?.stages ?? W4A16_TILE_STAGES };
}

/**
 * A tiled build's output tile (BM rows × BN columns), threads, and label: `BMxBN`, then `w<warps>` past 4 warps,
 * `k<wk>` with K split over warps and `c<ck>` over a cluster's CTAs (e.g. `64x64`, `64x128w8k2`, `64x256w8c4`) —
 * what quant-bench's `--kernel-tile` takes.
 */
export function w4a16TileDims(v: TileShape): { bm: number; bn: number; threads: number; label: string } {
  const { wm, wn, wk, ck } = layout(v);
  const bm = 8 * v.mt * wm, bn = 16 * v.nt * wn, warps = wm * wn * wk;
  return { bm, bn, threads: 32 * warps, label: `${bm}x${bn}${warps !== 4 ? `w${warps}` : ''}${wk > 1 ? `k${wk}` : ''}${ck > 1 ? `c${ck}` : ''}` };
}

/** Dynamic shared memory of a tiled kernel (bytes): each stage's wk chunks of activations [BM][128] in 16 bits and weights [BN][64 bytes] (the k-groups' sum at the end reuses them). */
export function w4a16TileSmem(v: TileShape): number {
  const { bm, bn } = w4a16TileDims(v);
  const { wk, stages } = layout(v);
  return stages * wk * (bm * 256 + bn * 64);
}

/** The tiled kernel's name for a dtype and tile, e.g. `w4a16_bf16_tile_m64_n64`, `w4a16_bf16_tile_m64_n128_w8_k2`. */
export function w4a16TileKernelName(dtype: keyof typeof W4A16_TYPES, v: TileShape): string {
  const { bm, bn, threads } = w4a16TileDims(v);
  const { wk, ck } = layout(v);
  return `w4a16_${W4A16_TYPES[dtype].suffix}_tile_m${bm}_n${bn}${threads !== 128 ? `_w${threads / 32}` : ''}${wk > 1 ? `_k${wk}` : ''}${ck > 1 ? `_c${ck}` : ''}`;
}

const tileLines = (Object.keys(W4A16_TYPES) as (keyof typeof W4A16_TYPES)[])
  .flatMap((d) =>
    W4A16_TILE_VARIANTS.map((v) =>
      v.ck > 1
        ? `W4A16_TILE_CLUSTER_KERNEL(${W4A16_TYPES[d].c}, ${v.mt}, ${v.nt}, ${v.wm}, ${v.wn}, ${v.wk}, ${v.stages}, ${v.perSm}, ${v.ck}, ${w4a16TileKernelName(d, v)})`
        : `W4A16_TILE_KERNEL(${W4A16_TYPES[d].c}, ${v.mt}, ${v.nt}, ${v.wm}, ${v.wn}, ${v.wk}, ${v.stages}, ${v.perSm}, ${w4a16TileKernelName(d, v)})`,
    ),
  )
  .join('\n');

/** The types, loads, mma and dequantization every W4A16 kernel shares (the wgmma builds' source starts with it too). */
export const w4a16Preamble = String.raw`
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef W4_SHARED
#define W4_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// Four zero words (not make_uint4: NVRTC need not provide vector_functions.h).
__device__ __forceinline__ uint4 w4_zero4() {
  uint4 z;
  z.x = z.y = z.z = z.w = 0u;
  return z;
}

template <typename T> struct W4Magic;
// 128.0 in bf16 has a mantissa ulp of 1: OR-ing a code q into it gives 128 + q exactly.
template <> struct W4Magic<__nv_bfloat16> { static constexpr unsigned bits = 0x4300u; };
// 1024.0 in fp16, the same for its 10-bit mantissa.
template <> struct W4Magic<__half> { static constexpr unsigned bits = 0x6400u; };

template <typename T> __device__ __forceinline__ T w4_from_f(float x);
template <> __device__ __forceinline__ __nv_bfloat16 w4_from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half w4_from_f<__half>(float x) { return __float2half(x); }

// The device primitives (test/w4a16-emulation/w4-emu.h gives CPU versions with the same results).
#ifndef FA_EMULATION
// 16 bytes read once: through the non-coherent path, not kept in L1.
${streamLoad('w4_ld_stream')}
// 16 bytes of activations (every CTA of the grid reads them: kept in the caches).
__device__ __forceinline__ uint4 w4_ld(const void* p) {
  uint4 r;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
template <typename T> struct W4Mma;
template <> struct W4Mma<__nv_bfloat16> { static constexpr bool bf16 = true; };
template <> struct W4Mma<__half> { static constexpr bool bf16 = false; };
// d (16×8 fp32) += a (16×16, row) · b (16×8, col), the PTX fragment layouts.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (W4Mma<T>::bf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// Two weights (q − zp) · scale from (magic + q) pairs: the subtraction is exact, the product rounds once in T.
template <typename T> __device__ __forceinline__ unsigned w4_dequant2(unsigned q, unsigned z, unsigned s);
template <> __device__ __forceinline__ unsigned w4_dequant2<__nv_bfloat16>(unsigned q, unsigned z, unsigned s) {
  const __nv_bfloat162 r = __hmul2(__hsub2(*reinterpret_cast<const __nv_bfloat162*>(&q), *reinterpret_cast<const __nv_bfloat162*>(&z)), *reinterpret_cast<const __nv_bfloat162*>(&s));
  return *reinterpret_cast<const unsigned*>(&r);
}
template <> __device__ __forceinline__ unsigned w4_dequant2<__half>(unsigned q, unsigned z, unsigned s) {
  const __half2 r = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&q), *reinterpret_cast<const __half2*>(&z)), *reinterpret_cast<const __half2*>(&s));
  return *reinterpret_cast<const unsigned*>(&r);
}
// 16 bytes global → shared without a register round trip; pred false writes 16 zero bytes (src unread).
__device__ __forceinline__ void w4_cp16(void* dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void w4_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N> __device__ __forceinline__ void w4_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// Every thread of the cluster arrives and waits: shared-memory writes before it are visible to the cluster after it.
__device__ __forceinline__ void w4_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The float at this CTA's shared address p in the shared memory of the cluster's CTA of that rank.
__device__ __forceinline__ float w4_ld_cluster(const float* p, unsigned rank) {
  unsigned remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
#endif
#endif

// Row n's scale bits at code k in so and its zero-point byte in zo (0x88 without zero points: 8 in both nibbles), read
// and not used: w4_scale_zero_use makes them w4_dequant2's operands where they are needed, a chunk later, so the loads
// of the next chunk's scales do not wait here; where !valid (past N, Kp or the last chunk) scale 0, so the products are 0.
template <typename T>
__device__ __forceinline__ void w4_scale_zero(const T* __restrict__ S, const unsigned char* __restrict__ Z, long long n, int k, int kb, int zcols, int bs_log2, bool valid, unsigned& so, unsigned& zo) {
  const int blk = k >> bs_log2;
  so = valid ? unsigned(reinterpret_cast<const unsigned short*>(S)[n * kb + blk]) : 0u;
  zo = valid && Z ? unsigned(Z[n * zcols + (blk >> 1)]) : 0x88u;
}
// w4_scale_zero's values for code k as w4_dequant2 takes them: the scale in both halves of so, magic + zero point in both of zo.
template <typename T>
__device__ __forceinline__ void w4_scale_zero_use(int k, int bs_log2, unsigned& so, unsigned& zo) {
  so |= so << 16;
  zo = (W4Magic<T>::bits | ((zo >> (((k >> bs_log2) & 1) << 2)) & 15u)) * 0x10001u;
}
`;

/** The whole source: every kernel for every element type and tile count. */
export const w4a16Source = w4a16Preamble + String.raw`
template <typename T, int MT, int NT>
__device__ __forceinline__ void w4a16_body(const T* __restrict__ A, const unsigned char* __restrict__ B, const T* __restrict__ S, const unsigned char* __restrict__ Z, T* __restrict__ C0,
                                           T* __restrict__ C1, T* __restrict__ C2, int M, int N, int n1, int n2, int K, int kb, int bs_log2, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * (16 * NT), m0 = blockIdx.y * (8 * MT);
  const int Kp = kb << bs_log2;  // K padded to whole blocks
  const long long row_bytes = Kp >> 1;
  const int chunks = (Kp + 127) >> 7;
  const int zcols = (kb + 1) >> 1;
  const unsigned magic = W4Magic<T>::bits, magic2 = magic | (magic << 16);
  float acc[NT][MT][4];
#pragma unroll
  for (int u = 0; u < NT; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[u][j][0] = acc[u][j][1] = acc[u][j][2] = acc[u][j][3] = 0.0f;

  // rows n0 + 16u + g and + 8 of chunk c, for each of the NT column tiles: 16 bytes of codes, the block's
  // scale and zero point (a missing row or chunk reads scale 0: its products are 0 and never written)
  uint4 w[NT][2];
  unsigned s2[NT][2], z2[NT][2];
  auto fetch = [&](int c, uint4 (&wo)[NT][2], unsigned (&so)[NT][2], unsigned (&zo)[NT][2]) {
    const int k = (c << 7) + (t << 5);
#pragma unroll
    for (int u = 0; u < NT; ++u)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int n = n0 + 16 * u + g + 8 * r;
        const bool v = c < chunks && k < Kp && n < N;
        wo[u][r] = v ? w4_ld_stream(B + (long long)n * row_bytes + (k >> 1)) : w4_zero4();
        w4_scale_zero<T>(S, Z, n, k, kb, zcols, bs_log2, v, so[u][r], zo[u][r]);
      }
  };
  fetch(warp, w, s2, z2);
  for (int c = warp; c < chunks; c += warps) {
    const int k = (c << 7) + (t << 5);  // this lane's 32 codes of K
    // the warp's next chunk in flight while this one is multiplied
    uint4 wn[NT][2];
    unsigned sn[NT][2], zn[NT][2];
    fetch(c + warps, wn, sn, zn);
#pragma unroll
    for (int u = 0; u < NT; ++u)
#pragma unroll
      for (int r = 0; r < 2; ++r) w4_scale_zero_use<T>(k, bs_log2, s2[u][r], z2[u][r]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // activations k + 8i .. k + 8i + 7 of each tile's row m0 + 8j + g (0 past M or K): k-steps 2i and 2i + 1,
      // read once for the NT column tiles
      uint4 x[MT];
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        const int m = m0 + 8 * j + g, kk = k + 8 * i;
        x[j] = (m < M && kk < K) ? w4_ld(A + (long long)m * K + kk) : w4_zero4();
      }
#pragma unroll
      for (int u = 0; u < NT; ++u) {
        const unsigned wq[2] = {i == 0 ? w[u][0].x : i == 1 ? w[u][0].y : i == 2 ? w[u][0].z : w[u][0].w, i == 0 ? w[u][1].x : i == 1 ? w[u][1].y : i == 2 ? w[u][1].z : w[u][1].w};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // k-step s = 2i + h: bytes 2s, 2s + 1 of the lane's 16 (codes 4s..4s + 3)
          unsigned a[4];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const unsigned bytes = __byte_perm(wq[r], 0u, h ? 0x4342u : 0x4140u);
            const unsigned lo = (bytes & 0x000f000fu) | magic2, hi = ((bytes >> 4) & 0x000f000fu) | magic2;
            a[r] = w4_dequant2<T>(lo, z2[u][r], s2[u][r]);      // slots 2t, 2t + 1: codes 4s, 4s + 2
            a[r + 2] = w4_dequant2<T>(hi, z2[u][r], s2[u][r]);  // slots 2t + 8, 2t + 9: codes 4s + 1, 4s + 3
          }
#pragma unroll
          for (int j = 0; j < MT; ++j) {
            const unsigned p0 = h ? x[j].z : x[j].x, p1 = h ? x[j].w : x[j].y;  // activations 4s..4s + 3
            mma16816<T>(acc[u][j], a, __byte_perm(p0, p1, 0x5410u), __byte_perm(p0, p1, 0x7632u));
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < NT; ++u)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        w[u][r] = wn[u][r];
        s2[u][r] = sn[u][r];
        z2[u][r] = zn[u][r];
      }
  }

  // every warp's accumulators to shared memory, summed in warp order by the whole CTA
  constexpr int PER_WARP = NT * MT * 128;
#pragma unroll
  for (int u = 0; u < NT; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp * PER_WARP + ((u * MT + j) * 4 + e) * 32 + lane] = acc[u][j][e];
  __syncthreads();
  for (int idx = threadIdx.x; idx < PER_WARP; idx += blockDim.x) {
    float sum = 0.0f;
    for (int w2 = 0; w2 < warps; ++w2) sum += red[w2 * PER_WARP + idx];
    const int u = idx / (MT * 128), j = (idx >> 7) % MT, e = (idx >> 5) & 3, l = idx & 31;
    const int n = n0 + 16 * u + (l >> 2) + (e >> 1) * 8, m = m0 + 8 * j + 2 * (l & 3) + (e & 1);
    if (n >= N || m >= M) continue;
    // columns [0, n1) to C0, [n1, n2) to C1, [n2, N) to C2, each [M, its width]
    if (n < n1) C0[(long long)m * n1 + n] = w4_from_f<T>(sum);
    else if (n < n2) C1[(long long)m * (n2 - n1) + (n - n1)] = w4_from_f<T>(sum);
    else C2[(long long)m * (N - n2) + (n - n2)] = w4_from_f<T>(sum);
  }
}

#define W4A16_KERNEL(SUF, T, MT, NT, NAME, WARPS)                                                                                      \
  extern "C" __global__ void __launch_bounds__(32 * WARPS) NAME(const T* A, const unsigned char* B, const T* S, const unsigned char* Z, T* C0, \
                                                                T* C1, T* C2, int M, int N, int n1, int n2, int K, int kb, int bs_log2) {      \
    W4_SHARED(smem);                                                                                                                        \
    w4a16_body<T, MT, NT>(A, B, S, Z, C0, C1, C2, M, N, n1, n2, K, kb, bs_log2, reinterpret_cast<float*>(smem));                          \
  }
${kernelLines}

// ---- The tiled kernels (16 < M): a CTA of WM × WN × WK warps (CK CTAs of a cluster) owns a [8·MT·WM rows × 16·NT·WN columns] tile of C. ----
// Each warp owns 8·MT rows × 16·NT columns and multiplies as w4a16_body does (weights the mma's A operand,
// lane (g, t) holding codes 32t..32t + 31 of each 128-chunk of its rows), but both operands come from
// shared memory, copied in by cp.async STAGES steps ahead; a step is WK chunks, k-group i of the warps taking
// chunk i. Activations: [BM][128] 16-bit values a chunk, 16-byte unit u of row r stored at unit
// u ^ ((u >> 3) << 1 | (r & 1)), so the 8 lanes of a quarter warp (rows g, g + 1; units 4t + i) hit 8 distinct
// bank groups. Weights: [BN][64 bytes] a chunk, lane t reading bytes 16t..16t + 15 (a quarter warp: 128
// contiguous bytes). Scales and zero points of the next step are read into registers while a step is
// multiplied. The k-groups' accumulators are summed in group order at the end, then the cluster ranks' in rank
// order (each rank a slice of the warp's n8 row tiles): deterministic.
// Unlike w4a16_body, a k-step's slots 2t, 2t + 1 take codes 4s, 4s + 1 (byte 2s's two nibbles) and 2t + 8,
// 2t + 9 codes 4s + 2, 4s + 3 (byte 2s + 1), so the activations' 32-bit words are the B fragments as loaded
// (no permutes, whose cost grows with the rows); a byte's nibbles reach the two halves of a register by one
// byte permute of the word and the word shifted right by 4.
template <typename T, int MT, int NT, int WM, int WN, int WK, int STAGES, int CK>
__device__ __forceinline__ void w4a16_tile_body(const T* __restrict__ A, const unsigned char* __restrict__ B, const T* __restrict__ S, const unsigned char* __restrict__ Z, T* __restrict__ C0,
                                                T* __restrict__ C1, T* __restrict__ C2, int M, int N, int n1, int n2, int K, int kb, int bs_log2, unsigned char* smem) {
  constexpr int BM = 8 * MT * WM, BN = 16 * NT * WN, THREADS = 32 * WM * WN * WK;
  constexpr int A_CHUNK = BM * 256, B_CHUNK = BN * 64, A_STAGE = WK * A_CHUNK, B_STAGE = WK * B_CHUNK;
  constexpr int A_UNITS = BM * 16 * WK, B_UNITS = BN * 4 * WK;  // 16-byte copies a step
  static_assert(A_UNITS % THREADS == 0 && B_UNITS % THREADS == 0, "a step's copies must split evenly over the threads");
  constexpr int PER_WARP = NT * MT * 128;  // accumulators of a warp
  static_assert((WK - 1 + (CK > 1)) * WM * WN * PER_WARP * 4 <= STAGES * (A_STAGE + B_STAGE), "the k-groups' and the cluster's sums must fit in the stages' memory");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  // the warp's column and row slices of the tile and its k-group
  const int wn = warp % WN, wm = (warp / WN) % WM, wk = warp / (WN * WM);
  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
  const int Kp = kb << bs_log2;
  const long long row_bytes = Kp >> 1;
  const int chunks = (Kp + 127) >> 7, all_steps = (chunks + WK - 1) / WK;
  // a cluster of CK CTAs (grid z) splits the steps in consecutive ranges, rank r the r-th
  const int rank = CK > 1 ? (int)blockIdx.z : 0, per_rank = (all_steps + CK - 1) / CK, s0 = rank * per_rank;
  const int steps = all_steps - s0 < per_rank ? (all_steps - s0 > 0 ? all_steps - s0 : 0) : per_rank;
  const int zcols = (kb + 1) >> 1;
  const unsigned magic = W4Magic<T>::bits, magic2 = magic | (magic << 16);
  unsigned char* As = smem;
  unsigned char* Bs = smem + STAGES * A_STAGE;

  // this CTA's step s (the s0 + s-th) into stage st (rows past M or N, units past K or Kp, chunks past the last: zeros)
  auto load = [&](int st, int s) {
    s += s0;
#pragma unroll
    for (int i = 0; i < A_UNITS / THREADS; ++i) {
      const int idx = tid + THREADS * i, q = idx / (BM * 16), r = (idx >> 4) % BM, u = idx & 15;
      const int m = m0 + r, k = ((s * WK + q) << 7) + 8 * u;
      const bool v = m < M && k < K;
      const int p = u ^ (((u >> 3) << 1) | (r & 1));
      w4_cp16(As + st * A_STAGE + q * A_CHUNK + r * 256 + p * 16, v ? (const void*)(A + (long long)m * K + k) : (const void*)A, v);
    }
#pragma unroll
    for (int i = 0; i < B_UNITS / THREADS; ++i) {
      const int idx = tid + THREADS * i, q = idx / (BN * 4), r = (idx >> 2) % BN, u = idx & 3;
      const int n = n0 + r, k = ((s * WK + q) << 7) + 32 * u;
      const bool v = n < N && k < Kp;
      w4_cp16(Bs + st * B_STAGE + q * B_CHUNK + r * 64 + u * 16, v ? (const void*)(B + (long long)n * row_bytes + (k >> 1)) : (const void*)B, v);
    }
  };
  // the scale and zero point of this lane's rows in its k-group's chunk of step s (scale 0 past N or Kp: products 0, never written)
  auto scales = [&](int s, unsigned (&so)[NT][2], unsigned (&zo)[NT][2]) {
    const int c = (s < steps ? s0 + s : all_steps) * WK + wk, k = (c << 7) + (t << 5);
#pragma unroll
    for (int u = 0; u < NT; ++u)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int n = n0 + wn * 16 * NT + 16 * u + g + 8 * r;
        w4_scale_zero<T>(S, Z, n, k, kb, zcols, bs_log2, c < chunks && k < Kp && n < N, so[u][r], zo[u][r]);
      }
  };

  float acc[NT][MT][4];
#pragma unroll
  for (int u = 0; u < NT; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[u][j][0] = acc[u][j][1] = acc[u][j][2] = acc[u][j][3] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < steps) load(s, s);
    w4_cp_commit();
  }
  unsigned s2[NT][2], z2[NT][2];
  scales(0, s2, z2);
  for (int s = 0; s < steps; ++s) {
    // step s has landed (for every thread: the barrier); the stage step s − 1 used is free again
    w4_cp_wait<STAGES - 2>();
    __syncthreads();
    if (s + STAGES - 1 < steps) load((s + STAGES - 1) % STAGES, s + STAGES - 1);
    w4_cp_commit();  // an empty group past the end keeps the wait's count right
    unsigned sn[NT][2], zn[NT][2];
    scales(s + 1, sn, zn);
#pragma unroll
    for (int u = 0; u < NT; ++u)
#pragma unroll
      for (int r = 0; r < 2; ++r) w4_scale_zero_use<T>((((s0 + s) * WK + wk) << 7) + (t << 5), bs_log2, s2[u][r], z2[u][r]);
    const unsigned char* as = As + (s % STAGES) * A_STAGE + wk * A_CHUNK;
    const unsigned char* bs = Bs + (s % STAGES) * B_STAGE + wk * B_CHUNK;
    uint4 w[NT][2];
#pragma unroll
    for (int u = 0; u < NT; ++u)
#pragma unroll
      for (int r = 0; r < 2; ++r) w[u][r] = *reinterpret_cast<const uint4*>(bs + (wn * 16 * NT + 16 * u + g + 8 * r) * 64 + 16 * t);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // activations 32t + 8i .. + 7 of the chunk for row 8j + g of the warp's rows: k-steps 2i and 2i + 1
      uint4 x[MT];
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        const int r = wm * 8 * MT + 8 * j + g, u = 4 * t + i;
        x[j] = *reinterpret_cast<const uint4*>(as + r * 256 + (u ^ (((u >> 3) << 1) | (r & 1))) * 16);
      }
#pragma unroll
      for (int u = 0; u < NT; ++u) {
        const unsigned wq[2] = {i == 0 ? w[u][0].x : i == 1 ? w[u][0].y : i == 2 ? w[u][0].z : w[u][0].w, i == 0 ? w[u][1].x : i == 1 ? w[u][1].y : i == 2 ? w[u][1].z : w[u][1].w};
        const unsigned wq4[2] = {wq[0] >> 4, wq[1] >> 4};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          unsigned a[4];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            // byte b of the word in the low half, byte b of the word >> 4 in the high half: its two codes
            const unsigned c0 = __byte_perm(wq[r], wq4[r], h ? 0x6622u : 0x4400u), c1 = __byte_perm(wq[r], wq4[r], h ? 0x7733u : 0x5511u);
            a[r] = w4_dequant2<T>((c0 & 0x000f000fu) | magic2, z2[u][r], s2[u][r]);      // slots 2t, 2t + 1: codes 4s, 4s + 1
            a[r + 2] = w4_dequant2<T>((c1 & 0x000f000fu) | magic2, z2[u][r], s2[u][r]);  // slots 2t + 8, 2t + 9: codes 4s + 2, 4s + 3
          }
#pragma unroll
          for (int j = 0; j < MT; ++j) mma16816<T>(acc[u][j], a, h ? x[j].z : x[j].x, h ? x[j].w : x[j].y);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < NT; ++u)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        s2[u][r] = sn[u][r];
        z2[u][r] = zn[u][r];
      }
  }
  w4_cp_wait<0>();

  if constexpr (WK > 1 || CK > 1) {
    // k-groups 1.. leave their sums in the stages' memory (every warp is past its last read of it: the barrier);
    // group 0 adds them in group order
    float* red = reinterpret_cast<float*>(smem);
    const int slot = warp % (WM * WN);
    __syncthreads();
    if constexpr (WK > 1) {
      if (wk > 0) {
#pragma unroll
        for (int u = 0; u < NT; ++u)
#pragma unroll
          for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) red[((wk - 1) * WM * WN + slot) * PER_WARP + ((u * MT + j) * 4 + e) * 32 + lane] = acc[u][j][e];
      }
      __syncthreads();
      if (wk == 0)
        for (int q = 0; q < WK - 1; ++q)
#pragma unroll
          for (int u = 0; u < NT; ++u)
#pragma unroll
            for (int j = 0; j < MT; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[u][j][e] += red[(q * WM * WN + slot) * PER_WARP + ((u * MT + j) * 4 + e) * 32 + lane];
    }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    if constexpr (CK > 1) {
      // every rank leaves its CTA's sums in its shared memory; rank r adds n8 row tiles [r·MT/CK, (r + 1)·MT/CK) of all
      // the ranks' sums in rank order over the cluster's shared memory and writes them (the sum spread over the ranks),
      // and the second barrier keeps every rank's memory until all have read it
      static_assert(MT % CK == 0, "a cluster rank sums MT / CK of a warp's n8 row tiles");
      float* part = red + (WK - 1) * WM * WN * PER_WARP + slot * PER_WARP;
      if (wk == 0) {
#pragma unroll
        for (int u = 0; u < NT; ++u)
#pragma unroll
          for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[((u * MT + j) * 4 + e) * 32 + lane] = acc[u][j][e];
      }
      w4_cluster_sync();
      if (wk == 0) {
#pragma unroll
        for (int u = 0; u < NT; ++u)
#pragma unroll
          for (int j = 0; j < MT; ++j) {
            if (j / (MT / CK) != rank) continue;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float* p = part + ((u * MT + j) * 4 + e) * 32 + lane;
              float sum = w4_ld_cluster(p, 0);
              for (int q = 1; q < CK; ++q) sum += w4_ld_cluster(p, q);
              acc[u][j][e] = sum;
            }
          }
      }
      w4_cluster_sync();
    }
#endif
    if (wk > 0) return;
  }

  // each accumulator to its output: columns [0, n1) to C0, [n1, n2) to C1, [n2, N) to C2
#pragma unroll
  for (int u = 0; u < NT; ++u)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = n0 + wn * 16 * NT + 16 * u + g + (e >> 1) * 8, m = m0 + wm * 8 * MT + 8 * j + 2 * t + (e & 1);
        if (n >= N || m >= M || (CK > 1 && j / (MT / CK) != rank)) continue;  // in a cluster, the rank's row tiles
        const T v = w4_from_f<T>(acc[u][j][e]);
        if (n < n1) C0[(long long)m * n1 + n] = v;
        else if (n < n2) C1[(long long)m * (n2 - n1) + (n - n1)] = v;
        else C2[(long long)m * (N - n2) + (n - n2)] = v;
      }
}

// the launch bound: the block's threads, and for builds that two CTAs an SM should run, registers capped to fit them
#define W4T_BOUNDS_1(THREADS) __launch_bounds__(THREADS)
#define W4T_BOUNDS_2(THREADS) __launch_bounds__(THREADS, 2)
#define W4A16_TILE_KERNEL(T, MT, NT, WM, WN, WK, STAGES, PER_SM, NAME)                                                                              \
  extern "C" __global__ void W4T_BOUNDS_##PER_SM(32 * WM * WN * WK) NAME(const T* A, const unsigned char* B, const T* S, const unsigned char* Z, T* C0, T* C1, \
                                                                     T* C2, int M, int N, int n1, int n2, int K, int kb, int bs_log2) {                \
    W4_SHARED(smem);                                                                                                                                  \
    w4a16_tile_body<T, MT, NT, WM, WN, WK, STAGES, 1>(A, B, S, Z, C0, C1, C2, M, N, n1, n2, K, kb, bs_log2, smem);                                   \
  }
// a cluster of CK CTAs along the grid's z over one tile, K split between them (sm_90 on)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define W4A16_TILE_CLUSTER_KERNEL(T, MT, NT, WM, WN, WK, STAGES, PER_SM, CK, NAME)                                                                   \
  extern "C" __global__ void W4T_BOUNDS_##PER_SM(32 * WM * WN * WK) __cluster_dims__(1, 1, CK) NAME(const T* A, const unsigned char* B, const T* S,         \
                                                                     const unsigned char* Z, T* C0, T* C1, T* C2, int M, int N, int n1, int n2, int K, int kb, int bs_log2) { \
    W4_SHARED(smem);                                                                                                                                  \
    w4a16_tile_body<T, MT, NT, WM, WN, WK, STAGES, CK>(A, B, S, Z, C0, C1, C2, M, N, n1, n2, K, kb, bs_log2, smem);                                  \
  }
#else
#define W4A16_TILE_CLUSTER_KERNEL(T, MT, NT, WM, WN, WK, STAGES, PER_SM, CK, NAME)
#endif
${tileLines}
`;

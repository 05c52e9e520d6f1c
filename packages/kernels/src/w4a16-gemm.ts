/**
 * INT4 products of many rows (decode batches past the W4A16 kernels' rows, prefill) as Lathe's
 * dequantize into a scratch, then cuBLAS.
 *
 * At 256 rows and more a weight-only kernel competes with cuBLAS' dense GEMM, not with the weights'
 * bytes, and at Qwen3-0.6B/1.7B sizes neither W4A16 kernel family comes near it
 * (docs/guides/kernels.md). MatMulNBits dequantizes too, but holds q/k/v and gate/up apart: seven
 * GEMMs a layer where dense bf16 runs four. Here a node takes a fused group's concatenated weights,
 * dequantizes them on the compute stream (`slots` 0) and runs one cuBLAS call per output, or one for
 * the group read packed (`Weights.packed` of @lathe/models).
 *
 * With `group` 4 the first product of each run of four — a decoder layer's q/k/v, o, gate/up and
 * down — dequantizes all four weights in one launch into one scratch, and the other three read their
 * part of it: a launch's ramp and tail a layer instead of four. The order is a data edge: each later
 * product of the run reads the first one's output, and the next run's first product the last one's,
 * so the pipeline then takes its products in the order it was made with (a graph reading them in
 * another order is refused at build, naming the projection expected).
 *
 * With `slots` ≥ 1 each projection is instead dequantized ahead, into one of `slots` scratch buffers
 * on a side stream, while the compute stream runs the products before it; the product then waits for
 * its buffer's event. On an H200 this measured slower (the side stream's dequantizes contend with
 * the products for the SMs), so it is opt-in.
 *
 * With slots, the graph side (`w4a16GemmOps().pipeline`) makes the order explicit with data edges, since ONNX
 * Runtime runs a graph's nodes in one fixed order on one stream:
 *  - `Prefetch(j)` (dequantize projection j into slot j mod S) reads product j − S's output (the last
 *    reader of that slot), so it is enqueued after it;
 *  - `Gemm(j)` reads the tokens of `Prefetch(j)` (its weights) and `Prefetch(j + S − 1)` (so that one is
 *    enqueued before product j: ORT's order puts it just before, after the attention or norm between).
 * So each dequantize runs on the side stream over the S − 1 products before its own (and what lies
 * between them), and is joined just before its own product; events order the streams, in a CUDA-graph
 * capture as well. test/w4a16-pipeline.test.ts (quantization) checks that order in ORT's profile.
 * On the CPU the nodes compute the product on the host (float32) for tests of the wiring.
 */
import * as L from '@lathe/onnx';
import { type DType, type OpDef, type Tensor } from '@lathe/onnx';
import { type DeviceKind, type SessionOptions } from '@lathe/runtime';
import { opFamily, type CustomOpInput, type CustomOps } from './custom-op';
import { type Handle } from './driver';
import { cudaIncludeDir } from './flash-attention';
import { type ArgValues } from './args';
import { type Kernel, type Kernels } from './kernels';
import { loadLibrary } from './library';
import { w4a16HostProduct, type W4A16Attrs, type W4A16Shape } from './w4a16';
import { w4a16Preamble, W4A16_TYPES } from './w4a16-source';

/**
 * The dequantize kernel: B (MatMulNBits' 4-bit layout) → W [N, K] in T, after {@link w4a16Preamble} (its magic-number
 * conversion and w4a16Preamble's `w4_dequant2`, so every weight equals the matmul kernels' and MatMulNBits' bit for
 * bit). A warp takes 128 consecutive words of one row of codes a step (each word 8 weights of one block, 16 bytes
 * out), lane l words l, l + 32, l + 64 and l + 96: each load (4 bytes a lane) and store (16) of the warp is contiguous,
 * a lane has four loads in flight, and the row is found by one division a step rather than one a word.
 */
export const w4a16DequantSource =
  w4a16Preamble +
  String.raw`
#define W4D_WORDS 4
// One warp step: words [step·128, step·128 + 128) of row n's codes → W's row n.
template <typename T>
__device__ __forceinline__ void w4d_step(const unsigned* __restrict__ B, const T* __restrict__ S, const unsigned char* __restrict__ Z, T* __restrict__ W, int K, int kb, int bs_log2,
                                         unsigned n, unsigned step, unsigned lane) {
  const unsigned per_row = unsigned(K) >> 3;                // words of codes a row of W
  const unsigned row_words = unsigned(kb << bs_log2) >> 3;  // B's rows are padded to whole blocks
  const unsigned zcols = unsigned(kb + 1) >> 1;
  const unsigned magic2 = W4Magic<T>::bits * 0x10001u;
  const unsigned c0 = step * (32 * W4D_WORDS) + lane;
  unsigned q[W4D_WORDS], so[W4D_WORDS], zo[W4D_WORDS];
#pragma unroll
  for (int u = 0; u < W4D_WORDS; ++u) {
    const unsigned c = c0 + 32 * u;
    const bool valid = c < per_row;
    const unsigned blk = (c << 3) >> bs_log2;
    q[u] = valid ? __ldg(B + (size_t)n * row_words + c) : 0u;
    so[u] = valid ? unsigned(__ldg(reinterpret_cast<const unsigned short*>(S) + (size_t)n * kb + blk)) : 0u;
    zo[u] = valid && Z ? unsigned(__ldg(Z + (size_t)n * zcols + (blk >> 1))) >> ((blk & 1) << 2) : 8u;
  }
#pragma unroll
  for (int u = 0; u < W4D_WORDS; ++u) {
    const unsigned c = c0 + 32 * u;
    if (c >= per_row) break;
    const unsigned s2 = so[u] * 0x10001u, z2 = (W4Magic<T>::bits | (zo[u] & 15u)) * 0x10001u;
    // codes j and j + 4 share a pair: (magic + q) in each half, the subtraction exact, the product rounded once
    const unsigned d0 = w4_dequant2<T>((q[u] & 0x000f000fu) | magic2, z2, s2), d1 = w4_dequant2<T>(((q[u] >> 4) & 0x000f000fu) | magic2, z2, s2);
    const unsigned d2 = w4_dequant2<T>(((q[u] >> 8) & 0x000f000fu) | magic2, z2, s2), d3 = w4_dequant2<T>(((q[u] >> 12) & 0x000f000fu) | magic2, z2, s2);
    uint4 out;
    out.x = __byte_perm(d0, d1, 0x5410u);
    out.y = __byte_perm(d2, d3, 0x5410u);
    out.z = __byte_perm(d0, d1, 0x7632u);
    out.w = __byte_perm(d2, d3, 0x7632u);
    *reinterpret_cast<uint4*>(W + (size_t)n * K + ((size_t)c << 3)) = out;
  }
}
__device__ __forceinline__ unsigned w4d_steps(int K) { return (unsigned(K) / 8 + 32 * W4D_WORDS - 1) / (32 * W4D_WORDS); }
template <typename T>
__device__ __forceinline__ void w4a16_dequant_body(const unsigned* __restrict__ B, const T* __restrict__ S, const unsigned char* __restrict__ Z, T* __restrict__ W,
                                                   int N, int K, int kb, int bs_log2) {
  const unsigned steps = w4d_steps(K), items = unsigned(N) * steps;
  const unsigned lane = threadIdx.x & 31, warps = (gridDim.x * blockDim.x) >> 5;
  for (unsigned item = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; item < items; item += warps) {
    const unsigned n = item / steps;
    w4d_step<T>(B, S, Z, W, K, kb, bs_log2, n, item - n * steps, lane);
  }
}
// Up to four weights in one launch (N = 0: none): the grid-stride loop runs over their steps one after the other.
#define W4D_JOB(T, i) const unsigned *B##i, const T *S##i, const unsigned char *Z##i, T *W##i, int N##i, int K##i, int kb##i, int bs##i
#define W4D_RUN(i)                                                                       \
  if (item < items##i) {                                                                 \
    const unsigned n = item / steps##i;                                                  \
    w4d_step<T>(B##i, S##i, Z##i, W##i, K##i, kb##i, bs##i, n, item - n * steps##i, lane); \
    continue;                                                                            \
  }                                                                                      \
  item -= items##i;
template <typename T>
__device__ __forceinline__ void w4a16_dequant4_body(W4D_JOB(T, 0), W4D_JOB(T, 1), W4D_JOB(T, 2), W4D_JOB(T, 3)) {
  const unsigned steps0 = w4d_steps(K0), steps1 = w4d_steps(K1), steps2 = w4d_steps(K2), steps3 = w4d_steps(K3);
  const unsigned items0 = unsigned(N0) * steps0, items1 = unsigned(N1) * steps1, items2 = unsigned(N2) * steps2, items3 = unsigned(N3) * steps3;
  const unsigned total = items0 + items1 + items2 + items3;
  const unsigned lane = threadIdx.x & 31, warps = (gridDim.x * blockDim.x) >> 5;
  for (unsigned it = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; it < total; it += warps) {
    unsigned item = it;
    W4D_RUN(0)
    W4D_RUN(1)
    W4D_RUN(2)
    W4D_RUN(3)
  }
}
extern "C" __global__ void w4a16_dequant_bf16(const unsigned* B, const __nv_bfloat16* S, const unsigned char* Z, __nv_bfloat16* W, int N, int K, int kb, int bs_log2) {
  w4a16_dequant_body<__nv_bfloat16>(B, S, Z, W, N, K, kb, bs_log2);
}
extern "C" __global__ void w4a16_dequant_fp16(const unsigned* B, const __half* S, const unsigned char* Z, __half* W, int N, int K, int kb, int bs_log2) {
  w4a16_dequant_body<__half>(B, S, Z, W, N, K, kb, bs_log2);
}
#define W4D_ARGS(i) B##i, S##i, Z##i, W##i, N##i, K##i, kb##i, bs##i
extern "C" __global__ void w4a16_dequant4_bf16(W4D_JOB(__nv_bfloat16, 0), W4D_JOB(__nv_bfloat16, 1), W4D_JOB(__nv_bfloat16, 2), W4D_JOB(__nv_bfloat16, 3)) {
  w4a16_dequant4_body<__nv_bfloat16>(W4D_ARGS(0), W4D_ARGS(1), W4D_ARGS(2), W4D_ARGS(3));
}
extern "C" __global__ void w4a16_dequant4_fp16(W4D_JOB(__half, 0), W4D_JOB(__half, 1), W4D_JOB(__half, 2), W4D_JOB(__half, 3)) {
  w4a16_dequant4_body<__half>(W4D_ARGS(0), W4D_ARGS(1), W4D_ARGS(2), W4D_ARGS(3));
}
`;

const DEQUANT_SIG = ['ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'i32'] as const;
type DequantSig = typeof DEQUANT_SIG;
const DEQUANT4_SIG = [...DEQUANT_SIG, ...DEQUANT_SIG, ...DEQUANT_SIG, ...DEQUANT_SIG] as const;
type Dequant4Sig = typeof DEQUANT4_SIG;
/** Weights one group launch dequantizes at most (`w4a16_dequant4_*`). */
export const W4A16_GEMM_MAX_GROUP = 4;
const DEQUANT_THREADS = 256;

/** cuBLAS' `cudaDataType` of each 16-bit dtype, and the enums of the one call made. */
const CUDA_R: Record<string, number> = { bfloat16: 14, float16: 2 };
const CUBLAS_OP_N = 0;
const CUBLAS_OP_T = 1;
const CUBLAS_COMPUTE_32F = 68;
const CUBLAS_GEMM_DEFAULT = -1;
/** cuBLAS' workspace, set once so a call never allocates (a CUDA-graph capture cannot). */
const CUBLAS_WORKSPACE_BYTES = 32 << 20;

type CublasFn = (...args: unknown[]) => number;

/** The four cuBLAS entry points used, bound to one handle whose workspace Lathe owns. */
class Cublas {
  private readonly f: Record<'create' | 'destroy' | 'setStream' | 'setWorkspace' | 'gemm', CublasFn>;
  readonly handle: Handle;
  private stream: Handle | undefined;
  private readonly one = new Float32Array([1]);
  private readonly zero = new Float32Array([0]);

  constructor(
    path: string | undefined,
    private readonly workspace: Handle,
  ) {
    const { lib } = loadLibrary('cublas', path ? [path] : undefined);
    const decl = (sig: string) => lib.func(sig) as CublasFn;
    this.f = {
      create: decl('int cublasCreate_v2(_Out_ void** handle)'),
      destroy: decl('int cublasDestroy_v2(void* handle)'),
      setStream: decl('int cublasSetStream_v2(void* handle, void* stream)'),
      setWorkspace: decl('int cublasSetWorkspace_v2(void* handle, uint64_t workspace, size_t bytes)'),
      gemm: decl(
        'int cublasGemmEx(void* handle, int transa, int transb, int m, int n, int k, const void* alpha, uint64_t A, int Atype, int lda, uint64_t B, int Btype, int ldb, const void* beta, uint64_t C, int Ctype, int ldc, int computeType, int algo)',
      ),
    };
    const out: (Handle | null)[] = [null];
    this.check('cublasCreate', this.f.create(out));
    this.handle = out[0]!;
    this.check('cublasSetWorkspace', this.f.setWorkspace(this.handle, this.workspace, CUBLAS_WORKSPACE_BYTES));
  }

  private check(fn: string, status: number): void {
    if (status !== 0) throw new Error(`${fn} failed with cublasStatus ${status}`);
  }

  /** C [M, w] (row-major) = x [M, K] · W[rows, :]ᵀ on `stream`, W [*, K] row-major: cuBLAS' column-major TN product. */
  gemm(dtype: DType, M: number, w: number, K: number, x: Handle, weights: Handle, c: Handle, stream: Handle): void {
    if (this.stream !== stream) {
      this.check('cublasSetStream', this.f.setStream(this.handle, stream));
      this.stream = stream;
    }
    const t = CUDA_R[dtype];
    this.check('cublasGemmEx', this.f.gemm(this.handle, CUBLAS_OP_T, CUBLAS_OP_N, w, M, K, this.one, weights, t, K, x, t, K, this.zero, c, t, w, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  dispose(): void {
    this.check('cublasDestroy', this.f.destroy(this.handle));
  }
}

/** Weights of one product as {@link W4A16Gemm.dequantize} reads them. */
export interface W4A16DequantArgs {
  /** uint8 [N, kBlocks, blockSize / 2]. */
  b: Handle;
  /** [N, kBlocks] in the shape's dtype. */
  scales: Handle;
  /** uint8 [N, ceil(kBlocks / 2)], or 0n for the default zero point 8. */
  zeroPoints: Handle;
}

/**
 * The CUDA side of the pipeline on one device: the dequantize kernels, a cuBLAS handle, the side
 * stream with one event a slot, and the slot buffers (grown as graphs ask; a buffer replaced stays
 * allocated until {@link dispose}, since a captured CUDA graph may still hold its address).
 */
export class W4A16Gemm {
  /** The stream dequantizes are forked onto. */
  readonly side: Handle;
  private readonly fork: Handle;
  private readonly ready: Handle[] = [];
  private readonly slotBuffers: { ptr: Handle; bytes: number }[] = [];
  private readonly retired: Handle[] = [];

  private constructor(
    readonly kernels: Kernels,
    private readonly dequantKernels: Map<string, Kernel<DequantSig>>,
    private readonly dequant4Kernels: Map<string, Kernel<Dequant4Sig>>,
    private readonly cublas: Cublas,
    private readonly workspace: Handle,
  ) {
    this.side = kernels.driver.createStream(1); // non-blocking: it never waits on the legacy stream
    this.fork = kernels.driver.createEvent(false);
  }

  /** Compiles the dequantize kernels and opens cuBLAS (`cublasPath`, else the usual places: a `KernelLibraryError` naming the fix). */
  static create(kernels: Kernels, opts: { includeDir?: string; cublasPath?: string } = {}): W4A16Gemm {
    const mod = kernels.compile(w4a16DequantSource, { name: 'lathe_w4a16_dequant', options: [`-I${opts.includeDir ?? cudaIncludeDir()}`, '--std=c++17'] });
    const dq = new Map<string, Kernel<DequantSig>>();
    const dq4 = new Map<string, Kernel<Dequant4Sig>>();
    for (const dtype of Object.keys(W4A16_TYPES) as (keyof typeof W4A16_TYPES)[]) {
      dq.set(dtype, mod.kernel(`w4a16_dequant_${W4A16_TYPES[dtype].suffix}`, DEQUANT_SIG));
      dq4.set(dtype, mod.kernel(`w4a16_dequant4_${W4A16_TYPES[dtype].suffix}`, DEQUANT4_SIG));
    }
    const workspace = kernels.driver.alloc(CUBLAS_WORKSPACE_BYTES);
    try {
      return new W4A16Gemm(kernels, dq, dq4, new Cublas(opts.cublasPath, workspace), workspace);
    } catch (e) {
      kernels.driver.free(workspace);
      throw e;
    }
  }

  /** Slot `i`'s buffer, at least `bytes` long (grown now: call while building graphs, never inside a capture). */
  reserve(i: number, bytes: number): void {
    while (this.ready.length <= i) this.ready.push(this.kernels.driver.createEvent(false));
    const cur = this.slotBuffers[i];
    if (cur && cur.bytes >= bytes) return;
    if (cur) this.retired.push(cur.ptr);
    this.slotBuffers[i] = { ptr: this.kernels.driver.alloc(bytes), bytes };
  }

  /** Slot `i`'s buffer address ({@link reserve} first). */
  slot(i: number): Handle {
    const s = this.slotBuffers[i];
    if (!s) throw new Error(`W4A16Gemm: slot ${i} was never reserved`);
    return s.ptr;
  }

  /** Queues W [N, K] = dequant(B) into `w` on `stream`. */
  dequantize(shape: Omit<W4A16Shape, 'M' | 'widths'>, a: W4A16DequantArgs, w: Handle, stream: Handle): void {
    // a warp step: 128 words of one row; at most 8 CTAs an SM, the rest by the grid-stride loop
    const items = shape.N * Math.ceil(shape.K / 8 / 128);
    if (items === 0) return;
    const grid = Math.min(Math.ceil(items / (DEQUANT_THREADS / 32)), this.kernels.smCount * 8);
    this.dequantKernels.get(shape.dtype)!.launch({ grid, block: DEQUANT_THREADS, stream }, a.b, a.scales, a.zeroPoints, w, shape.N, shape.K, shape.kBlocks, Math.log2(shape.blockSize));
  }

  /**
   * Queues the weights of up to {@link W4A16_GEMM_MAX_GROUP} products (one dtype) in one launch, each into W [N, K] at
   * its own address `w` (one launch's tail instead of one a product).
   */
  dequantizeGroup(dtype: DType, jobs: readonly { shape: Omit<W4A16Shape, 'M' | 'widths' | 'dtype'>; args: W4A16DequantArgs; w: Handle }[], stream: Handle): void {
    if (jobs.length === 0 || jobs.length > W4A16_GEMM_MAX_GROUP) throw new Error(`W4A16Gemm.dequantizeGroup: 1 to ${W4A16_GEMM_MAX_GROUP} weights a launch, got ${jobs.length}`);
    const items = jobs.reduce((n, j) => n + j.shape.N * Math.ceil(j.shape.K / 8 / 128), 0);
    if (items === 0) return;
    const grid = Math.min(Math.ceil(items / (DEQUANT_THREADS / 32)), this.kernels.smCount * 8);
    // an unused job has no rows (N 0): the kernel runs none of its steps
    const job = (j: (typeof jobs)[number] | undefined): ArgValues<DequantSig> =>
      j ? [j.args.b, j.args.scales, j.args.zeroPoints, j.w, j.shape.N, j.shape.K, j.shape.kBlocks, Math.log2(j.shape.blockSize)] : [0n, 0n, 0n, 0n, 0, 8, 1, 5];
    this.dequant4Kernels.get(dtype)!.launch({ grid, block: DEQUANT_THREADS, stream }, ...job(jobs[0]), ...job(jobs[1]), ...job(jobs[2]), ...job(jobs[3]));
  }

  /** Queues slot `i`'s dequantize on the side stream, after everything queued on `stream` so far, and records the slot's event. */
  prefetch(i: number, shape: Omit<W4A16Shape, 'M' | 'widths'>, a: W4A16DequantArgs, stream: Handle): void {
    const d = this.kernels.driver;
    d.record(this.fork, stream);
    d.waitEvent(this.side, this.fork);
    this.dequantize(shape, a, this.slot(i), this.side);
    d.record(this.ready[i], this.side);
  }

  /** Makes `stream` wait for slot `i`'s last prefetch. */
  join(i: number, stream: Handle): void {
    this.kernels.driver.waitEvent(stream, this.ready[i]);
  }

  /** Queues the outputs c[i] [M, widths[i]] = x [M, K] · W[rows of width i]ᵀ (W [N, K] at `w`) on `stream`: one cuBLAS call per output. */
  gemm(dtype: DType, M: number, K: number, widths: readonly number[], x: Handle, w: Handle, c: readonly Handle[], stream: Handle): void {
    if (M === 0) return;
    const bytes = BigInt(dtype === 'float32' ? 4 : 2);
    let start = 0;
    widths.forEach((width, i) => {
      this.cublas.gemm(dtype, M, width, K, x, w + BigInt(start) * BigInt(K) * bytes, c[i], stream);
      start += width;
    });
  }

  /** Frees the buffers, events, stream and cuBLAS handle (after every session using them). */
  dispose(): void {
    const d = this.kernels.driver;
    d.synchronize(this.side);
    this.cublas.dispose();
    for (const p of [...this.retired, ...this.slotBuffers.map((s) => s.ptr), this.workspace]) d.free(p);
    for (const e of [...this.ready, this.fork]) d.destroyEvent(e);
    d.destroyStream(this.side);
  }
}

/** One INT4 projection of a pipeline, in the order the graph reads them. */
export interface W4A16GemmProjection {
  /** Names the projection (the weight, or a fused group's name) in errors and node names. */
  key: string;
  b: Tensor;
  scales: Tensor;
  zeroPoints?: Tensor;
  attrs: W4A16Attrs;
  /** Outputs' widths (2 or 3) for projections whose weights are concatenated along N; absent: one output. */
  widths?: readonly number[];
}

/**
 * Reads each projection of the list through the pipeline, in order: `project(key, x)` → its outputs (one per width);
 * `packed`: a fused group's product as one output [.., N] (one GEMM, for consumers that read it packed).
 */
export type W4A16GemmPipeline = (key: string, x: Tensor, packed?: boolean) => Tensor[];

/** The graph side of {@link W4A16Gemm}. */
export interface W4A16GemmOps extends CustomOps {
  /** Session options that register the domain (to spread into the session's). */
  session: Pick<SessionOptions, 'customOpDomains'>;
  /** Scratch slots (0: each product dequantizes on the compute stream itself). */
  readonly slots: number;
  /** Consecutive products whose weights one dequantize launch covers (1: each its own). */
  readonly group: number;
  /**
   * A pipeline over `projections` for one graph: with slots or groups, call it for each in that order (anything else throws,
   * naming the projection expected); without, for any of them in any order. Reserves the slots' buffers now.
   */
  pipeline(projections: readonly W4A16GemmProjection[]): W4A16GemmPipeline;
  /** Why a projection cannot go through the pipeline with activations in `dtype`, or undefined. */
  unsupported(attrs: W4A16Attrs, dtype: DType): string | undefined;
}

/**
 * Slots a pipeline takes by default: none, each product dequantizing on the compute stream — on an H200 the side
 * stream's dequantizes contended with the products for the SMs and decoded slower (docs/benchmarks.md, quantization).
 */
export const W4A16_GEMM_SLOTS = 0;

/**
 * Products whose weights one dequantize launch covers by default: a decoder layer's four (q/k/v, o, gate/up, down).
 * The per-product launches are bound by their count, not their arithmetic, and one a layer decoded faster on an H200
 * with the same start-up (docs/benchmarks.md, quantization).
 */
export const W4A16_GEMM_GROUP = 4;

/**
 * The pipeline's custom ops for graphs on `provider` (CUDA needs `gemm`, made on the kernels whose stream the
 * device's sessions run on). `slots` ({@link W4A16_GEMM_SLOTS} by default): scratch buffers, each dequantize running on
 * the side stream beside the `slots − 1` products before its own (1: none, the streams only alternate); 0 dequantizes
 * on the compute stream. `group` (with slots 0 only; {@link W4A16_GEMM_GROUP} then by default, at most
 * {@link W4A16_GEMM_MAX_GROUP}): the first product of each run of `group` consecutive projections dequantizes all of
 * theirs in one launch and the others read the scratch; 1: each product dequantizes its own (MatMulNBits' order, with
 * Lathe's dequantize kernel).
 */
export function w4a16GemmOps(provider: DeviceKind, gemm?: W4A16Gemm, opts: { slots?: number; group?: number } = {}): W4A16GemmOps {
  if (provider === 'cuda' && !gemm) throw new Error('w4a16GemmOps: CUDA needs a W4A16Gemm (W4A16Gemm.create on the kernels of the device)');
  const slots = opts.slots ?? W4A16_GEMM_SLOTS;
  if (!Number.isInteger(slots) || slots < 0 || slots > 8) throw new Error(`w4a16GemmOps: slots must be an integer from 0 to 8, got ${slots}`);
  const group = opts.group ?? (slots > 0 ? 1 : W4A16_GEMM_GROUP);
  if (!Number.isInteger(group) || group < 1 || group > W4A16_GEMM_MAX_GROUP) throw new Error(`w4a16GemmOps: group must be an integer from 1 to ${W4A16_GEMM_MAX_GROUP}, got ${group}`);
  if (group > 1 && slots > 0) throw new Error(`w4a16GemmOps: group ${group} dequantizes on the compute stream and takes no slots (got slots ${slots})`);
  const family = opFamily({ name: 'w4a16GemmOps', domainPrefix: 'lathe.w4a16_gemm_', provider, cudaDtypes: ['bfloat16', 'float16'] });
  const size = (dims: readonly number[]) => dims.reduce((p, d) => p * d, 1);
  const stream = () => gemm!.kernels.stream;
  const weightShape = (dt: DType, b: { dims: number[] }, K: number) => ({ N: b.dims[0], K, kBlocks: b.dims[1], blockSize: 2 * b.dims[2], dtype: dt });
  // Prefetch into slot s: (after?, B, scales, zero points?) → a one-byte token nobody reads.
  const prefetchOp = (dt: DType, zp: boolean, s: number, after: boolean, K: number): OpDef<object> => {
    const name = `W4A16Prefetch${zp ? 'Zp' : ''}_${dt}_s${s}_k${K}${after ? '_after' : ''}`;
    return family.op(name, () =>
      family.domain.add({
        name,
        inputs: [...(after ? [dt] : []), 'uint8', dt, ...(zp ? ['uint8' as DType] : [])],
        outputs: ['uint8'],
        provider,
        infer: () => [{ dtype: 'uint8', shape: [1] }],
        compute: (ctx) => {
          ctx.output(0, [1]);
          if (!gemm) return;
          const [b, sc, z] = ctx.inputs.slice(after ? 1 : 0);
          gemm.prefetch(s, weightShape(dt, b, K), { b: b.data, scales: sc.data, zeroPoints: z ? z.data : 0n }, stream());
        },
      }),
    );
  };
  // A product node: x [.., K] and its weights (B, scales, zero points if `zp`) first, then `more` inputs; its outputs
  // [.., w] for each of `widths` (or one [.., N]). On CUDA `device` queues the work; on the CPU the host product runs.
  type Product = { a: CustomOpInput; b: CustomOpInput; s: CustomOpInput; z?: CustomOpInput; M: number; K: number; widths: number[]; c: bigint[]; shape: ReturnType<typeof weightShape> };
  const productOp = (name: string, dt: DType, zp: boolean, more: readonly DType[], widths: readonly number[] | undefined, device: (p: Product, inputs: readonly CustomOpInput[]) => void): OpDef<object> =>
    family.op(name, () =>
      family.domain.add({
        name,
        inputs: [dt, 'uint8', dt, ...(zp ? ['uint8' as DType] : []), ...more],
        outputs: (widths ?? [0]).map(() => dt),
        provider,
        infer: ([a, b]) => (widths ?? [b.shape[0]]).map((w) => ({ dtype: dt, shape: [...a.shape.slice(0, -1), w] })),
        compute: (ctx) => {
          const [a, b, s] = ctx.inputs;
          const z = zp ? ctx.inputs[3] : undefined;
          const K = a.dims[a.dims.length - 1];
          const lead = a.dims.slice(0, -1);
          const ws = widths ? [...widths] : [b.dims[0]];
          const c = ws.map((w, i) => ctx.output(i, [...lead, w]));
          const p = { a, b, s, z, M: size(lead), K, widths: ws, c, shape: weightShape(dt, b, K) };
          if (gemm) device(p, ctx.inputs);
          else w4a16HostProduct({ ...p.shape, M: p.M, widths: ws }, { a, b, scales: s, zeroPoints: z }, c);
        },
      }),
    );
  const dequantArgs = (b: CustomOpInput, s: CustomOpInput, z: CustomOpInput | undefined): W4A16DequantArgs => ({ b: b.data, scales: s.data, zeroPoints: z ? z.data : 0n });
  // The product with its own weights (then `tokens` one-byte ordering inputs); `slot` undefined dequantizes inline into slot 0.
  const gemmOp = (dt: DType, zp: boolean, widths: readonly number[] | undefined, slot: number | undefined, tokens: number): OpDef<object> =>
    productOp(`W4A16Gemm${zp ? 'Zp' : ''}_${dt}${widths ? `_w${widths.join('_')}` : ''}_${slot === undefined ? 'inline' : `s${slot}`}_t${tokens}`, dt, zp, Array.from({ length: tokens }, () => 'uint8' as DType), widths, (p) => {
      const st = stream();
      if (slot === undefined) gemm!.dequantize(p.shape, dequantArgs(p.b, p.s, p.z), gemm!.slot(0), st);
      else gemm!.join(slot, st);
      gemm!.gemm(dt, p.M, p.K, p.widths, p.a.data, gemm!.slot(slot ?? 0), p.c, st);
    });
  // A group's first product: its own weights (the first member's), then B, scales, zero points? of the other members,
  // then `after`; first dequantizes every member (K, zero points or not, by `members`) into slot 0, one after the other,
  // in one launch. `after`: the previous group's last output, read by nothing (it orders this launch after that product).
  const groupFirstOp = (dt: DType, members: readonly { zp: boolean; K: number }[], widths: readonly number[] | undefined, after: boolean): OpDef<object> => {
    const name = `W4A16GemmGroup_${dt}_${members.map((m) => `${m.zp ? 'z' : 'k'}${m.K}`).join('_')}${widths ? `_w${widths.join('_')}` : ''}${after ? '_after' : ''}`;
    const more = [...members.slice(1).flatMap((m) => ['uint8', dt, ...(m.zp ? ['uint8'] : [])] as DType[]), ...(after ? [dt] : [])];
    return productOp(name, dt, members[0].zp, more, widths, (p, inputs) => {
      let i = 1;
      let at = 0n;
      const jobs = members.map((m) => {
        const [b, s, z] = [inputs[i], inputs[i + 1], m.zp ? inputs[i + 2] : undefined];
        const job = { shape: weightShape(dt, b, m.K), args: dequantArgs(b, s, z), w: gemm!.slot(0) + at };
        i += m.zp ? 3 : 2;
        at += BigInt(job.shape.N * job.shape.K * 2);
        return job;
      });
      const st = stream();
      gemm!.dequantizeGroup(dt, jobs, st);
      gemm!.gemm(dt, p.M, p.K, p.widths, p.a.data, gemm!.slot(0), p.c, st);
    });
  };
  // A later product of a group: its weights, then the group's first output (read by nothing: it orders this after);
  // multiplies from slot 0 at `offset` bytes, where the group's launch put its weights.
  const groupMemberOp = (dt: DType, zp: boolean, widths: readonly number[] | undefined, offset: number): OpDef<object> =>
    productOp(`W4A16GemmMember${zp ? 'Zp' : ''}_${dt}${widths ? `_w${widths.join('_')}` : ''}_at${offset}`, dt, zp, [dt], widths, (p) => {
      gemm!.gemm(dt, p.M, p.K, p.widths, p.a.data, gemm!.slot(0) + BigInt(offset), p.c, stream());
    });
  const unsupported = (attrs: W4A16Attrs, dtype: DType): string | undefined => {
    if (attrs.bits !== 4) return `${attrs.bits} bits (the pipeline takes 4)`;
    if (!family.dtypes.includes(dtype)) return `dtype ${dtype} on ${provider} (takes ${family.dtypes.join(', ')})`;
    if (![32, 64, 128].includes(attrs.blockSize)) return `block size ${attrs.blockSize} (32, 64 or 128)`;
    if (attrs.K % 8 !== 0) return `K = ${attrs.K} is not a multiple of 8 (eight weights a dequantize step)`;
    return undefined;
  };
  const pipeline = (projections: readonly W4A16GemmProjection[]): W4A16GemmPipeline => {
    projections.forEach((p, j) => {
      const why = unsupported(p.attrs, p.scales.dtype);
      if (why) throw new Error(`w4a16GemmOps.pipeline: projection ${j} ('${p.key}') cannot go through the pipeline: ${why}`);
      const kb = Math.ceil(p.attrs.K / p.attrs.blockSize);
      if (p.b.dtype !== 'uint8' || p.b.shape.join(',') !== [p.attrs.N, kb, p.attrs.blockSize / 2].join(',')) throw new Error(`w4a16GemmOps.pipeline: '${p.key}': B must be uint8[${p.attrs.N}, ${kb}, ${p.attrs.blockSize / 2}], got ${p.b.dtype}[${p.b.shape.join(', ')}]`);
      if (gemm && group === 1) gemm.reserve(slots === 0 ? 0 : j % slots, p.attrs.N * p.attrs.K * 2);
    });
    const bytesOf = (p: W4A16GemmProjection) => p.attrs.N * p.attrs.K * 2;
    if (gemm && group > 1) for (let g = 0; g < projections.length; g += group) gemm.reserve(0, projections.slice(g, g + group).reduce((n, p) => n + bytesOf(p), 0));
    const scales2d = (p: W4A16GemmProjection) => (p.scales.shape.length === 2 ? p.scales : L.reshape(p.scales, [p.attrs.N, Math.ceil(p.attrs.K / p.attrs.blockSize)]));
    const tokens: Tensor[] = [];
    const outputs: Tensor[][] = [];
    const prefetch = (j: number) => {
      const p = projections[j];
      const after = j >= slots ? outputs[j - slots][0] : undefined;
      const ins = [...(after ? [after] : []), p.b, scales2d(p), ...(p.zeroPoints ? [p.zeroPoints] : [])];
      tokens[j] = L.applyOp(prefetchOp(p.scales.dtype, !!p.zeroPoints, j % slots, !!after, p.attrs.K), ins, {})[0];
    };
    let next = 0;
    const byKey = new Map(projections.map((p, j) => [p.key, j] as const));
    const ordered = slots > 0 || group > 1;
    return (key, x, packed = false) => {
      // without slots or groups every product dequantizes on the compute stream itself: any order, any number of times
      const j = ordered ? next : (byKey.get(key) ?? -1);
      const p = projections[j];
      if (!ordered && !p) throw new Error(`w4a16GemmOps.pipeline: projection '${key}' is not one of the ${projections.length} the pipeline was made with`);
      if (!p || p.key !== key) throw new Error(`w4a16GemmOps.pipeline: projection '${key}' was asked for where ${p ? `'${p.key}' (${j} of ${projections.length})` : `none (all ${projections.length} were read)`} comes next: read them in the order the pipeline was made with`);
      if (x.dtype !== p.scales.dtype) throw new Error(`w4a16GemmOps.pipeline: '${key}': x is ${x.dtype}, its scales ${p.scales.dtype} (they must match)`);
      if (x.shape[x.shape.length - 1] !== p.attrs.K) throw new Error(`w4a16GemmOps.pipeline: '${key}': x's last dim must be K = ${p.attrs.K}, got [${x.shape.join(', ')}]`);
      const widths = packed ? undefined : p.widths;
      if (group > 1) {
        const g0 = j - (j % group);
        let outs: Tensor[];
        if (j === g0) {
          const members = projections.slice(g0, g0 + group);
          const odd = members.find((m) => m.scales.dtype !== x.dtype);
          if (odd) throw new Error(`w4a16GemmOps.pipeline: '${odd.key}' has ${odd.scales.dtype} scales and shares a launch with '${key}', whose x is ${x.dtype}`);
          const after = j > 0 ? outputs[j - 1][0] : undefined;
          const ins = [x, ...members.flatMap((m) => [m.b, scales2d(m), ...(m.zeroPoints ? [m.zeroPoints] : [])]), ...(after ? [after] : [])];
          outs = L.applyOp(groupFirstOp(x.dtype, members.map((m) => ({ zp: !!m.zeroPoints, K: m.attrs.K })), widths, !!after), ins, {});
        } else {
          const offset = projections.slice(g0, j).reduce((n, m) => n + bytesOf(m), 0);
          outs = L.applyOp(groupMemberOp(x.dtype, !!p.zeroPoints, widths, offset), [x, p.b, scales2d(p), ...(p.zeroPoints ? [p.zeroPoints] : []), outputs[g0][0]], {});
        }
        outputs[j] = outs;
        next++;
        return outs;
      }
      if (slots > 0 && j === 0) for (let i = 0; i < Math.min(slots, projections.length); i++) prefetch(i);
      const s = scales2d(p);
      const waits = slots === 0 ? [] : [...new Set([tokens[j], tokens[j + slots - 1]].filter((t): t is Tensor => t !== undefined))];
      const op = gemmOp(x.dtype, !!p.zeroPoints, widths, slots === 0 ? undefined : j % slots, waits.length);
      const outs = L.applyOp(op, [x, p.b, s, ...(p.zeroPoints ? [p.zeroPoints] : []), ...waits], {});
      if (slots === 0) return outs;
      outputs[j] = outs;
      next++;
      if (slots > 0 && j + slots < projections.length) prefetch(j + slots);
      return outs;
    };
  };
  return {
    domain: family.domain,
    session: { customOpDomains: [family.domain.handle] },
    slots,
    group,
    pipeline,
    unsupported,
    check: family.check,
    dispose: family.dispose,
  };
}

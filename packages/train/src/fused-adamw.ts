/**
 * Fused AdamW on CUDA: the `apply` graph's update in three kernel launches over every parameter at
 * once (multi-tensor: a table of tensor pointers and a table of fixed-size chunks, one chunk per
 * thread block), instead of 13–14 ORT kernels per parameter. Clipping is folded in without a host
 * sync: one launch sums squares per chunk, one reduces the partial sums to the global norm in a
 * fixed order (so it is deterministic), and the update reads that norm from device memory.
 *
 * The per-element arithmetic is `adamwUpdate`'s, operation for operation, with every product, sum,
 * quotient and square root rounded to float32 on its own (`__fmul_rn` and friends: no contraction
 * into FMAs), so without clipping the update is bitwise the composed one. With clipping the norm is
 * summed in another order than ORT's reductions, which may move the clip coefficient by an ulp.
 */
import type { DType } from '@lathe/onnx';
import { CApi, fromBfloat16Bits, type Device, type DeviceTensor } from '@lathe/runtime';
import { CustomOpDomain, type CustomOpContext, type Kernel, type Kernels } from '@lathe/kernels';
import type { AdamWConfig } from './adamw';
import type { AdamWUpdate } from './train-step';

/** Elements per chunk: one thread block updates one chunk of one tensor. */
export const FUSED_ADAMW_CHUNK = 65536;
/** Threads per block of the chunk kernels. */
const BLOCK = 256;
/** 64-bit words per tensor in the slot table: p, m, v, g, p_out, m_out, v_out addresses, size, decay, g's dtype (0 float32, 1 bfloat16). */
export const SLOT_WORDS = 10;

/** The CUDA source of the three kernels (extern "C", so their names need no mangling). */
export const fusedAdamWSource = String.raw`
typedef unsigned long long u64;
typedef long long i64;

__device__ float block_sum(float x) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = x;
  __syncthreads();
  x = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0.0f;
  if (threadIdx.x < 32) for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
  return x;
}

// a gradient element, float32 or (slot word 9) bfloat16 widened exactly: a bfloat16 is a float32's high half
__device__ __forceinline__ float load_g(const u64* __restrict__ s, i64 i) {
  return s[9] ? __uint_as_float(((unsigned)((const unsigned short*)s[3])[i]) << 16) : ((const float*)s[3])[i];
}

// partial[c] = sum over chunk c of (g * scale)^2
extern "C" __global__ void lathe_adamw_sumsq(const u64* __restrict__ slots, const i64* __restrict__ chunks, i64 chunk, float scale, float* __restrict__ partial) {
  const u64* s = slots + ${SLOT_WORDS} * chunks[2 * blockIdx.x];
  const i64 start = chunks[2 * blockIdx.x + 1];
  const i64 end = min(start + chunk, (i64)s[7]);
  float acc = 0.0f;
  for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) {
    const float x = __fmul_rn(load_g(s, i), scale);
    acc = __fadd_rn(acc, __fmul_rn(x, x));
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// norm[0] = sqrt(sum of partial), summed in a fixed order by one block
extern "C" __global__ void lathe_adamw_norm(const float* __restrict__ partial, int n, float* __restrict__ norm) {
  float acc = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc = __fadd_rn(acc, partial[i]);
  acc = block_sum(acc);
  if (threadIdx.x == 0) norm[0] = __fsqrt_rn(acc);
}

// adamwUpdate (packages/train/src/adamw.ts), one element at a time, over one chunk
__device__ void adamw_chunk(const u64* __restrict__ slots, const i64* __restrict__ chunks, i64 chunk, const float* __restrict__ norm,
    float scale, float lr, float bc1, float bc2, float b1, float b2, float omb1, float omb2, float eps, float wd, float max_norm) {
  float g_scale = omb1, g2_scale = omb2;
  if (max_norm > 0.0f) {
    const float c = fminf(__fdiv_rn(max_norm, __fadd_rn(norm[0], 1e-6f)), 1.0f);
    g_scale = __fmul_rn(c, omb1);
    g2_scale = __fmul_rn(__fmul_rn(c, c), omb2);
  }
  const float sqrt_bc2 = __fsqrt_rn(bc2);
  const float step_size = __fdiv_rn(__fmul_rn(lr, sqrt_bc2), bc1);
  const float eps_hat = __fmul_rn(sqrt_bc2, eps);
  const float keep = __fsub_rn(1.0f, __fmul_rn(lr, wd));
  const u64* s = slots + ${SLOT_WORDS} * chunks[2 * blockIdx.x];
  const float* p_in = (const float*)s[0];
  const float* m_in = (const float*)s[1];
  const float* v_in = (const float*)s[2];
  float* p_out = (float*)s[4];
  float* m_out = (float*)s[5];
  float* v_out = (float*)s[6];
  const bool decay = s[8] != 0 && wd != 0.0f;
  const i64 start = chunks[2 * blockIdx.x + 1];
  const i64 end = min(start + chunk, (i64)s[7]);
  for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) {
    const float g = __fmul_rn(load_g(s, i), scale);
    const float m = __fadd_rn(__fmul_rn(m_in[i], b1), __fmul_rn(g, g_scale));
    const float v = __fadd_rn(__fmul_rn(v_in[i], b2), __fmul_rn(__fmul_rn(g, g), g2_scale));
    const float p = decay ? __fmul_rn(p_in[i], keep) : p_in[i];
    p_out[i] = __fsub_rn(p, __fmul_rn(__fdiv_rn(m, __fadd_rn(__fsqrt_rn(v), eps_hat)), step_size));
    m_out[i] = m;
    v_out[i] = v;
  }
}

extern "C" __global__ void lathe_adamw_update(const u64* __restrict__ slots, const i64* __restrict__ chunks, i64 chunk, const float* __restrict__ norm,
    float scale, float lr, float bc1, float bc2, float b1, float b2, float omb1, float omb2, float eps, float wd, float max_norm) {
  adamw_chunk(slots, chunks, chunk, norm, scale, lr, bc1, bc2, b1, b2, omb1, omb2, eps, wd, max_norm);
}

// the same with the step's scalars in device memory (the inputs of a graph node)
extern "C" __global__ void lathe_adamw_update_dev(const u64* __restrict__ slots, const i64* __restrict__ chunks, i64 chunk, const float* __restrict__ norm,
    float scale, const float* lr, const float* bc1, const float* bc2, float b1, float b2, float omb1, float omb2, float eps, float wd, float max_norm) {
  adamw_chunk(slots, chunks, chunk, norm, scale, *lr, *bc1, *bc2, b1, b2, omb1, omb2, eps, wd, max_norm);
}
`;

/** A parameter as the fused update sees it. */
export interface FusedAdamWParam {
  name: string;
  /** Element count. */
  size: number;
  /** Whether weight decay applies. */
  decay: boolean;
}

/** One parameter's buffers in one direction of the ping-pong: read p, m, v, g; write the `out`s. */
export interface FusedAdamWBuffers {
  p: DeviceTensor;
  m: DeviceTensor;
  v: DeviceTensor;
  g: DeviceTensor;
  pOut: DeviceTensor;
  mOut: DeviceTensor;
  vOut: DeviceTensor;
}

/**
 * The chunk table: for every chunk, (tensor index, first element), tensors in order, each cut into
 * `chunk`-element pieces (the last one shorter). Empty tensors get no chunk.
 */
export function planChunks(sizes: readonly number[], chunk = FUSED_ADAMW_CHUNK): BigInt64Array {
  if (!Number.isInteger(chunk) || chunk < 1) throw new Error(`fused AdamW: the chunk must be a positive integer, got ${chunk}`);
  const out: bigint[] = [];
  sizes.forEach((n, t) => {
    if (!Number.isSafeInteger(n) || n < 0) throw new Error(`fused AdamW: tensor ${t} has an invalid size ${n}`);
    for (let start = 0; start < n; start += chunk) out.push(BigInt(t), BigInt(start));
  });
  return BigInt64Array.from(out);
}

/** The dtypes a gradient may have: float32, or bfloat16 (read and widened exactly by the kernels). */
export type FusedAdamWGradDtype = 'float32' | 'bfloat16';

/** The slot table: {@link SLOT_WORDS} words per tensor (seven addresses, the size, the decay flag, whether g is bfloat16). */
export function slotTable(slots: readonly { pointers: readonly bigint[]; size: number; decay: boolean; grad?: FusedAdamWGradDtype }[]): BigInt64Array {
  const out = new BigInt64Array(slots.length * SLOT_WORDS);
  slots.forEach((s, i) => {
    if (s.pointers.length !== 7) throw new Error(`fused AdamW: slot ${i} has ${s.pointers.length} addresses, expected 7 (p, m, v, g, p_out, m_out, v_out)`);
    out.set([...s.pointers, BigInt(s.size), s.decay ? 1n : 0n, s.grad === 'bfloat16' ? 1n : 0n], i * SLOT_WORDS);
  });
  return out;
}

/** The scalars of one update. */
export interface FusedAdamWStep {
  lr: number;
  /** 1 − β₁ᵗ. */
  bc1: number;
  /** 1 − β₂ᵗ. */
  bc2: number;
  /** Gradients are multiplied by this first (the apply graph's `grad_scale`; default 1). */
  gradScale?: number;
}

/** The constants the kernels take, as float32 values, exactly as the composed graph holds them. */
export function fusedAdamWConstants(cfg: AdamWConfig = {}): { b1: number; b2: number; omb1: number; omb2: number; eps: number; wd: number; maxNorm: number } {
  const [b1, b2] = cfg.betas ?? [0.9, 0.999];
  const f = Math.fround;
  return { b1: f(b1), b2: f(b2), omb1: f(1 - b1), omb2: f(1 - b2), eps: f(cfg.eps ?? 1e-8), wd: f(cfg.weightDecay ?? 0.01), maxNorm: f(cfg.maxGradNorm ?? 0) };
}

/**
 * The kernels' arithmetic on the host, float32 rounding after every operation: the reference the
 * CPU tests hold against ORT's composed `apply` graph (and the device script against the kernel).
 * `norm` is the global gradient norm (computed here when omitted).
 */
export function fusedAdamWReference(
  slots: readonly { p: Float32Array; m: Float32Array; v: Float32Array; g: Float32Array; decay: boolean }[],
  step: FusedAdamWStep,
  cfg: AdamWConfig = {},
  norm?: number,
): { p: Float32Array[]; m: Float32Array[]; v: Float32Array[]; norm: number } {
  const f = Math.fround;
  const k = fusedAdamWConstants(cfg);
  const scale = f(step.gradScale ?? 1);
  if (norm === undefined) {
    let total = 0;
    for (const s of slots) {
      let acc = 0;
      for (const x of s.g) acc = f(acc + f(f(x * scale) * f(x * scale)));
      total = f(total + acc);
    }
    norm = f(Math.sqrt(total));
  }
  let gScale = k.omb1;
  let g2Scale = k.omb2;
  if (k.maxNorm > 0) {
    const c = Math.min(f(k.maxNorm / f(norm + f(1e-6))), 1);
    gScale = f(c * k.omb1);
    g2Scale = f(f(c * c) * k.omb2);
  }
  const [lr, bc1, bc2] = [f(step.lr), f(step.bc1), f(step.bc2)];
  const sqrtBc2 = f(Math.sqrt(bc2));
  const stepSize = f(f(lr * sqrtBc2) / bc1);
  const epsHat = f(sqrtBc2 * k.eps);
  const keep = f(1 - f(lr * k.wd));
  const out = { p: [] as Float32Array[], m: [] as Float32Array[], v: [] as Float32Array[], norm };
  for (const s of slots) {
    const [p, m, v] = [new Float32Array(s.p.length), new Float32Array(s.p.length), new Float32Array(s.p.length)];
    for (let i = 0; i < s.p.length; i++) {
      const g = f(s.g[i] * scale);
      m[i] = f(f(s.m[i] * k.b1) + f(g * gScale));
      v[i] = f(f(s.v[i] * k.b2) + f(f(g * g) * g2Scale));
      const decayed = s.decay && k.wd !== 0 ? f(s.p[i] * keep) : s.p[i];
      p[i] = f(decayed - f(f(m[i] / f(f(Math.sqrt(v[i])) + epsHat)) * stepSize));
    }
    out.p.push(p);
    out.m.push(m);
    out.v.push(v);
  }
  return out;
}

/** A direction of the ping-pong with its slot table on the device. */
export interface FusedAdamWTables {
  slots: DeviceTensor;
}

/** Slot tables a node keeps on the device, reused by the address sets they hold (a step's are the same every run). */
const NODE_TABLES = 4;

/** The compiled kernels and the device buffers of the fused update for one set of parameters. */
export class FusedAdamW {
  private readonly chunks: DeviceTensor;
  private readonly partial: DeviceTensor;
  /** The last update's global gradient norm (before clipping), float32 [1] on the device. */
  readonly gradNorm: DeviceTensor;
  private readonly nChunks: number;
  private readonly constants: ReturnType<typeof fusedAdamWConstants>;
  private readonly tables: DeviceTensor[] = [];
  /** Tables made from addresses (`tableFor`): the key of the address set each holds. */
  private readonly addressTables: { key: string; table: DeviceTensor }[] = [];
  private nextTable = 0;
  private readonly sumsq: Kernel<readonly ['ptr', 'ptr', 'i64', 'f32', 'ptr']>;
  private readonly norm: Kernel<readonly ['ptr', 'i32', 'ptr']>;
  private readonly update: Kernel<readonly ['ptr', 'ptr', 'i64', 'ptr', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32']>;
  private readonly updateDev: Kernel<readonly ['ptr', 'ptr', 'i64', 'ptr', 'f32', 'ptr', 'ptr', 'ptr', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32']>;

  private constructor(
    private readonly kernels: Kernels,
    private readonly device: Device,
    readonly params: readonly FusedAdamWParam[],
    cfg: AdamWConfig,
    readonly chunk: number,
  ) {
    const plan = planChunks(params.map((p) => p.size), chunk);
    this.nChunks = plan.length / 2;
    if (this.nChunks === 0) throw new Error('fused AdamW: no parameter has any element');
    if (this.nChunks > 2 ** 31 - 1) throw new Error(`fused AdamW: ${this.nChunks} chunks exceed the grid; use a larger chunk`);
    this.constants = fusedAdamWConstants(cfg);
    const mod = kernels.compile(fusedAdamWSource, { name: 'lathe_fused_adamw', options: ['--fmad=false'] });
    this.sumsq = mod.kernel('lathe_adamw_sumsq', ['ptr', 'ptr', 'i64', 'f32', 'ptr'] as const);
    this.norm = mod.kernel('lathe_adamw_norm', ['ptr', 'i32', 'ptr'] as const);
    this.update = mod.kernel('lathe_adamw_update', ['ptr', 'ptr', 'i64', 'ptr', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32'] as const);
    this.updateDev = mod.kernel('lathe_adamw_update_dev', ['ptr', 'ptr', 'i64', 'ptr', 'f32', 'ptr', 'ptr', 'ptr', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32', 'f32'] as const);
    this.chunks = device.upload({ data: plan, dims: [plan.length] }, 'int64');
    this.partial = device.empty('float32', [this.nChunks]);
    this.gradNorm = device.zeros('float32', [1]);
  }

  /** Compiles the kernels (or finds them in the cache) and uploads the chunk table. */
  static create(kernels: Kernels, device: Device, params: readonly FusedAdamWParam[], cfg: AdamWConfig = {}, chunk = FUSED_ADAMW_CHUNK): FusedAdamW {
    if (device.kind !== 'cuda') throw new Error(`fused AdamW runs on CUDA, got ${device.name}`);
    return new FusedAdamW(kernels, device, params, cfg, chunk);
  }

  /** Uploads the slot table of one direction (buffers in `params` order); the tensors must outlive it. */
  bind(buffers: readonly FusedAdamWBuffers[]): FusedAdamWTables {
    if (buffers.length !== this.params.length) throw new Error(`fused AdamW: ${buffers.length} buffer sets for ${this.params.length} parameters`);
    const table = slotTable(
      buffers.map((b, i) => {
        const p = this.params[i];
        for (const [k, t] of Object.entries(b) as [string, DeviceTensor][]) {
          const ok = t.dtype === 'float32' || (k === 'g' && t.dtype === 'bfloat16');
          if (!ok || t.size !== p.size) throw new Error(`fused AdamW: '${p.name}' ${k} is ${t.describe()}, expected float32${k === 'g' ? ' or bfloat16' : ''} of ${p.size} elements`);
        }
        return { pointers: [b.p, b.m, b.v, b.g, b.pOut, b.mOut, b.vOut].map((t) => t.devicePointer()), size: p.size, decay: p.decay, grad: b.g.dtype as FusedAdamWGradDtype };
      }),
    );
    const slots = this.device.upload({ data: table, dims: [table.length] }, 'int64');
    this.tables.push(slots);
    return { slots };
  }

  /**
   * A slot table for raw addresses (p, m, v, g, p_out, m_out, v_out per parameter; `grads`: each
   * g's dtype, float32 where omitted), kept on the device and reused while the addresses stay the
   * same; a new set is copied on the kernels' stream, after the work queued before it, into one of a
   * few tables in turn.
   */
  tableFor(pointers: readonly (readonly bigint[])[], grads?: readonly FusedAdamWGradDtype[]): bigint {
    const key = `${pointers.map((p) => p.join(',')).join(';')}|${grads?.join(',') ?? ''}`;
    const hit = this.addressTables.find((t) => t.key === key);
    if (hit) return hit.table.devicePointer();
    const data = slotTable(pointers.map((p, i) => ({ pointers: p, size: this.params[i].size, decay: this.params[i].decay, grad: grads?.[i] })));
    let entry = this.addressTables.length < NODE_TABLES ? undefined : this.addressTables[this.nextTable++ % NODE_TABLES];
    if (!entry) {
      entry = { key, table: this.device.empty('int64', [data.length]) };
      this.addressTables.push(entry);
    }
    entry.key = key;
    this.kernels.driver.copyToDevice(entry.table.devicePointer(), data, this.kernels.stream);
    return entry.table.devicePointer();
  }

  /** Queues the update of one direction on the kernels' stream; `gradNorm` holds the norm after it. */
  step(tables: FusedAdamWTables, s: FusedAdamWStep): void {
    const k = this.constants;
    const scale = s.gradScale ?? 1;
    this.reduceNorm(tables.slots.devicePointer(), scale, this.gradNorm.devicePointer());
    this.update.launch({ grid: this.nChunks, block: BLOCK }, tables.slots, this.chunks, this.chunk, this.gradNorm, scale, s.lr, s.bc1, s.bc2, k.b1, k.b2, k.omb1, k.omb2, k.eps, k.wd, k.maxNorm);
  }

  /** The update with the step's scalars read from device memory (a graph node's inputs), the norm written to `gradNorm`. */
  stepFromDevice(slots: bigint, s: { lr: bigint; bc1: bigint; bc2: bigint }, gradNorm: bigint): void {
    const k = this.constants;
    this.reduceNorm(slots, 1, gradNorm);
    this.updateDev.launch({ grid: this.nChunks, block: BLOCK }, slots, this.chunks, this.chunk, gradNorm, 1, s.lr, s.bc1, s.bc2, k.b1, k.b2, k.omb1, k.omb2, k.eps, k.wd, k.maxNorm);
  }

  private reduceNorm(slots: bigint, scale: number, norm: bigint): void {
    this.sumsq.launch({ grid: this.nChunks, block: BLOCK }, slots, this.chunks, this.chunk, scale, this.partial);
    this.norm.launch({ grid: 1, block: 1024 }, this.partial, this.nChunks, norm);
  }

  /** The last norm on the host (a download, ordered after the update on the same stream). */
  readGradNorm(): number {
    return this.gradNorm.download().data[0] as number;
  }

  /** Frees the tables and buffers (the kernels' module stays with `Kernels`). */
  dispose(): void {
    for (const t of [this.chunks, this.partial, this.gradNorm, ...this.tables.splice(0), ...this.addressTables.splice(0).map((e) => e.table)]) t.dispose();
  }
}

/** The fused update as one node of the step's graph (a custom op), with what keeps it alive. */
export interface FusedAdamWNode {
  /** Builds the node in place of `adamwUpdate` (`TrainStepSpec.update`). */
  update: AdamWUpdate;
  /** The custom-op domain the sessions need (`SessionOptions.customOpDomains`). */
  domain: CustomOpDomain;
  /** Rethrows an error the node's compute raised in the last run. */
  check(): void;
  /** Frees the kernels' buffers and the domain (after the sessions that use it). */
  dispose(): void;
}

let nodeCount = 0;

/**
 * The fused update as a custom op: inputs p…, g…, m…, v… (in `params` order) and lr, bc1, bc2 —
 * and, when the scalars carry `after` (`AdamWScalars.after`), that boolean as a last input, read by
 * nothing: it orders the node after its producer (op `FusedAdamWAfter`);
 * outputs p'…, m'…, v'… and the gradient norm. A gradient may be bfloat16 (ops `FusedAdamW_<dtypes>`,
 * added as the graphs ask for them): the kernels widen it exactly, so a bfloat16 gradient a Cast
 * would widen gives the update the Cast's float32 value would, without the float32 copy. On CUDA its
 * compute launches the fused kernels on the kernels' stream — the sessions' own, so the update stays
 * inside one run (and the train step one session); on the CPU it computes `fusedAdamWReference` on
 * the host (for tests: as exact, and far slower than ORT's composed kernels).
 */
export function fusedAdamWNode(device: Device, params: readonly FusedAdamWParam[], cfg: AdamWConfig = {}, kernels?: Kernels): FusedAdamWNode {
  if (device.kind === 'cuda' && !kernels) throw new Error('fusedAdamWNode: CUDA needs the Kernels whose stream the device\'s sessions run on (Kernels.withDevice)');
  const N = params.length;
  const domain = new CustomOpDomain(`lathe.adamw${nodeCount++}`);
  const fused = device.kind === 'cuda' ? FusedAdamW.create(kernels!, device, params, cfg) : undefined;
  const api = CApi.get();
  const gradDtype = (d: DType, i: number): FusedAdamWGradDtype => {
    if (d !== 'float32' && d !== 'bfloat16') throw new Error(`fused AdamW: the gradient of '${params[i].name}' is ${d}, expected float32 or bfloat16`);
    return d;
  };
  const compute = (ctx: CustomOpContext) => {
    const ins = ctx.inputs;
    const grads = params.map((_, i) => gradDtype(ins[N + i].dtype, i));
    if (fused) {
      const outs = [0, 1, 2].map((k) => params.map((_, i) => ctx.output(k * N + i, ins[i].dims)));
      const table = fused.tableFor(params.map((_, i) => [ins[i].data, ins[2 * N + i].data, ins[3 * N + i].data, ins[N + i].data, outs[0][i], outs[1][i], outs[2][i]]), grads);
      fused.stepFromDevice(table, { lr: ins[4 * N].data, bc1: ins[4 * N + 1].data, bc2: ins[4 * N + 2].data }, ctx.output(3 * N, []));
      return;
    }
    const read = (k: number) => {
      const n = ins[k].dims.reduce((x, y) => x * y, 1);
      if (ins[k].dtype === 'float32') {
        const a = new Float32Array(n);
        api.copyOut(a, ins[k].data);
        return a;
      }
      const half = new Uint16Array(n);
      api.copyOut(half, ins[k].data);
      return fromBfloat16Bits(half);
    };
    const scalar = (k: number) => read(k)[0];
    const r = fusedAdamWReference(
      params.map((p, i) => ({ p: read(i), g: read(N + i), m: read(2 * N + i), v: read(3 * N + i), decay: p.decay })),
      { lr: scalar(4 * N), bc1: scalar(4 * N + 1), bc2: scalar(4 * N + 2) },
      cfg,
    );
    [r.p, r.m, r.v].forEach((values, k) => values.forEach((a, i) => api.copyIn(ctx.output(k * N + i, ins[i].dims), a)));
    api.copyIn(ctx.output(3 * N, []), Float32Array.of(r.norm));
  };
  // one op a gradient-dtype signature and form (with or without `after`), added the first time a graph asks for it
  const ops = new Set<string>();
  const opFor = (grads: readonly FusedAdamWGradDtype[], after: boolean): string => {
    const half = grads.some((d) => d === 'bfloat16');
    const name = `FusedAdamW${after ? 'After' : ''}${half ? `_${grads.map((d) => (d === 'bfloat16' ? 'h' : 'f')).join('')}` : ''}`;
    if (!ops.has(name)) {
      domain.add({
        name,
        inputs: [...Array<DType>(N).fill('float32'), ...grads, ...Array<DType>(2 * N + 3).fill('float32'), ...(after ? ['bool' as const] : [])],
        outputs: Array<DType>(3 * N + 1).fill('float32'),
        provider: device.kind,
        infer: (inputs) => [...[0, 1, 2].flatMap(() => inputs.slice(0, N).map((t) => ({ dtype: t.dtype, shape: [...t.shape] }))), { dtype: 'float32', shape: [] }],
        compute,
      });
      ops.add(name);
    }
    return name;
  };
  const update: AdamWUpdate = (slots, s) => {
    if (slots.length !== N) throw new Error(`fusedAdamWNode: built for ${N} parameters, the step has ${slots.length}`);
    const inputs = [...slots.map((x) => x.param), ...slots.map((x) => x.grad), ...slots.map((x) => x.m), ...slots.map((x) => x.v), s.lr, s.bc1, s.bc2];
    if (s.after && s.after.dtype !== 'bool') throw new Error(`fusedAdamWNode: the update's 'after' must be a bool tensor, got ${s.after.dtype}`);
    const op = opFor(slots.map((x, i) => gradDtype(x.grad.dtype, i)), Boolean(s.after));
    const outs = domain.node(op, s.after ? [...inputs, s.after] : inputs);
    return { params: outs.slice(0, N), m: outs.slice(N, 2 * N), v: outs.slice(2 * N, 3 * N), gradNorm: outs[3 * N] };
  };
  return {
    update,
    domain,
    check: () => domain.check(),
    dispose: () => {
      fused?.dispose();
      domain.dispose();
    },
  };
}

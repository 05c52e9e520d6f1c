/**
 * The SwiGLU activation of a decoder MLP on Lathe's kernel layer: `SwigluKernels` compiles the
 * kernels of swiglu-source.ts and launches them on the kernels' stream; `swigluOps` puts them in a
 * graph as a custom op y = silu(g)·u whose gradient rule is the backward kernel (dy, g, u → dg, du),
 * in place of ONNX Runtime's QuickGelu, Mul and their composed gradients; and, for inference, a packed
 * op reading gate and up from one concatenated gate/up projection (no Split before it). On the CPU the
 * ops compute {@link swigluReference} on the host (float32; for tests of the wiring).
 */
import * as L from '@lathe/onnx';
import { type DType, type OpDef, type Tensor } from '@lathe/onnx';
import { type DeviceKind } from '@lathe/runtime';
import { type ArgValue } from './args';
import { opFamily, readF32, writeHost, type CustomOps } from './custom-op';
import { type Handle } from './driver';
import { cudaIncludeDir } from './flash-attention';
import { type Kernel, type Kernels } from './kernels';
import { SWIGLU_THREADS, SWIGLU_TYPES, swigluKernelName, swigluSource } from './swiglu-source';

/** The shape of one call: n elements of `dtype` in each tensor. */
export interface SwigluShape {
  n: number;
  dtype: DType;
}

/** Why the kernels cannot run `shape`, or undefined. */
export function swigluUnsupported(shape: SwigluShape): string | undefined {
  if (!(shape.dtype in SWIGLU_TYPES)) return `dtype ${shape.dtype} (the kernels take ${Object.keys(SWIGLU_TYPES).join(', ')})`;
  if (!Number.isSafeInteger(shape.n) || shape.n < 0) return `${shape.n} elements`;
  const vec = SWIGLU_TYPES[shape.dtype as keyof typeof SWIGLU_TYPES].vec;
  if (Math.floor(shape.n / vec) + (shape.n % vec) > 2 ** 31 - 1) return `${shape.n} elements (over the kernels' 2³¹ − 1 threads)`;
  return undefined;
}

/** The shape of a packed call: gu [rows, 2·intermediate] (gate then up in each row) → y [rows, intermediate]. */
export interface SwigluPackedShape {
  rows: number;
  intermediate: number;
  dtype: DType;
}

/** Why the packed kernel cannot run `shape`, or undefined (I not a multiple of the 16-byte vector takes the scalar path, not a refusal). */
export function swigluPackedUnsupported(shape: SwigluPackedShape): string | undefined {
  if (!(shape.dtype in SWIGLU_TYPES)) return `dtype ${shape.dtype} (the kernels take ${Object.keys(SWIGLU_TYPES).join(', ')})`;
  const { rows, intermediate: I } = shape;
  if (!Number.isSafeInteger(rows) || rows < 0 || !Number.isSafeInteger(I) || I < 0) return `${rows} rows of ${I}`;
  if (2 * I > 2 ** 31 - 1) return `intermediate size ${I} (2·I over int32)`;
  if (rows * packedPerRow(shape) > 2 ** 31 - 1) return `${rows} rows of ${I} (over the kernel's 2³¹ − 1 threads)`;
  return undefined;
}

/** Threads a row of the packed kernel: one a 16-byte vector when I is a multiple of its width, else one an element. */
function packedPerRow(shape: SwigluPackedShape): number {
  const vec = SWIGLU_TYPES[shape.dtype as keyof typeof SWIGLU_TYPES].vec;
  return shape.intermediate % vec === 0 ? shape.intermediate / vec : shape.intermediate;
}

type Ptr = ArgValue<'ptr'>;
type FwdSig = readonly ['ptr', 'ptr', 'ptr', 'i32', 'i32'];
type BwdSig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32'];
type PackedSig = readonly ['ptr', 'ptr', 'i32', 'i32', 'i32'];

/** Addresses of a forward call: every buffer n elements, 16-byte aligned; y must not alias an input. */
export interface SwigluForwardArgs {
  gate: Ptr;
  up: Ptr;
  y: Ptr;
}

/** Addresses of a backward call: every buffer n elements, 16-byte aligned; dGate and dUp must not alias an input. */
export interface SwigluBackwardArgs {
  dy: Ptr;
  gate: Ptr;
  up: Ptr;
  dGate: Ptr;
  dUp: Ptr;
}

/** Addresses of a packed call: gu [rows, 2·I] and y [rows, I], 16-byte aligned; y must not alias gu. */
export interface SwigluPackedArgs {
  gu: Ptr;
  y: Ptr;
}

/** The compiled SwiGLU kernels of one device. */
export class SwigluKernels {
  private constructor(
    readonly kernels: Kernels,
    private readonly fwd: Map<string, Kernel<FwdSig>>,
    private readonly bwd: Map<string, Kernel<BwdSig>>,
    private readonly packedFwd: Map<string, Kernel<PackedSig>>,
  ) {}

  /** Compiles (or loads from the cache) every variant, with the CUDA headers of `includeDir` (default: `cudaIncludeDir()`). */
  static compile(kernels: Kernels, opts: { includeDir?: string } = {}): SwigluKernels {
    const include = opts.includeDir ?? cudaIncludeDir();
    const mod = kernels.compile(swigluSource, { name: 'lathe_swiglu', options: [`-I${include}`, '--std=c++17'] });
    const fwd = new Map<string, Kernel<FwdSig>>();
    const bwd = new Map<string, Kernel<BwdSig>>();
    const packed = new Map<string, Kernel<PackedSig>>();
    for (const dtype of Object.keys(SWIGLU_TYPES) as (keyof typeof SWIGLU_TYPES)[]) {
      fwd.set(dtype, mod.kernel(swigluKernelName('fwd', dtype), ['ptr', 'ptr', 'ptr', 'i32', 'i32'] as const));
      bwd.set(dtype, mod.kernel(swigluKernelName('bwd', dtype), ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32'] as const));
      packed.set(dtype, mod.kernel(swigluKernelName('packed', dtype), ['ptr', 'ptr', 'i32', 'i32', 'i32'] as const));
    }
    return new SwigluKernels(kernels, fwd, bwd, packed);
  }

  /** Queues y = silu(gate)·up on `stream` (default: the kernels' stream). */
  forward(shape: SwigluShape, a: SwigluForwardArgs, stream?: Handle): void {
    const p = launchPlan(shape);
    if (p) this.fwd.get(shape.dtype)!.launch({ grid: p.grid, block: SWIGLU_THREADS, stream }, a.gate, a.up, a.y, p.nvec, p.tail);
  }

  /** Queues y = silu(gate)·up over one packed gu (gate columns [0, I), up [I, 2·I) of each row) on `stream` (default: the kernels' stream). */
  forwardPacked(shape: SwigluPackedShape, a: SwigluPackedArgs, stream?: Handle): void {
    const why = swigluPackedUnsupported(shape);
    if (why) throw new Error(`swiglu packed kernel does not support ${why}`);
    const threads = shape.rows * packedPerRow(shape);
    const vec = SWIGLU_TYPES[shape.dtype as keyof typeof SWIGLU_TYPES].vec;
    if (threads > 0) this.packedFwd.get(shape.dtype)!.launch({ grid: Math.ceil(threads / SWIGLU_THREADS), block: SWIGLU_THREADS, stream }, a.gu, a.y, shape.rows, shape.intermediate, shape.intermediate % vec === 0 ? 1 : 0);
  }

  /** Queues dGate = dy·up·σ(gate)·(1 + gate·(1 − σ(gate))) and dUp = dy·silu(gate) on `stream` (default: the kernels' stream). */
  backward(shape: SwigluShape, a: SwigluBackwardArgs, stream?: Handle): void {
    const p = launchPlan(shape);
    if (p) this.bwd.get(shape.dtype)!.launch({ grid: p.grid, block: SWIGLU_THREADS, stream }, a.dy, a.gate, a.up, a.dGate, a.dUp, p.nvec, p.tail);
  }
}

/** Vectors, the scalar tail and the grid of a call (undefined: nothing to do). */
function launchPlan(shape: SwigluShape): { nvec: number; tail: number; grid: number } | undefined {
  const why = swigluUnsupported(shape);
  if (why) throw new Error(`swiglu kernels do not support ${why}`);
  const vec = SWIGLU_TYPES[shape.dtype as keyof typeof SWIGLU_TYPES].vec;
  const nvec = Math.floor(shape.n / vec);
  const tail = shape.n % vec;
  if (nvec + tail === 0) return undefined;
  return { nvec, tail, grid: Math.ceil((nvec + tail) / SWIGLU_THREADS) };
}

/**
 * The kernels' rule on the host in float64 (float32 results), for the CPU path of the ops and for
 * tests: with s = σ(g), y = g·s·u; given dy, also dg = dy·u·s·(1 + g·(1 − s)) and du = dy·g·s.
 */
export function swigluReference(gate: ArrayLike<number>, up: ArrayLike<number>): Float32Array;
export function swigluReference(gate: ArrayLike<number>, up: ArrayLike<number>, dy: ArrayLike<number>): { dGate: Float32Array; dUp: Float32Array };
export function swigluReference(gate: ArrayLike<number>, up: ArrayLike<number>, dy?: ArrayLike<number>): Float32Array | { dGate: Float32Array; dUp: Float32Array } {
  const n = gate.length;
  if (!dy) return Float32Array.from({ length: n }, (_, i) => (gate[i] / (1 + Math.exp(-gate[i]))) * up[i]);
  const dGate = new Float32Array(n);
  const dUp = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const g = gate[i];
    const s = 1 / (1 + Math.exp(-g));
    dUp[i] = dy[i] * g * s;
    dGate[i] = dy[i] * up[i] * s * (1 + g * (1 - s));
  }
  return { dGate, dUp };
}

/** {@link swigluReference}'s forward on a packed gu [rows, 2·I] (gate then up in each row): y [rows, I]. */
export function swigluPackedReference(gu: ArrayLike<number>, intermediate: number): Float32Array {
  const I = intermediate;
  const rows = I > 0 ? gu.length / (2 * I) : 0;
  if (!Number.isInteger(rows)) throw new Error(`swigluPackedReference: ${gu.length} values are not rows of 2·${I}`);
  const y = new Float32Array(rows * I);
  for (let r = 0; r < rows; r++) for (let i = 0; i < I; i++) y[r * I + i] = (gu[r * 2 * I + i] / (1 + Math.exp(-gu[r * 2 * I + i]))) * gu[r * 2 * I + I + i];
  return y;
}

/** {@link SwigluOps.apply}: silu(gate)·up, carrying the packed form (a `SwigluKernel` of @lathe/models with `packed`). */
export interface SwigluApply {
  (gate: Tensor, up: Tensor): Tensor;
  /** silu(gate)·up of a packed gu [.., 2·I] (gate the first I columns, up the last) → [.., I]; inference only. */
  packed(gu: Tensor): Tensor;
}

/** The graph side of the kernels: build nodes, and the domain to pass to the session. */
export interface SwigluOps extends CustomOps {
  /** silu(gate)·up for two tensors of one shape and dtype; differentiable in both (the backward kernel). Its `packed` is {@link SwigluOps.packed}. */
  apply: SwigluApply;
  /**
   * silu(gate)·up of one packed gu [.., 2·I] (the output of gate/up as one MatMul over their
   * concatenated weights: gate the first I columns, up the last I) → y [.., I], read in place (op
   * `SwiGLUPacked`). Inference only: its gradient rule throws.
   */
  packed(gu: Tensor): Tensor;
}

/**
 * SwiGLU as custom ops of a new domain, for graphs run on `provider`: on CUDA their computes launch
 * `kernels` (bf16, fp16 or fp32), on the CPU they compute {@link swigluReference} on the host
 * (float32). Each dtype gets a forward op `SwiGLU` (g, u → y) and a backward op `SwiGLUGrad`
 * (dy, g, u → dg, du), the forward's gradient rule, and an inference-only op `SwiGLUPacked`
 * (gu → y, see {@link SwigluOps.packed}). Build every graph before the session that runs it is
 * created: ops are added as nodes need them.
 */
export function swigluOps(provider: DeviceKind, kernels?: SwigluKernels): SwigluOps {
  if (provider === 'cuda' && !kernels) throw new Error('swigluOps: CUDA needs the compiled SwigluKernels (SwigluKernels.compile on the kernels of the device)');
  const family = opFamily({ name: 'swigluOps', domainPrefix: 'lathe.swiglu', provider, cudaDtypes: Object.keys(SWIGLU_TYPES) as DType[] });
  const sizeOf = (dims: readonly number[]) => dims.reduce((a, b) => a * b, 1);
  const sameDims = (op: string, dims: readonly number[][]) => {
    if (dims.some((d) => d.length !== dims[0].length || d.some((v, i) => v !== dims[0][i]))) throw new Error(`${op}: inputs of different shapes ${dims.map((d) => d.join('×')).join(', ')}`);
  };

  const opsFor = (dt: DType): OpDef<object> =>
    family.op(dt, () => {
      const fwd = family.domain.add({
        name: `SwiGLU_${dt}`,
        inputs: [dt, dt],
        outputs: [dt],
        provider,
        infer: ([g]) => [{ dtype: dt, shape: [...g.shape] }],
        compute: (ctx) => {
          const [g, u] = ctx.inputs;
          sameDims('SwiGLU', [g.dims, u.dims]);
          const n = sizeOf(g.dims);
          const y = ctx.output(0, g.dims);
          if (kernels) return kernels.forward({ n, dtype: dt }, { gate: g.data, up: u.data, y });
          if (n > 0) writeHost(y, swigluReference(readF32(g.data, n), readF32(u.data, n)));
        },
      });
      const bwd = family.domain.add({
        name: `SwiGLUGrad_${dt}`,
        inputs: [dt, dt, dt],
        outputs: [dt, dt],
        provider,
        infer: ([, g]) => [
          { dtype: dt, shape: [...g.shape] },
          { dtype: dt, shape: [...g.shape] },
        ],
        compute: (ctx) => {
          const [dy, g, u] = ctx.inputs;
          sameDims('SwiGLUGrad', [dy.dims, g.dims, u.dims]);
          const n = sizeOf(g.dims);
          const dGate = ctx.output(0, g.dims);
          const dUp = ctx.output(1, g.dims);
          if (kernels) return kernels.backward({ n, dtype: dt }, { dy: dy.data, gate: g.data, up: u.data, dGate, dUp });
          if (n === 0) return;
          const r = swigluReference(readF32(g.data, n), readF32(u.data, n), readF32(dy.data, n));
          writeHost(dGate, r.dGate);
          writeHost(dUp, r.dUp);
        },
      });
      return { ...fwd, grad: ({ inputs: [g, u], dy: [dy] }) => (dy ? L.applyOp(bwd, [dy, g!, u!], {}) : [null, null]) };
    });

  const packedFor = (dt: DType): OpDef<object> =>
    family.op(`packed/${dt}`, () => {
      const name = `SwiGLUPacked_${dt}`;
      const op = family.domain.add({
        name,
        inputs: [dt],
        outputs: [dt],
        provider,
        infer: ([gu]) => [{ dtype: dt, shape: [...gu.shape.slice(0, -1), (gu.shape[gu.shape.length - 1] as number) / 2] }],
        compute: (ctx) => {
          const [gu] = ctx.inputs;
          const I = gu.dims[gu.dims.length - 1] / 2;
          const dims = [...gu.dims.slice(0, -1), I];
          const y = ctx.output(0, dims);
          const n = sizeOf(dims);
          if (kernels) return kernels.forwardPacked({ rows: I > 0 ? n / I : 0, intermediate: I, dtype: dt }, { gu: gu.data, y });
          if (n > 0) writeHost(y, swigluPackedReference(readF32(gu.data, 2 * n), I));
        },
      });
      return {
        ...op,
        grad: () => {
          throw new Error(`${name} is inference only (no gradient): train with swigluOps.apply on separate gate and up`);
        },
      };
    });
  const packed = (gu: Tensor): Tensor => {
    family.supports(gu.dtype);
    const W = gu.shape[gu.rank - 1];
    if (gu.rank < 1 || typeof W !== 'number' || W % 2 !== 0) throw new Error(`swigluOps.packed: gu ${gu} needs a static, even last dim (2·intermediate: gate then up)`);
    if (provider === 'cuda') {
      const why = swigluPackedUnsupported({ rows: 0, intermediate: W / 2, dtype: gu.dtype });
      if (why) throw new Error(`swigluOps.packed: unsupported ${why}`);
    }
    return L.applyOp(packedFor(gu.dtype), [gu], {})[0];
  };

  const apply = (gate: Tensor, up: Tensor): Tensor => {
    family.supports(gate.dtype);
    if (up.dtype !== gate.dtype) throw new Error(`swigluOps.apply: gate is ${gate.dtype} and up ${up.dtype}; they must match`);
    if (gate.rank !== up.rank || gate.shape.some((d, i) => typeof d === 'number' && typeof up.shape[i] === 'number' && d !== up.shape[i])) throw new Error(`swigluOps.apply: gate ${gate} and up ${up} must have one shape`);
    return L.applyOp(opsFor(gate.dtype), [gate, up], {})[0];
  };
  return {
    domain: family.domain,
    apply: Object.assign(apply, { packed }),
    packed,
    check: family.check,
    dispose: family.dispose,
  };
}

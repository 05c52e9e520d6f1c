/**
 * Rotary position embedding on Lathe's kernel layer: `RopeKernels` compiles the kernel of
 * rope-source.ts and launches it on the kernels' stream; `ropeOps` puts it in a graph as a custom op
 * whose gradient rule is the same kernel on dy with the sine negated (the inverse rotation), in place
 * of ONNX Runtime's com.microsoft.RotaryEmbedding. On the CPU the ops compute {@link ropeReference}
 * on the host (float32; for tests of the wiring).
 */
import * as L from '@lathe/onnx';
import { type DType, type OpDef, type Tensor } from '@lathe/onnx';
import { type DeviceKind } from '@lathe/runtime';
import { type ArgValue } from './args';
import { opFamily, readF32, readI64, writeHost, type CustomOps } from './custom-op';
import { type Handle } from './driver';
import { cudaIncludeDir } from './flash-attention';
import { type Kernel, type Kernels } from './kernels';
import { ROPE_THREADS, ROPE_TYPES, ropeKernelName, ropeSource } from './rope-source';

/** The shape of one call: x [rows, heads·2·half] (rows = B·S), caches [maxPositions, half], all of `dtype`. */
export interface RopeShape {
  rows: number;
  heads: number;
  /** headDim / 2. */
  half: number;
  maxPositions: number;
  dtype: DType;
}

/** Why the kernel cannot run `shape`, or undefined. */
export function ropeUnsupported(shape: RopeShape): string | undefined {
  if (!(shape.dtype in ROPE_TYPES)) return `dtype ${shape.dtype} (the kernel takes ${Object.keys(ROPE_TYPES).join(', ')})`;
  const vec = ROPE_TYPES[shape.dtype as keyof typeof ROPE_TYPES].vec;
  if (!Number.isInteger(shape.half) || shape.half < 1 || shape.half % vec !== 0) return `headDim ${2 * shape.half} (the ${shape.dtype} kernel needs headDim/2 a multiple of ${vec})`;
  if (shape.rows * shape.heads * (shape.half / vec) > 2 ** 31 - 1) return `${shape.rows} rows of ${shape.heads} heads (over the kernel's 2³¹ − 1 threads)`;
  return undefined;
}

type Ptr = ArgValue<'ptr'>;
type Sig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'i32', 'f32'];

/** Addresses of one call. */
export interface RopeArgs {
  /** [rows, heads·headDim]. */
  x: Ptr;
  /** int64 [rows]. */
  positionIds: Ptr;
  /** [maxPositions, headDim/2] each, in x's dtype. */
  cos: Ptr;
  sin: Ptr;
  /** [rows, heads·headDim], written (must not alias x). */
  y: Ptr;
}

/** The compiled rotary-embedding kernel of one device. */
export class RopeKernels {
  private constructor(
    readonly kernels: Kernels,
    private readonly variants: Map<string, Kernel<Sig>>,
  ) {}

  /** Compiles (or loads from the cache) every variant, with the CUDA headers of `includeDir` (default: `cudaIncludeDir()`). */
  static compile(kernels: Kernels, opts: { includeDir?: string } = {}): RopeKernels {
    const include = opts.includeDir ?? cudaIncludeDir();
    const mod = kernels.compile(ropeSource, { name: 'lathe_rope', options: [`-I${include}`, '--std=c++17'] });
    const sig = ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'i32', 'f32'] as const;
    const variants = new Map<string, Kernel<Sig>>();
    for (const dtype of Object.keys(ROPE_TYPES) as (keyof typeof ROPE_TYPES)[]) variants.set(dtype, mod.kernel(ropeKernelName(dtype), sig));
    return new RopeKernels(kernels, variants);
  }

  /** Queues y = rope(x) (`sign` −1: the inverse rotation) on `stream` (default: the kernels' stream). */
  apply(shape: RopeShape, a: RopeArgs, sign: 1 | -1 = 1, stream?: Handle): void {
    const why = ropeUnsupported(shape);
    if (why) throw new Error(`rope kernel does not support ${why}`);
    const items = shape.rows * shape.heads * (shape.half / ROPE_TYPES[shape.dtype as keyof typeof ROPE_TYPES].vec);
    if (items === 0) return;
    this.variants.get(shape.dtype)!.launch({ grid: Math.ceil(items / ROPE_THREADS), block: ROPE_THREADS, stream }, a.x, a.positionIds, a.cos, a.sin, a.y, items, shape.heads, shape.half, shape.maxPositions, sign);
  }
}

/**
 * The kernel's rule on the host in float64 (float32 results), for the CPU path of the ops and for
 * tests: per row r (position p = positionIds[r], clamped into the caches) and head, for i < half,
 * y[i] = x[i]·cos[p,i] − x[i+half]·sign·sin[p,i] and y[i+half] = x[i+half]·cos[p,i] + x[i]·sign·sin[p,i].
 */
export function ropeReference(
  shape: { rows: number; heads: number; half: number; maxPositions: number },
  x: { x: ArrayLike<number>; positionIds: ArrayLike<number | bigint>; cos: ArrayLike<number>; sin: ArrayLike<number> },
  sign: 1 | -1 = 1,
): Float32Array {
  const { rows, heads, half, maxPositions } = shape;
  const D = 2 * half;
  const y = new Float32Array(rows * heads * D);
  for (let r = 0; r < rows; r++) {
    const p = Math.min(Math.max(Number(x.positionIds[r]), 0), maxPositions - 1);
    for (let h = 0; h < heads; h++) {
      const o = (r * heads + h) * D;
      for (let i = 0; i < half; i++) {
        const c = x.cos[p * half + i];
        const s = sign * x.sin[p * half + i];
        const x1 = x.x[o + i];
        const x2 = x.x[o + i + half];
        y[o + i] = x1 * c - x2 * s;
        y[o + i + half] = x2 * c + x1 * s;
      }
    }
  }
  return y;
}

/** The graph side of the kernel: build nodes, and the domain to pass to the session. */
export interface RopeOps extends CustomOps {
  /**
   * RoPE of x [B, S, heads·headDim] at position ids [B, S] (any integer type; cast to int64) with
   * caches [maxPositions, headDim/2] in x's dtype — com.microsoft.RotaryEmbedding's non-interleaved
   * rule on its 3-D layout; differentiable in x (the gradient is the inverse rotation of dy).
   */
  rotate(x: Tensor, positionIds: Tensor, cosCache: Tensor, sinCache: Tensor): Tensor;
}

/**
 * RoPE as custom ops of a new domain, for graphs run on `provider`: on CUDA their computes launch
 * `kernels` (bf16, fp16 or fp32), on the CPU they compute {@link ropeReference} on the host (float32).
 * Each dtype gets a rotation op and an inverse-rotation op, each the other's gradient rule. Build
 * every graph before the session that runs it is created: ops are added as nodes need them.
 */
export function ropeOps(provider: DeviceKind, kernels?: RopeKernels): RopeOps {
  if (provider === 'cuda' && !kernels) throw new Error('ropeOps: CUDA needs the compiled RopeKernels (RopeKernels.compile on the kernels of the device)');
  const family = opFamily({ name: 'ropeOps', domainPrefix: 'lathe.rope', provider, cudaDtypes: Object.keys(ROPE_TYPES) as DType[] });

  const shapeOf = (x: { dims: readonly number[]; dtype: DType }, cos: { dims: readonly number[] }): RopeShape => {
    const half = cos.dims[1];
    const last = x.dims[x.dims.length - 1];
    if (last % (2 * half) !== 0) throw new Error(`rope: x's last dim ${last} is not a multiple of headDim ${2 * half}`);
    return { rows: x.dims.slice(0, -1).reduce((a, b) => a * b, 1), heads: last / (2 * half), half, maxPositions: cos.dims[0], dtype: x.dtype };
  };

  const add = (dt: DType, sign: 1 | -1): OpDef<object> =>
    family.domain.add({
      name: `${sign === 1 ? 'Rope' : 'RopeInverse'}_${dt}`,
      inputs: [dt, 'int64', dt, dt],
      outputs: [dt],
      provider,
      infer: ([x]) => [{ dtype: dt, shape: [...x.shape] }],
      compute: (ctx) => {
        const [x, pos, cos, sin] = ctx.inputs;
        const shape = shapeOf(x, cos);
        if (pos.dims.reduce((a, b) => a * b, 1) !== shape.rows) throw new Error(`rope: ${pos.dims.join('×')} position ids for ${shape.rows} rows`);
        const y = ctx.output(0, x.dims);
        if (kernels) {
          kernels.apply(shape, { x: x.data, positionIds: pos.data, cos: cos.data, sin: sin.data, y }, sign);
          return;
        }
        const n = shape.rows * shape.heads * 2 * shape.half;
        if (n === 0) return;
        const tables = shape.maxPositions * shape.half;
        const r = ropeReference(
          shape,
          { x: readF32(x.data, n), positionIds: readI64(pos.data, shape.rows), cos: readF32(cos.data, tables), sin: readF32(sin.data, tables) },
          sign,
        );
        writeHost(y, r);
      },
    });

  const opsFor = (dt: DType): OpDef<object> =>
    family.op(dt, () => {
      const fwd = add(dt, 1);
      const inv = add(dt, -1);
      const withGrad = (op: OpDef<object>, other: () => OpDef<object>): OpDef<object> => ({
        ...op,
        nonDiffInputs: [1, 2, 3],
        grad: ({ inputs: [, pos, cos, sin], dy: [dy] }) => [dy ? L.applyOp(other(), [dy, pos!, cos!, sin!], {})[0] : null, null, null, null],
      });
      const f: OpDef<object> = withGrad(fwd, () => b);
      const b: OpDef<object> = withGrad(inv, () => f);
      return f;
    });

  return {
    domain: family.domain,
    rotate: (x, positionIds, cosCache, sinCache) => {
      family.supports(x.dtype);
      if (x.rank !== 3) throw new Error(`ropeOps.rotate: x must be [B, S, heads·headDim], got ${x}`);
      for (const c of [cosCache, sinCache]) {
        if (c.dtype !== x.dtype || c.rank !== 2 || typeof c.shape[1] !== 'number') throw new Error(`ropeOps.rotate: caches must be [maxPositions, headDim/2] of ${x.dtype}, got ${c}`);
      }
      const half = cosCache.shape[1] as number;
      const last = x.shape[2];
      if (typeof last === 'number' && last % (2 * half) !== 0) throw new Error(`ropeOps.rotate: x's last dim ${last} is not heads·${2 * half}`);
      if (provider === 'cuda') {
        const why = ropeUnsupported({ rows: 1, heads: 1, half, maxPositions: 1, dtype: x.dtype });
        if (why) throw new Error(`ropeOps.rotate: the kernel does not support ${why}`);
      }
      return L.applyOp(opsFor(x.dtype), [x, L.cast(positionIds, 'int64'), cosCache, sinCache], {})[0];
    },
    check: family.check,
    dispose: family.dispose,
  };
}

/**
 * Fused log-prob / log-sum-exp / entropy over rows of logits on Lathe's kernel layer:
 * `CrossEntropyKernels` compiles the kernels of cross-entropy-source.ts and launches them on the
 * kernels' stream; `crossEntropyOps` puts them in a graph as custom ops — a forward node whose
 * gradient rule emits the backward node — so a train step reads the logits once forward and once
 * backward in their own dtype, with no fp32 copy. On the CPU the ops compute
 * {@link crossEntropyReference} on the host (float32 logits; for tests of the wiring).
 */
import * as L from '@lathe/onnx';
import { type DType, type OpDef, type Tensor } from '@lathe/onnx';
import { type DeviceKind } from '@lathe/runtime';
import { type ArgValue } from './args';
import { CE_MAX_VOCAB, CE_THREADS, CE_TYPES, crossEntropyKernelName, crossEntropySource } from './cross-entropy-source';
import { opFamily, readF32, readI64, writeHost, type CustomOps } from './custom-op';
import { type Handle } from './driver';
import { cudaIncludeDir } from './flash-attention';
import { type Kernel, type Kernels } from './kernels';

/** The shape of one call: logits [rows, vocab] of `dtype`. */
export interface CrossEntropyShape {
  rows: number;
  vocab: number;
  dtype: DType;
}

/** Why the kernels cannot run `shape` (the caller keeps the composed ops), or undefined. */
export function crossEntropyUnsupported(shape: CrossEntropyShape): string | undefined {
  if (!(shape.dtype in CE_TYPES)) return `dtype ${shape.dtype} (the kernels take ${Object.keys(CE_TYPES).join(', ')})`;
  if (!Number.isInteger(shape.vocab) || shape.vocab < 1 || shape.vocab > CE_MAX_VOCAB) return `a vocabulary of ${shape.vocab} (the kernels take 1 to ${CE_MAX_VOCAB.toLocaleString('en-US')})`;
  if (shape.rows > 2 ** 31 - 1) return `${shape.rows} rows (over the grid's 2³¹ − 1)`;
  return undefined;
}

type Ptr = ArgValue<'ptr'>;
type FwdSig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'f32'];
type BwdSig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'f32'];

/** Addresses of a forward call; 0n for what is not wanted (`targets`/`logp` together, `entropy`). */
export interface CrossEntropyForwardArgs {
  /** [rows, vocab] logits. */
  logits: Ptr;
  /** int64 [rows], or 0n: no log-prob. Targets outside [0, vocab) give log-prob 0 (ignored rows). */
  targets: Ptr;
  /** float32 [rows], written with targets: z_target − lse. */
  logp: Ptr;
  /** float32 [rows], written: log Σ exp(z), z = logits / temperature. */
  lse: Ptr;
  /** float32 [rows] or 0n: the entropy −Σ p·log p. */
  entropy: Ptr;
}

/** Addresses of a backward call: the forward's inputs and outputs, the upstream gradients (0n = zero) and d(logits). */
export interface CrossEntropyBackwardArgs {
  logits: Ptr;
  targets: Ptr;
  lse: Ptr;
  /** Needed with `gEntropy`. */
  entropy: Ptr;
  gLogp: Ptr;
  gLse: Ptr;
  gEntropy: Ptr;
  /** [rows, vocab] in the logits' dtype, written. */
  dLogits: Ptr;
}

interface Variant {
  fwd: Kernel<FwdSig>;
  fwdEnt: Kernel<FwdSig>;
  bwd: Kernel<BwdSig>;
  bwdEnt: Kernel<BwdSig>;
}

/** The compiled cross-entropy kernels of one device. */
export class CrossEntropyKernels {
  private constructor(
    readonly kernels: Kernels,
    private readonly variants: Map<string, Variant>,
  ) {}

  /** Compiles (or loads from the cache) every variant, with the CUDA headers of `includeDir` (default: `cudaIncludeDir()`). */
  static compile(kernels: Kernels, opts: { includeDir?: string } = {}): CrossEntropyKernels {
    const include = opts.includeDir ?? cudaIncludeDir();
    const mod = kernels.compile(crossEntropySource, { name: 'lathe_cross_entropy', options: [`-I${include}`, '--std=c++17'] });
    const fwdSig = ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'f32'] as const;
    const bwdSig = ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'f32'] as const;
    const variants = new Map<string, Variant>();
    for (const dtype of Object.keys(CE_TYPES) as (keyof typeof CE_TYPES)[]) {
      variants.set(dtype, {
        fwd: mod.kernel(crossEntropyKernelName('ce_fwd', dtype), fwdSig),
        fwdEnt: mod.kernel(crossEntropyKernelName('ce_fwd_ent', dtype), fwdSig),
        bwd: mod.kernel(crossEntropyKernelName('ce_bwd', dtype), bwdSig),
        bwdEnt: mod.kernel(crossEntropyKernelName('ce_bwd_ent', dtype), bwdSig),
      });
    }
    return new CrossEntropyKernels(kernels, variants);
  }

  private variant(shape: CrossEntropyShape): Variant {
    const why = crossEntropyUnsupported(shape);
    if (why) throw new Error(`cross-entropy kernels do not support ${why}`);
    return this.variants.get(shape.dtype)!;
  }

  /** Queues the forward (one CTA per row) on `stream` (default: the kernels' stream). */
  forward(shape: CrossEntropyShape, a: CrossEntropyForwardArgs, temperature = 1, stream?: Handle): void {
    const v = this.variant(shape);
    const k = a.entropy === 0n ? v.fwd : v.fwdEnt;
    if (shape.rows === 0) return;
    k.launch({ grid: shape.rows, block: CE_THREADS, stream }, a.logits, a.targets, a.logp, a.lse, a.entropy, shape.rows, shape.vocab, 1 / temperature);
  }

  /** Queues the backward (one CTA per row) on `stream`. */
  backward(shape: CrossEntropyShape, a: CrossEntropyBackwardArgs, temperature = 1, stream?: Handle): void {
    const v = this.variant(shape);
    const k = a.gEntropy === 0n ? v.bwd : v.bwdEnt;
    if (shape.rows === 0) return;
    k.launch({ grid: shape.rows, block: CE_THREADS, stream }, a.logits, a.targets, a.lse, a.entropy, a.gLogp, a.gLse, a.gEntropy, a.dLogits, shape.rows, shape.vocab, 1 / temperature);
  }
}

/**
 * The kernels' rule on the host in float64 (float32 results), for the CPU path of the ops and for
 * tests: per row of `logits` [rows, vocab] and z = logits / temperature, lse = log Σ exp(z), the
 * target's log-prob z_t − lse (0 for a target outside [0, vocab)), the entropy, and with upstream
 * gradients (absent = 0) d(logits) of g_logp·logp + g_lse·lse + g_entropy·entropy.
 */
export function crossEntropyReference(
  shape: { rows: number; vocab: number; temperature?: number },
  x: { logits: Float32Array; targets?: ArrayLike<number | bigint>; gLogp?: Float32Array; gLse?: Float32Array; gEntropy?: Float32Array },
): { lse: Float32Array; entropy: Float32Array; logp?: Float32Array; dLogits?: Float32Array } {
  const { rows, vocab: V } = shape;
  const temp = shape.temperature ?? 1;
  const lse = new Float32Array(rows);
  const entropy = new Float32Array(rows);
  const logp = x.targets ? new Float32Array(rows) : undefined;
  const backward = !!(x.gLogp || x.gLse || x.gEntropy);
  const dLogits = backward ? new Float32Array(rows * V) : undefined;
  for (let r = 0; r < rows; r++) {
    const z = Float64Array.from(x.logits.subarray(r * V, (r + 1) * V), (v) => v / temp);
    let m = -Infinity;
    for (const v of z) m = Math.max(m, v);
    let s = 0;
    let pz = 0;
    for (const v of z) {
      const e = Math.exp(v - m);
      s += e;
      if (e > 0) pz += e * (v - m);
    }
    const Lr = m + Math.log(s);
    const H = Math.log(s) - pz / s;
    lse[r] = Lr;
    entropy[r] = H;
    const t = x.targets ? Number(x.targets[r]) : -1;
    const valid = t >= 0 && t < V;
    if (logp) logp[r] = valid ? z[t] - Lr : 0;
    if (!dLogits) continue;
    const gp = valid && x.gLogp ? x.gLogp[r] : 0;
    const gl = x.gLse ? x.gLse[r] : 0;
    const gh = x.gEntropy ? x.gEntropy[r] : 0;
    for (let j = 0; j < V; j++) {
      const p = Math.exp(z[j] - Lr);
      // dH/dz_j = −p_j·(log p_j + H)
      const dz = gl * p + gp * ((j === t ? 1 : 0) - p) - (p > 0 ? gh * p * (z[j] - Lr + H) : 0);
      dLogits[r * V + j] = dz / temp;
    }
  }
  return { lse, entropy, ...(logp ? { logp } : {}), ...(dLogits ? { dLogits } : {}) };
}

/** Options of one fused call. */
export interface CrossEntropyCallOptions {
  /** Statistics of softmax(logits / temperature). Default 1. */
  temperature?: number;
  /** Also the entropy of each row's distribution. Default false. */
  entropy?: boolean;
}

/** The graph side of the kernels: build nodes, and the domain to pass to the session. */
export interface CrossEntropyOps extends CustomOps {
  /**
   * logits [rows, vocab] (static vocab) and int64 targets [rows] → float32 [rows] log p(target) (0 for
   * a target outside [0, vocab): ignored rows, no gradient through it), the log-sum-exp, and with
   * `entropy` the entropy; each differentiable in the logits.
   */
  tokenLogprobs(logits: Tensor, targets: Tensor, opts?: CrossEntropyCallOptions): { logp: Tensor; lse: Tensor; entropy?: Tensor };
  /** logits [rows, vocab] → float32 [rows] log-sum-exp (and entropy), differentiable in the logits. */
  rowLogSumExp(logits: Tensor, opts?: CrossEntropyCallOptions): { lse: Tensor; entropy?: Tensor };
  /**
   * Why the ops cannot take logits of `dtype` over `vocab` ids, or undefined: the heads ask before
   * using them and keep their composed ops where this gives a reason, which is counted in `fallbacks`.
   */
  unsupported(dtype: DType, vocab: number): string | undefined;
  /** The reasons `unsupported` gave, with how many times each (graph builds that kept the composed ops). */
  readonly fallbacks: ReadonlyMap<string, number>;
}

/**
 * The fused log-prob / log-sum-exp / entropy as custom ops of a new domain, for graphs run on
 * `provider`: on CUDA their computes launch `kernels` (compiled on the kernels whose stream the
 * device's sessions run on; logits bf16, fp16 or fp32), on the CPU they compute
 * {@link crossEntropyReference} on the host (float32 logits). Each (dtype, targets, entropy,
 * temperature) gets a forward op whose gradient rule emits its backward op (d(logits) in the logits'
 * dtype, zeros standing in for outputs that receive no gradient). Build every graph before the
 * session that runs it is created: ops are added to the domain as nodes need them.
 */
export function crossEntropyOps(provider: DeviceKind, kernels?: CrossEntropyKernels): CrossEntropyOps {
  if (provider === 'cuda' && !kernels) throw new Error('crossEntropyOps: CUDA needs the compiled CrossEntropyKernels (CrossEntropyKernels.compile on the kernels of the device)');
  const family = opFamily({ name: 'crossEntropyOps', domainPrefix: 'lathe.ce', provider, cudaDtypes: Object.keys(CE_TYPES) as DType[] });

  const opFor = (dt: DType, withTargets: boolean, withEntropy: boolean, temperature: number): OpDef<object> =>
    family.op(`${dt}/${withTargets}/${withEntropy}/${temperature}`, () => {
      const tag = `${dt}_${withTargets ? 'logp' : 'lse'}${withEntropy ? '_ent' : ''}_${family.size}`;
      const shapeOf = (x: { dims: readonly number[]; dtype: DType }): CrossEntropyShape => ({ rows: x.dims[0], vocab: x.dims[1], dtype: x.dtype });
      const nOut = (withTargets ? 2 : 1) + (withEntropy ? 1 : 0);
      const fwd = family.domain.add({
        name: `FusedCrossEntropy_${tag}`,
        inputs: withTargets ? [dt, 'int64'] : [dt],
        outputs: new Array<DType>(nOut).fill('float32'),
        provider,
        infer: ([x]) => new Array(nOut).fill(0).map(() => ({ dtype: 'float32' as DType, shape: [x.shape[0]] })),
        compute: (ctx) => {
          const [x, targets] = ctx.inputs;
          const shape = shapeOf(x);
          const outs = new Array(nOut).fill(0).map((_, i) => ctx.output(i, [shape.rows]));
          const [logp, lse, ent] = withTargets ? outs : [0n, ...outs];
          if (kernels) {
            kernels.forward(shape, { logits: x.data, targets: withTargets ? targets.data : 0n, logp, lse, entropy: withEntropy ? ent : 0n }, temperature);
            return;
          }
          const r = crossEntropyReference({ ...shape, temperature }, { logits: readF32(x.data, shape.rows * shape.vocab), ...(withTargets ? { targets: readI64(targets.data, shape.rows) } : {}) });
          if (withTargets) writeHost(logp, r.logp!);
          writeHost(lse, r.lse);
          if (withEntropy) writeHost(ent, r.entropy);
        },
      });
      // inputs: logits, [targets], lse, [entropy], [g_logp], g_lse, [g_entropy]
      const bwdInputs: DType[] = [dt, ...(withTargets ? ['int64' as DType] : []), 'float32', ...(withEntropy ? ['float32' as DType] : []), ...(withTargets ? ['float32' as DType] : []), 'float32', ...(withEntropy ? ['float32' as DType] : [])];
      const bwd = family.domain.add({
        name: `FusedCrossEntropyGrad_${tag}`,
        inputs: bwdInputs,
        outputs: [dt],
        provider,
        infer: ([x]) => [{ dtype: dt, shape: [...x.shape] }],
        compute: (ctx) => {
          const ins = [...ctx.inputs];
          const x = ins.shift()!;
          const targets = withTargets ? ins.shift()! : undefined;
          const lse = ins.shift()!;
          const ent = withEntropy ? ins.shift()! : undefined;
          const gLogp = withTargets ? ins.shift()! : undefined;
          const gLse = ins.shift()!;
          const gEnt = withEntropy ? ins.shift()! : undefined;
          const shape = shapeOf(x);
          const dx = ctx.output(0, x.dims);
          if (kernels) {
            kernels.backward(shape, { logits: x.data, targets: targets?.data ?? 0n, lse: lse.data, entropy: ent?.data ?? 0n, gLogp: gLogp?.data ?? 0n, gLse: gLse.data, gEntropy: gEnt?.data ?? 0n, dLogits: dx }, temperature);
            return;
          }
          const n = shape.rows;
          const r = crossEntropyReference(
            { ...shape, temperature },
            {
              logits: readF32(x.data, n * shape.vocab),
              ...(targets ? { targets: readI64(targets.data, n) } : {}),
              gLse: readF32(gLse.data, n),
              ...(gLogp ? { gLogp: readF32(gLogp.data, n) } : {}),
              ...(gEnt ? { gEntropy: readF32(gEnt.data, n) } : {}),
            },
          );
          writeHost(dx, r.dLogits!);
        },
      });
      return {
        ...fwd,
        nonDiffInputs: withTargets ? [1] : [],
        grad: ({ inputs, outputs, dy }) => {
          if (dy.every((d) => !d)) return inputs.map(() => null);
          const zero = (i: number) => dy[i] ?? L.mul(outputs[i]!, 0);
          const iLse = withTargets ? 1 : 0;
          const iEnt = iLse + 1;
          const bwdIn: Tensor[] = [inputs[0]!, ...(withTargets ? [inputs[1]!] : []), outputs[iLse]!, ...(withEntropy ? [outputs[iEnt]!] : []), ...(withTargets ? [zero(0)] : []), zero(iLse), ...(withEntropy ? [zero(iEnt)] : [])];
          const [dx] = L.applyOp(bwd, bwdIn, {});
          return withTargets ? [dx, null] : [dx];
        },
      };
    });

  const check2d = (what: string, logits: Tensor): DType => {
    if (logits.rank !== 2 || typeof logits.shape[1] !== 'number') throw new Error(`crossEntropyOps.${what}: logits must be [rows, vocab] with a static vocab, got ${logits}`);
    family.supports(logits.dtype);
    const why = crossEntropyUnsupported({ rows: 1, vocab: logits.shape[1], dtype: logits.dtype });
    if (why) throw new Error(`crossEntropyOps.${what}: the kernels do not support ${why}`);
    return logits.dtype;
  };
  const temperatureOf = (opts: CrossEntropyCallOptions) => {
    const t = opts.temperature ?? 1;
    if (!(t > 0) || !Number.isFinite(t)) throw new Error(`crossEntropyOps: temperature must be a positive number, got ${t}`);
    return t;
  };

  const fallbacks = new Map<string, number>();
  return {
    domain: family.domain,
    fallbacks,
    unsupported: (dtype, vocab) => {
      const why = !family.dtypes.includes(dtype) ? `dtype ${dtype} (the ${provider} ops take ${family.dtypes.join(', ')})` : crossEntropyUnsupported({ rows: 1, vocab, dtype });
      if (why) fallbacks.set(why, (fallbacks.get(why) ?? 0) + 1);
      return why;
    },
    tokenLogprobs: (logits, targets, opts = {}) => {
      const dt = check2d('tokenLogprobs', logits);
      if (targets.rank !== 1) throw new Error(`crossEntropyOps.tokenLogprobs: targets must be [rows], got ${targets}`);
      const op = opFor(dt, true, !!opts.entropy, temperatureOf(opts));
      const [logp, lse, entropy] = L.applyOp(op, [logits, L.cast(targets, 'int64')], {});
      return { logp, lse, ...(opts.entropy ? { entropy } : {}) };
    },
    rowLogSumExp: (logits, opts = {}) => {
      const dt = check2d('rowLogSumExp', logits);
      const op = opFor(dt, false, !!opts.entropy, temperatureOf(opts));
      const [lse, entropy] = L.applyOp(op, [logits], {});
      return { lse, ...(opts.entropy ? { entropy } : {}) };
    },
    check: family.check,
    dispose: family.dispose,
  };
}

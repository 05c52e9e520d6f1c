/**
 * The greedy token pick of a decode step on Lathe's kernel layer: `GreedyPickKernels` compiles the
 * kernels of greedy-pick-source.ts and launches them on the kernels' stream; `greedyPickOps` puts them
 * in a graph as a custom op `GreedyPick` (logits [R, V] → first-argmax tokens int64 [R] and their
 * log-probabilities float32 [R]) in place of the float32 Cast, `firstArgMax`, LogSoftmax and gather of
 * the composed greedy path. Inference only: the op has no gradient. On the CPU the op computes
 * {@link greedyPickReference} on the host (float32 logits; for tests of the wiring).
 */
import * as L from '@lathe/onnx';
import { type DType, type OpDef, type Tensor } from '@lathe/onnx';
import { type DeviceKind } from '@lathe/runtime';
import { type ArgValue } from './args';
import { opFamily, readF32, writeHost, type CustomOps } from './custom-op';
import { type Handle } from './driver';
import { cudaIncludeDir } from './flash-attention';
import { type Kernel, type Kernels } from './kernels';
import { GREEDY_PICK_THREADS, GREEDY_PICK_TYPES, greedyPickKernelName, greedyPickSource } from './greedy-pick-source';

/** The shape of one call: `rows` rows of `vocab` logits of `dtype`. */
export interface GreedyPickShape {
  rows: number;
  vocab: number;
  dtype: DType;
}

/** Why the kernels cannot run `shape`, or undefined. */
export function greedyPickUnsupported(shape: GreedyPickShape): string | undefined {
  if (!(shape.dtype in GREEDY_PICK_TYPES)) return `dtype ${shape.dtype} (the kernels take ${Object.keys(GREEDY_PICK_TYPES).join(', ')})`;
  if (!Number.isSafeInteger(shape.rows) || shape.rows < 0 || shape.rows > 2 ** 31 - 1) return `${shape.rows} rows`;
  if (!Number.isSafeInteger(shape.vocab) || shape.vocab < 1 || shape.vocab > 2 ** 31 - 1) return `a vocabulary of ${shape.vocab}`;
  return undefined;
}

type Ptr = ArgValue<'ptr'>;
type PickSig = readonly ['ptr', 'ptr', 'ptr', 'i32', 'i32'];

/** Addresses of a call: logits [rows, vocab] (any alignment of the element type), tokens int64 [rows], logprobs float32 [rows]. */
export interface GreedyPickArgs {
  logits: Ptr;
  tokens: Ptr;
  logprobs: Ptr;
}

/** The compiled greedy-pick kernels of one device. */
export class GreedyPickKernels {
  private constructor(
    readonly kernels: Kernels,
    private readonly pick: Map<string, Kernel<PickSig>>,
  ) {}

  /** Compiles (or loads from the cache) every variant, with the CUDA headers of `includeDir` (default: `cudaIncludeDir()`). */
  static compile(kernels: Kernels, opts: { includeDir?: string } = {}): GreedyPickKernels {
    const include = opts.includeDir ?? cudaIncludeDir();
    const mod = kernels.compile(greedyPickSource, { name: 'lathe_greedy_pick', options: [`-I${include}`, '--std=c++17'] });
    const pick = new Map<string, Kernel<PickSig>>();
    for (const dtype of Object.keys(GREEDY_PICK_TYPES) as (keyof typeof GREEDY_PICK_TYPES)[]) {
      pick.set(dtype, mod.kernel(greedyPickKernelName(dtype), ['ptr', 'ptr', 'ptr', 'i32', 'i32'] as const));
    }
    return new GreedyPickKernels(kernels, pick);
  }

  /** Queues each row's first-argmax token and its log-probability on `stream` (default: the kernels' stream). */
  run(shape: GreedyPickShape, a: GreedyPickArgs, stream?: Handle): void {
    const why = greedyPickUnsupported(shape);
    if (why) throw new Error(`greedy-pick kernels do not support ${why}`);
    if (shape.rows === 0) return;
    this.pick.get(shape.dtype)!.launch({ grid: shape.rows, block: GREEDY_PICK_THREADS, stream }, a.logits, a.tokens, a.logprobs, shape.rows, shape.vocab);
  }
}

/**
 * The kernels' rule on the host in float64 (float32 log-probs): per row the first index whose value
 * exceeds every earlier one (NaN never does; a row with nothing above −∞ gives 0), and
 * −log Σ_v e^(x_v − max) — NaN when the row holds a NaN or a +∞ or nothing above −∞, as the kernels
 * (and the composed LogSoftmax) give.
 */
export function greedyPickReference(logits: ArrayLike<number>, rows: number, vocab: number): { tokens: BigInt64Array; logprobs: Float32Array } {
  const tokens = new BigInt64Array(rows);
  const logprobs = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    let max = -Infinity;
    let at = -1;
    let nan = false;
    for (let j = 0; j < vocab; j++) {
      const x = logits[r * vocab + j];
      if (Number.isNaN(x)) nan = true;
      else if (x > max) {
        max = x;
        at = j;
      }
    }
    tokens[r] = BigInt(Math.max(at, 0));
    if (at < 0 || nan || max === Infinity) {
      logprobs[r] = NaN;
      continue;
    }
    let s = 0;
    for (let j = 0; j < vocab; j++) s += Math.exp(logits[r * vocab + j] - max);
    logprobs[r] = -Math.log(s);
  }
  return { tokens, logprobs };
}

/** The graph side of the kernels: build nodes, and the domain to pass to the session. */
export interface GreedyPickOps extends CustomOps {
  /** Logits [R, V] → each row's first-argmax token (int64 [R]) and its log-probability (float32 [R]); not differentiable. */
  apply(logits: Tensor): { tokens: Tensor; logprobs: Tensor };
}

/**
 * The greedy pick as a custom op of a new domain, for graphs run on `provider`: on CUDA its compute
 * launches `kernels` (bf16, fp16 or fp32 logits), on the CPU it computes {@link greedyPickReference}
 * on the host (float32). One op `GreedyPick_<dtype>` a dtype; it has no gradient rule (an inference
 * op: autodiff through it fails). Build every graph before the session that runs it is created.
 */
export function greedyPickOps(provider: DeviceKind, kernels?: GreedyPickKernels): GreedyPickOps {
  if (provider === 'cuda' && !kernels) throw new Error('greedyPickOps: CUDA needs the compiled GreedyPickKernels (GreedyPickKernels.compile on the kernels of the device)');
  const family = opFamily({ name: 'greedyPickOps', domainPrefix: 'lathe.greedy_pick', provider, cudaDtypes: Object.keys(GREEDY_PICK_TYPES) as DType[] });
  const opFor = (dt: DType): OpDef<object> =>
    family.op(dt, () =>
      family.domain.add({
        name: `GreedyPick_${dt}`,
        inputs: [dt],
        outputs: ['int64', 'float32'],
        provider,
        infer: ([x]) => [
          { dtype: 'int64', shape: [x.shape[0]] },
          { dtype: 'float32', shape: [x.shape[0]] },
        ],
        compute: (ctx) => {
          const [x] = ctx.inputs;
          if (x.dims.length !== 2) throw new Error(`GreedyPick: logits must be [rows, vocab], got [${x.dims.join(', ')}]`);
          const [rows, vocab] = x.dims;
          const tokens = ctx.output(0, [rows]);
          const logprobs = ctx.output(1, [rows]);
          if (kernels) return kernels.run({ rows, vocab, dtype: dt }, { logits: x.data, tokens, logprobs });
          if (rows === 0) return;
          const r = greedyPickReference(readF32(x.data, rows * vocab), rows, vocab);
          writeHost(tokens, r.tokens);
          writeHost(logprobs, r.logprobs);
        },
      }),
    );

  return {
    domain: family.domain,
    apply: (logits) => {
      family.supports(logits.dtype);
      if (logits.rank !== 2) throw new Error(`greedyPickOps.apply: logits must be [rows, vocab], got ${logits}`);
      const [tokens, logprobs] = L.applyOp(opFor(logits.dtype), [logits], {});
      return { tokens, logprobs };
    },
    check: family.check,
    dispose: family.dispose,
  };
}

/** Random primitives: uniform noise and categorical sampling. Neither has a gradient. */
import { isFloat, onnxTypeCode as dtypeCodeOf, type DType } from '../dtype';
import { applyOp, type Tensor } from '../graph';
import { attr, defineOp } from '../op';

export const randomUniformLikeOp = defineOp<{ low: number; high: number; seed?: number; dtype: DType }>({
  name: 'RandomUniformLike',
  infer: ([x], { dtype }) => {
    if (!isFloat(dtype)) throw new Error(`random values must be floating point, got ${dtype}`);
    return [{ dtype, shape: x!.shape }];
  },
  onnxAttrs: (a) => ({
    low: attr.float(a.low),
    high: attr.float(a.high),
    dtype: attr.int(dtypeCodeOf(a.dtype)),
    ...(a.seed !== undefined ? { seed: attr.float(a.seed) } : {}),
  }),
  grad: 'none',
});

export const multinomialOp = defineOp<{ samples: number; seed?: number; dtype: 'int32' | 'int64' }>({
  name: 'Multinomial',
  infer: ([logits], { samples, dtype }) => {
    if (logits!.shape.length !== 2) throw new Error('expects unnormalised log-probabilities of shape [batch, classes]');
    return [{ dtype, shape: [logits!.shape[0], samples] }];
  },
  onnxAttrs: (a) => ({
    sample_size: attr.int(a.samples),
    dtype: attr.int(dtypeCodeOf(a.dtype)),
    ...(a.seed !== undefined ? { seed: attr.float(a.seed) } : {}),
  }),
  grad: 'none',
});

/**
 * Uniform noise in [low, high) with x's shape. With a seed, a session draws the same sequence
 * each time it is created (the generator state advances across runs).
 */
export function randomUniformLike(x: Tensor, opts: { low?: number; high?: number; seed?: number; dtype?: DType } = {}): Tensor {
  return applyOp(randomUniformLikeOp, [x], { low: opts.low ?? 0, high: opts.high ?? 1, seed: opts.seed, dtype: opts.dtype ?? x.dtype })[0];
}

/**
 * Samples class indices from unnormalised log-probabilities [batch, classes]. Note: ONNX Runtime
 * has no CUDA kernel for Multinomial; GPU sampling uses Gumbel-max (see `sampleGumbel`).
 */
export function multinomial(logits: Tensor, samples = 1, opts: { seed?: number; dtype?: 'int32' | 'int64' } = {}): Tensor {
  return applyOp(multinomialOp, [logits], { samples, seed: opts.seed, dtype: opts.dtype ?? 'int64' })[0];
}

/**
 * AdamW with global-norm gradient clipping, in the graph: parameters, moments and gradients in,
 * updated parameters and moments out. The arithmetic follows torch.optim.AdamW and
 * torch.nn.utils.clip_grad_norm_ step for step, so updates match PyTorch's to rounding.
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';

/** AdamW hyperparameters (PyTorch's defaults except the learning rate, which is scheduled). */
export interface AdamWConfig {
  /** β₁, β₂. Default [0.9, 0.999]. */
  betas?: [number, number];
  /** Added to √v̂. Default 1e-8. */
  eps?: number;
  /** Decoupled weight decay for parameters in the decay group. Default 0.01. */
  weightDecay?: number;
  /** Clip the global gradient L2 norm to this value; 0 or undefined: no clipping. */
  maxGradNorm?: number;
}

/** One parameter's tensors in an update. */
export interface AdamWSlot {
  param: Tensor;
  grad: Tensor;
  m: Tensor;
  v: Tensor;
  /** Whether weight decay applies (not for norms and biases). */
  decay: boolean;
}

/** Per-step scalars, fed as graph inputs so one compiled graph serves every step. */
export interface AdamWScalars {
  /** Learning rate of this step. */
  lr: Tensor;
  /** 1 − β₁ᵗ. */
  bc1: Tensor;
  /** 1 − β₂ᵗ. */
  bc2: Tensor;
}

/** Result of an update. */
export interface AdamWResult {
  params: Tensor[];
  m: Tensor[];
  v: Tensor[];
  /** Global L2 norm of the gradients before clipping. */
  gradNorm: Tensor;
}

/** Global L2 norm of a list of tensors (float32): one ReduceSumSquare pass per tensor. */
export function globalNorm(ts: Tensor[]): Tensor {
  return L.sqrt(ts.map((t) => L.reduceSumSquare(t)).reduce((a, b) => L.add(a, b)));
}

/**
 * Parameters below this many elements (norm weights, biases) are updated together: one set of
 * passes over their concatenation instead of one set per tensor. Each pass is a kernel launch, and
 * at the Qwen3-0.6B shape 113 such tensors of ≤ 1,024 elements cost 14 launches apiece (1,582 of a
 * train step's ~10,900) for almost no arithmetic.
 */
export const SMALL_PARAMETER_ELEMENTS = 65536;

/**
 * Applies clipping (if configured) and one AdamW step to every slot.
 *
 * The arithmetic is torch's, regrouped so that each parameter costs as few passes over its
 * full-size tensors as ONNX's one-op-per-kernel allows (ONNX Runtime has no fused AdamW outside its
 * training build, and these passes are most of the optimizer's time): the clip coefficient is
 * folded into the scalars of the moment updates, and the bias corrections into the step size and ε:
 *   m' = β₁·m + (c·(1−β₁))·g                 (c: clip coefficient, 1 without clipping)
 *   v' = β₂·v + (c²·(1−β₂))·g²
 *   p' = (1 − lr·λ)·p − (lr·√bc₂/bc₁) · m' / (√v' + ε·√bc₂)
 * which equals torch's p − (lr/bc₁)·m'/(√v'/√bc₂ + ε) after decay, to rounding. 14 passes per
 * decayed parameter, the norm's included (13 without decay), against 17 written term by term.
 * Small parameters (see {@link SMALL_PARAMETER_ELEMENTS}) of one decay group are concatenated,
 * updated as one tensor and split back: every element goes through the same operations, so the
 * result is bit-identical to updating them one by one.
 */
export function adamwUpdate(slots: AdamWSlot[], s: AdamWScalars, cfg: AdamWConfig = {}): AdamWResult {
  const [b1, b2] = cfg.betas ?? [0.9, 0.999];
  const eps = cfg.eps ?? 1e-8;
  const wd = cfg.weightDecay ?? 0.01;
  const gradNorm = globalNorm(slots.map((x) => x.grad));
  // clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied only when below 1.
  const clip = cfg.maxGradNorm ? L.minimum(L.div(cfg.maxGradNorm, L.add(gradNorm, 1e-6)), 1) : undefined;
  const gScale = clip ? L.mul(clip, 1 - b1) : 1 - b1;
  const g2Scale = clip ? L.mul(L.mul(clip, clip), 1 - b2) : 1 - b2;
  const sqrtBc2 = L.sqrt(s.bc2);
  const stepSize = L.div(L.mul(s.lr, sqrtBc2), s.bc1);
  const epsHat = L.mul(sqrtBc2, eps);
  const keep = L.sub(1, L.mul(s.lr, wd));
  const update = (x: AdamWSlot) => {
    const m = L.add(L.mul(x.m, b1), L.mul(x.grad, gScale));
    const v = L.add(L.mul(x.v, b2), L.mul(L.mul(x.grad, x.grad), g2Scale));
    const decayed = x.decay && wd !== 0 ? L.mul(x.param, keep) : x.param;
    return { p: L.sub(decayed, L.mul(L.div(m, L.add(L.sqrt(v), epsHat)), stepSize)), m, v };
  };
  const out: AdamWResult = { params: new Array<Tensor>(slots.length), m: new Array<Tensor>(slots.length), v: new Array<Tensor>(slots.length), gradNorm };
  const set = (i: number, r: { p: Tensor; m: Tensor; v: Tensor }) => {
    out.params[i] = r.p;
    out.m[i] = r.m;
    out.v[i] = r.v;
  };
  const size = (t: Tensor) => t.shape.reduce<number>((a, d) => (typeof d === 'number' ? a * d : Infinity), 1);
  const grouped = new Set<number>();
  for (const decay of [true, false]) {
    const idx = slots.flatMap((x, i) => (x.decay === decay && size(x.param) < SMALL_PARAMETER_ELEMENTS ? [i] : []));
    if (idx.length < 2) continue;
    const flat = (t: Tensor) => (t.rank === 1 ? t : L.reshape(t, [-1]));
    const joined = (pick: (x: AdamWSlot) => Tensor) => L.concat(idx.map((i) => flat(pick(slots[i]))), 0);
    const r = update({ param: joined((x) => x.param), grad: joined((x) => x.grad), m: joined((x) => x.m), v: joined((x) => x.v), decay });
    const sizes = idx.map((i) => size(slots[i].param));
    const parts = (t: Tensor) => L.split(t, sizes, 0).map((part, k) => (slots[idx[k]].param.rank === 1 ? part : L.reshape(part, slots[idx[k]].param.shape)));
    const [ps, ms, vs] = [parts(r.p), parts(r.m), parts(r.v)];
    idx.forEach((i, k) => {
      set(i, { p: ps[k], m: ms[k], v: vs[k] });
      grouped.add(i);
    });
  }
  slots.forEach((x, i) => {
    if (!grouped.has(i)) set(i, update(x));
  });
  return out;
}

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
  const out: AdamWResult = { params: [], m: [], v: [], gradNorm };
  for (const x of slots) {
    const m = L.add(L.mul(x.m, b1), L.mul(x.grad, gScale));
    const v = L.add(L.mul(x.v, b2), L.mul(L.mul(x.grad, x.grad), g2Scale));
    const decayed = x.decay && wd !== 0 ? L.mul(x.param, keep) : x.param;
    out.params.push(L.sub(decayed, L.mul(L.div(m, L.add(L.sqrt(v), epsHat)), stepSize)));
    out.m.push(m);
    out.v.push(v);
  }
  return out;
}

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

/** Global L2 norm of a list of tensors (float32). */
export function globalNorm(ts: Tensor[]): Tensor {
  const squares = ts.map((t) => L.reduceSum(L.mul(t, t)));
  return L.sqrt(squares.reduce((a, b) => L.add(a, b)));
}

/** Applies clipping (if configured) and one AdamW step to every slot. */
export function adamwUpdate(slots: AdamWSlot[], s: AdamWScalars, cfg: AdamWConfig = {}): AdamWResult {
  const [b1, b2] = cfg.betas ?? [0.9, 0.999];
  const eps = cfg.eps ?? 1e-8;
  const wd = cfg.weightDecay ?? 0.01;
  const gradNorm = globalNorm(slots.map((x) => x.grad));
  let clip: Tensor | undefined;
  if (cfg.maxGradNorm) {
    // clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied only when below 1.
    clip = L.minimum(L.div(cfg.maxGradNorm, L.add(gradNorm, 1e-6)), 1);
  }
  const stepSize = L.div(s.lr, s.bc1);
  const sqrtBc2 = L.sqrt(s.bc2);
  const out: AdamWResult = { params: [], m: [], v: [], gradNorm };
  for (const x of slots) {
    const g = clip ? L.mul(x.grad, clip) : x.grad;
    const m = L.add(L.mul(x.m, b1), L.mul(g, 1 - b1));
    const v = L.add(L.mul(x.v, b2), L.mul(L.mul(g, g), 1 - b2));
    const decayed = x.decay && wd !== 0 ? L.mul(x.param, L.sub(1, L.mul(s.lr, wd))) : x.param;
    const denom = L.add(L.div(L.sqrt(v), sqrtBc2), eps);
    out.params.push(L.sub(decayed, L.mul(stepSize, L.div(m, denom))));
    out.m.push(m);
    out.v.push(v);
  }
  return out;
}

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
  /**
   * A boolean scalar the update must read the gradients after, whatever it holds: the join of a
   * data-parallel all-reduce in the same run (`TrainerOptions.inGraphUpdate`), whose sums are still
   * in flight on another stream until it. `adamwUpdate` reads each gradient through
   * `where(after, g, g)` (g bit for bit, a copy); the fused node takes it as one more input.
   */
  after?: Tensor;
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
 * Parameters below this many elements (norm weights, biases, LoRA adapters) are updated in groups:
 * one set of passes over a group's stacked tensors instead of one set per tensor. Each pass is a
 * kernel launch, and at the Qwen3-0.6B shape 113 such tensors of ≤ 1,024 elements cost 14 launches
 * apiece for almost no arithmetic.
 */
export const SMALL_PARAMETER_ELEMENTS = 65536;

/**
 * The most tensors stacked in one group. ONNX Runtime's CUDA Concat and Split pass up to 32
 * equal-size parts' addresses in the kernel's arguments; with more parts, or parts of unequal size,
 * they build per-element index tables on the host and copy them to the device on every run — slow
 * for long axes, and stale under CUDA-graph replay, which re-runs the copy from freed host memory.
 */
export const GROUP_MAX_TENSORS = 32;

/**
 * Groups of slot indices updated together: small parameters of one decay group and one element
 * count, at most {@link GROUP_MAX_TENSORS} to a group, in slot order; singletons are left out.
 */
export function smallParameterGroups(slots: AdamWSlot[]): number[][] {
  const buckets = new Map<string, number[]>();
  slots.forEach((x, i) => {
    const n = staticSize(x.param);
    if (n >= SMALL_PARAMETER_ELEMENTS) return;
    const key = `${x.decay}/${n}`;
    buckets.set(key, [...(buckets.get(key) ?? []), i]);
  });
  const groups: number[][] = [];
  for (const idx of buckets.values()) {
    for (let k = 0; k < idx.length; k += GROUP_MAX_TENSORS) groups.push(idx.slice(k, k + GROUP_MAX_TENSORS));
  }
  return groups.filter((g) => g.length > 1);
}

/** Element count of a tensor with a static shape; Infinity when any dim is symbolic. */
function staticSize(t: Tensor): number {
  return t.shape.reduce<number>((a, d) => (typeof d === 'number' ? a * d : Infinity), 1);
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
 * Small parameters (see {@link smallParameterGroups}) are stacked, updated as one tensor and split
 * back: every element goes through the same operations, so the result is bit-identical to updating
 * them one by one.
 */
export function adamwUpdate(slots: AdamWSlot[], s: AdamWScalars, cfg: AdamWConfig = {}): AdamWResult {
  // every reader of a gradient (the norm, the moments) must follow `after`: each reads the copy
  const after = s.after;
  if (after) slots = slots.map((x) => ({ ...x, grad: L.where(after, x.grad, x.grad) }));
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
  const grouped = new Set<number>();
  for (const idx of smallParameterGroups(slots)) {
    // Each tensor becomes one row of a [k, n] stack: equal parts along axis 0, at most 32 of them.
    const n = staticSize(slots[idx[0]].param);
    const stacked = (pick: (x: AdamWSlot) => Tensor) => L.concat(idx.map((i) => L.reshape(pick(slots[i]), [1, n])), 0);
    const r = update({ param: stacked((x) => x.param), grad: stacked((x) => x.grad), m: stacked((x) => x.m), v: stacked((x) => x.v), decay: slots[idx[0]].decay });
    const rows = (t: Tensor) => L.split(t, idx.map(() => 1), 0).map((row, k) => L.reshape(row, slots[idx[k]].param.shape));
    const [ps, ms, vs] = [rows(r.p), rows(r.m), rows(r.v)];
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

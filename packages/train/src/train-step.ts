/**
 * Train-step compilation: a loss written in the DSL becomes graphs that run forward, backward and
 * the AdamW update. Parameters and optimizer state are graph inputs and the updated values graph
 * outputs, so the runtime can keep them in device buffers and swap them after each run.
 *
 * Three graphs come out:
 * - `step`: loss → grads → clip → AdamW, one run per optimizer step (no accumulation); with
 *   `beforeUpdate`, the gradients pass through its nodes first (a data-parallel all-reduce in the run);
 * - `accumulate`: loss → grads added to gradient buffers (one run per micro-batch), or written as
 *   they are (`sumGradients: false`: one micro-batch a step);
 * - `apply`: the AdamW update from accumulated gradients, scaled by `grad_scale` (unless `gradScale: false`).
 *
 * Names: a parameter `p` has inputs `p`, `adam_m/p`, `adam_v/p`, `grad/p` and outputs `next/p`,
 * `next/adam_m/p`, `next/adam_v/p`, `next/grad/p`; scalars `lr`, `bc1`, `bc2`, `grad_scale`; outputs
 * `loss`, `grad_norm`.
 */
import * as L from '@lathe/onnx';
import type { Graph, Tensor } from '@lathe/onnx';
import { paramSpecs, type DecoderConfig } from '@lathe/models';
import { adamwUpdate, type AdamWConfig, type AdamWResult, type AdamWScalars, type AdamWSlot } from './adamw';

/** Builds the optimizer update in the graph: `adamwUpdate`, or one that emits a fused kernel's node (fused-adamw.ts). */
export type AdamWUpdate = (slots: AdamWSlot[], s: AdamWScalars, cfg?: AdamWConfig) => AdamWResult;

/** A trainable parameter. */
export interface TrainableParam {
  name: string;
  shape: number[];
  /** Weight decay applies (matrices, embeddings) or not (norms, biases). */
  decay: boolean;
}

/** Every weight of a `config` model trained (full fine-tuning): weight decay on matrices and embeddings, none on norms and biases. */
export function fullTrainableParams(config: DecoderConfig): TrainableParam[] {
  return paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
}

/** What the loss builder returns. */
export interface LossOutputs {
  /** Scalar loss (float32). */
  loss: Tensor;
  /** Extra values to return each step (metrics such as token counts or accuracies). */
  metrics?: Record<string, Tensor>;
}

/**
 * Builds the loss in graph `g` from the float32 master parameters (by name). The builder declares
 * its own batch inputs with `g.input` (token ids, masks, advantages, …) and may cast parameters to
 * a compute dtype.
 */
export type LossBuilder = (g: Graph, params: Map<string, Tensor>) => LossOutputs;

/** Everything a train step needs. */
export interface TrainStepSpec {
  params: TrainableParam[];
  loss: LossBuilder;
  optimizer?: AdamWConfig;
  /** The update builder (default `adamwUpdate`, the composed ops). */
  update?: AdamWUpdate;
}

/** The compiled graphs. */
export interface TrainStepGraphs {
  step: Graph;
  accumulate: Graph;
  apply: Graph;
  /** Names of the loss builder's own inputs (the batch). */
  batchInputs: string[];
  /** Names of the extra metric outputs. */
  metrics: string[];
}

/** Input/output names of a parameter's tensors. */
export const stateNames = {
  m: (p: string) => `adam_m/${p}`,
  v: (p: string) => `adam_v/${p}`,
  grad: (p: string) => `grad/${p}`,
  next: (name: string) => `next/${name}`,
};

function forwardBackward(spec: TrainStepSpec, g: Graph) {
  const params = new Map(spec.params.map((p) => [p.name, g.input(p.name, 'float32', p.shape)] as const));
  const before = g.inputs.length;
  const { loss, metrics = {} } = spec.loss(g, params);
  if (loss.dtype !== 'float32' || loss.rank !== 0) throw new Error(`train step: the loss must be a float32 scalar, got ${loss}`);
  const batchInputs = g.inputs.slice(before).map((t) => t.name);
  const grads = L.grad(loss, spec.params.map((p) => params.get(p.name)!));
  return { params, loss, metrics, grads, batchInputs };
}

function scalars(g: Graph) {
  return { lr: g.input('lr', 'float32', []), bc1: g.input('bc1', 'float32', []), bc2: g.input('bc2', 'float32', []) };
}

/**
 * Nodes between the `step` graph's backward and its update (`CompileTrainStepOptions.beforeUpdate`):
 * given the graph and each parameter's gradient (in parameter order), returns the gradients the
 * update reads instead and, optionally, a boolean scalar it must read them after
 * (`AdamWScalars.after`). A data-parallel all-reduce inside the step's run is one (in-run-reduce.ts).
 */
export type BeforeUpdate = (g: Graph, grads: readonly { name: string; grad: Tensor }[]) => { grads: Tensor[]; after?: Tensor };

/** Options of `compileTrainStep`. */
export interface CompileTrainStepOptions {
  /** Nodes the `step` graph's gradients pass through before its update (default: none, the update reads the backward's gradients). */
  beforeUpdate?: BeforeUpdate;
  /**
   * The accumulate graph adds each gradient to its running sum, input `grad/<p>` (true, the
   * default), or writes it as it is, with no such input (false): a step of one micro-batch then
   * neither reads a zeroed buffer nor needs one zeroed again after the update.
   */
  sumGradients?: boolean;
  /** The apply graph multiplies the gradients by input `grad_scale` (true, the default) or reads them as they are (false: see `compileApply`). */
  gradScale?: boolean;
  /**
   * The `step` graph's update reads a gradient that is a bfloat16 value widened by a Cast (a
   * float32 master weight's, cast to bfloat16 for the forward) as that bfloat16 value: for an
   * update that widens it itself, exactly (the fused AdamW node), sparing the float32 copy. Not
   * for gradients `beforeUpdate` replaces.
   */
  halfGradients?: boolean;
}

/** The bfloat16 tensor `t` is an exact widening of (a Cast to float32 of it), if it is one. */
export function widenedBfloat16(t: Tensor): Tensor | undefined {
  const n = t.node;
  const src = n?.inputs[0];
  return n && n.op.name === 'Cast' && !n.op.domain && t.dtype === 'float32' && src?.dtype === 'bfloat16' ? src : undefined;
}

/** Compiles the three train-step graphs for a loss. */
export function compileTrainStep(spec: TrainStepSpec, opts: CompileTrainStepOptions = {}): TrainStepGraphs {
  // step: forward + backward + update in one run
  const step = new L.Graph('train_step');
  const fb = forwardBackward(spec, step);
  const between = opts.beforeUpdate?.(step, spec.params.map((p, i) => ({ name: p.name, grad: fb.grads[i] })));
  if (between && between.grads.length !== spec.params.length) throw new Error(`train step: beforeUpdate returned ${between.grads.length} gradients for ${spec.params.length} parameters`);
  const grads = between?.grads ?? (opts.halfGradients ? fb.grads.map((t) => widenedBfloat16(t) ?? t) : fb.grads);
  const s1 = { ...scalars(step), ...(between?.after ? { after: between.after } : {}) };
  const update = spec.update ?? adamwUpdate;
  const updated = step.scope('optimizer', () => update(
    spec.params.map((p, i) => ({
      param: fb.params.get(p.name)!,
      grad: grads[i],
      m: step.input(stateNames.m(p.name), 'float32', p.shape),
      v: step.input(stateNames.v(p.name), 'float32', p.shape),
      decay: p.decay,
    })),
    s1,
    spec.optimizer,
  ));
  step.output(fb.loss, 'loss');
  step.output(updated.gradNorm, 'grad_norm');
  for (const [k, t] of Object.entries(fb.metrics)) step.output(t, k);
  spec.params.forEach((p, i) => {
    step.output(updated.params[i], stateNames.next(p.name));
    step.output(updated.m[i], stateNames.next(stateNames.m(p.name)));
    step.output(updated.v[i], stateNames.next(stateNames.v(p.name)));
  });

  // accumulate: forward + backward, gradients added to the running sums (or written)
  const sum = opts.sumGradients ?? true;
  const accumulate = new L.Graph('train_accumulate');
  const fa = forwardBackward(spec, accumulate);
  accumulate.output(fa.loss, 'loss');
  for (const [k, t] of Object.entries(fa.metrics)) accumulate.output(t, k);
  spec.params.forEach((p, i) => {
    const grad = sum ? L.add(accumulate.input(stateNames.grad(p.name), 'float32', p.shape), fa.grads[i]) : fa.grads[i];
    accumulate.output(grad, stateNames.next(stateNames.grad(p.name)));
  });

  return { step, accumulate, apply: compileApply(spec.params, spec.optimizer, update, opts.gradScale ?? true), batchInputs: fb.batchInputs, metrics: Object.keys(fb.metrics) };
}

/**
 * Forward and backward alone: the loss, its metrics and each parameter's gradient as outputs
 * `grad/<p>` (no update, no running sum to add to): what ZeRO reduce-scatters after each micro-batch.
 */
export function compileGradients(spec: TrainStepSpec): Graph {
  const g = new L.Graph('train_gradients');
  const fb = forwardBackward(spec, g);
  g.output(fb.loss, 'loss');
  for (const [k, t] of Object.entries(fb.metrics)) g.output(t, k);
  spec.params.forEach((p, i) => g.output(fb.grads[i], stateNames.grad(p.name)));
  return g;
}

/**
 * The `apply` graph alone: AdamW from accumulated gradients, no loss needed. `scaled` (default
 * true): the gradients are multiplied by input `grad_scale` first; false reads them as they are,
 * without a scaled copy of every gradient (a trainer whose scale is always 1).
 */
export function compileApply(params: TrainableParam[], optimizer?: AdamWConfig, update: AdamWUpdate = adamwUpdate, scaled = true): Graph {
  const apply = new L.Graph('train_apply');
  const s2 = scalars(apply);
  const scale = scaled ? apply.input('grad_scale', 'float32', []) : undefined;
  const slots = params.map((p) => ({
    param: apply.input(p.name, 'float32', p.shape),
    grad: ((g) => (scale ? L.mul(g, scale) : g))(apply.input(stateNames.grad(p.name), 'float32', p.shape)),
    m: apply.input(stateNames.m(p.name), 'float32', p.shape),
    v: apply.input(stateNames.v(p.name), 'float32', p.shape),
    decay: p.decay,
  }));
  const applied = apply.scope('optimizer', () => update(slots, s2, optimizer));
  apply.output(applied.gradNorm, 'grad_norm');
  params.forEach((p, i) => {
    apply.output(applied.params[i], stateNames.next(p.name));
    apply.output(applied.m[i], stateNames.next(stateNames.m(p.name)));
    apply.output(applied.v[i], stateNames.next(stateNames.v(p.name)));
  });
  return apply;
}

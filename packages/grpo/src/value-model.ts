/**
 * PPO's value model (the critic): the decoder trunk with a per-token value head — a linear
 * `score.weight` [1, hidden], the head of a `…ForSequenceClassification` with one label, read at
 * every position (`valuePerToken`) — trained on GAE returns with PPO's clipped value loss:
 *
 *   v_clip = v_old + clip(v − v_old, −ε, ε)
 *   loss   = ½ · aggregate(max((v − R)², (v_clip − R)²))
 *
 * (verl's `compute_value_loss`, OpenRLHF's `ValueLoss`; ε 0 drops the clip). Values are in
 * predicting-position coordinates like the policy's log-probs: column t holds V of the state
 * "ids ≤ t", which is the state in which response token t + 1 is chosen, so a response token's
 * log-prob, advantage and value sit in the same column.
 */
import * as L from '@lathe/onnx';
import type { DType, Tensor } from '@lathe/onnx';
import { accumulationDtype, decoderHidden, paramSpecs, SCORE_WEIGHT, valuePerToken, type DecoderConfig, type TrunkOptions } from '@lathe/models';
import type { Binding, Device, HostTensor, Session, SessionOptions } from '@lathe/runtime';
import { castWeights, fullTrainableParams, type LossBuilder, type TrainableParam } from '@lathe/train';
import type { BoundWeights } from './policy-sessions';

/** Names of the value loss's batch inputs (besides `input_ids`, `attention_mask`, `response_mask`, `loss_normaliser`). */
export const VALUE_INPUTS = { oldValues: 'old_values', returns: 'returns', normaliser: 'value_normaliser' } as const;

/** The value head of a critic sharing the policy's trunk: a trained [1, hidden] parameter beside the policy's. */
export const SHARED_VALUE_HEAD = 'value_head.weight';

/** The value model's config: the policy's decoder with a one-output score head and no LM head. */
export function valueModelConfig(policy: DecoderConfig): DecoderConfig {
  return { ...policy, scoreLabels: 1 };
}

/** What the value model trains: every trunk weight and the head (decay on matrices and embeddings). */
export function valueModelParams(policy: DecoderConfig): TrainableParam[] {
  return fullTrainableParams(valueModelConfig(policy));
}

/**
 * The value model's starting weights: `from` where it has them (a reward model's, say), else the
 * policy's trunk; a head that neither has starts at zero, so every first value is 0.
 */
export function valueModelInit(policy: DecoderConfig, policyWeights: ReadonlyMap<string, Float32Array>, from?: ReadonlyMap<string, Float32Array>): Map<string, Float32Array> {
  return new Map(
    paramSpecs(valueModelConfig(policy)).map((s) => {
      const given = from?.get(s.name) ?? (s.name === SCORE_WEIGHT ? undefined : policyWeights.get(s.name));
      const size = s.shape.reduce((a, b) => a * b, 1);
      if (given && given.length !== size) throw new Error(`value model: '${s.name}' has ${given.length} values, expected [${s.shape.join(', ')}]`);
      if (!given && s.name !== SCORE_WEIGHT) throw new Error(`value model: no initial weight '${s.name}'`);
      return [s.name, given ? Float32Array.from(given) : new Float32Array(size)] as const;
    }),
  );
}

/** Options of the value graphs. */
export interface ValueGraphOptions {
  /** Forward/backward dtype. Default float32. */
  compute?: DType;
  /** Attend through GroupQueryAttention (right-padded rows; reads `total_sequence_length`). */
  flashAttention?: boolean;
  /** With `flashAttention`: attend through this kernel (Lathe's flash attention) instead of GroupQueryAttention; the session then needs its custom-op domain. */
  attentionKernel?: TrunkOptions['attentionKernel'];
  /** With `flashAttention`: rotate queries and keys through this kernel (Lathe's RoPE) instead of RotaryEmbedding; the session then needs its custom-op domain. */
  ropeKernel?: TrunkOptions['ropeKernel'];
  /** With `flashAttention`: each MLP's activation through this kernel (Lathe's SwiGLU) instead of QuickGelu and Mul; the session then needs its custom-op domain. */
  swigluKernel?: TrunkOptions['swigluKernel'];
  /** Recompute each layer in the backward pass. */
  recompute?: boolean;
}

/** V at every position, [B, T] float32 (0 at padding), from the value model's parameters; declares `input_ids` and `attention_mask`. */
export function tokenValues(policy: DecoderConfig, g: L.Graph, params: Map<string, Tensor>, opts: ValueGraphOptions = {}): Tensor {
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const attention = g.input('attention_mask', 'int64', ['B', 'T']);
  const w = castWeights(params, opts.compute ?? 'float32');
  const hidden = decoderHidden(valueModelConfig(policy), w, ids, attention, { attention: opts.flashAttention ? 'flash' : 'composed', recompute: opts.recompute, ...(opts.flashAttention && opts.attentionKernel ? { attentionKernel: opts.attentionKernel } : {}), ...(opts.flashAttention && opts.ropeKernel ? { ropeKernel: opts.ropeKernel } : {}), ...(opts.flashAttention && opts.swigluKernel ? { swigluKernel: opts.swigluKernel } : {}) });
  const values = L.cast(valuePerToken(hidden, w(SCORE_WEIGHT)), accumulationDtype(hidden.dtype));
  return L.where(L.cast(attention, 'bool'), L.cast(values, 'float32'), 0);
}

/** The tensors of the value loss. */
export interface ValueLossTensors {
  /** V_θ, [B, T] (differentiable). */
  values: Tensor;
  /** The values the returns were computed with, [B, T], constant. */
  oldValues: Tensor;
  /** GAE returns A + V_old, [B, T]. */
  returns: Tensor;
  /** 1 on response tokens' predicting positions. */
  mask: Tensor;
  /** Σ mask over the whole optimizer batch (token-mean), a scalar. */
  normaliser: Tensor;
}

/** The clipped value loss (module comment) and its summable metrics. */
export function valueLoss(t: ValueLossTensors, clip: number): { loss: Tensor; metrics: { vf_loss: Tensor; vf_clipped_tokens: Tensor; vf_tokens: Tensor } } {
  if (!(clip >= 0)) throw new Error(`valueLoss: clip must be ≥ 0, got ${clip}`);
  const mask = L.cast(t.mask, t.values.dtype);
  const err = L.sub(t.values, t.returns);
  const plain = L.mul(err, err);
  let perToken = plain;
  let clipped = L.mul(L.reduceSum(mask), 0);
  if (clip > 0) {
    const vClip = L.add(t.oldValues, L.clip(L.sub(t.values, t.oldValues), -clip, clip));
    const errClip = L.sub(vClip, t.returns);
    const other = L.mul(errClip, errClip);
    perToken = L.maximum(plain, other);
    clipped = L.reduceSum(L.mul(L.cast(L.greater(other, plain), t.values.dtype), mask));
  }
  const loss = L.mul(L.div(L.reduceSum(L.mul(perToken, mask)), t.normaliser), 0.5);
  return { loss, metrics: { vf_loss: loss, vf_clipped_tokens: clipped, vf_tokens: L.reduceSum(mask) } };
}

/**
 * The value model's train-step loss: {@link tokenValues} of the batch, then {@link valueLoss}.
 * Batch inputs: `input_ids`, `attention_mask`, `old_values`, `returns`, `response_mask` (int64)
 * and `loss_normaliser` (the optimizer batch's response tokens).
 */
export function valueLossBuilder(policy: DecoderConfig, clip: number, opts: ValueGraphOptions = {}): LossBuilder {
  return (g, params) => {
    const values = tokenValues(policy, g, params, opts);
    const shape = values.shape;
    const out = valueLoss(
      {
        values,
        oldValues: g.input(VALUE_INPUTS.oldValues, 'float32', shape),
        returns: g.input(VALUE_INPUTS.returns, 'float32', shape),
        mask: g.input('response_mask', 'int64', shape),
        normaliser: g.input('loss_normaliser', 'float32', []),
      },
      clip,
    );
    return { loss: out.loss, metrics: out.metrics };
  };
}

/** Values of a batch from the value model's current weights (bound by name, nothing copied), through one binding reused run after run, as `ScoringRunner` does. */
export class ValueScorer {
  private readonly binding: Binding;
  private readonly readsWidth: boolean;

  private constructor(private readonly session: Session) {
    this.binding = session.binding().output('values', 'host');
    this.readsWidth = session.inputs.some((i) => i.name === 'total_sequence_length');
  }

  /** Compiles the forward graph of {@link tokenValues} on `device`. */
  static create(device: Device, policy: DecoderConfig, opts: ValueGraphOptions & { session?: SessionOptions } = {}): ValueScorer {
    const g = new L.Graph('value_model');
    const params = new Map(valueModelParams(policy).map((p) => [p.name, g.input(p.name, 'float32', p.shape)] as const));
    g.output(tokenValues(policy, g, params, opts), 'values');
    return new ValueScorer(device.compile(g, opts.session));
  }

  /** V at every position, [B, T] row-major, of right-padded rows (`selectRows`' tensors: `input_ids`, `attention_mask`, `total_sequence_length`). */
  async score(weights: BoundWeights, batch: Record<string, HostTensor>): Promise<Float32Array> {
    for (const [name, t] of weights) this.binding.input(name, t);
    this.binding.input('input_ids', batch.input_ids).input('attention_mask', batch.attention_mask);
    if (this.readsWidth) this.binding.input('total_sequence_length', batch.total_sequence_length);
    await this.binding.run();
    return this.binding.fetch('values').data as Float32Array;
  }

  dispose(): void {
    this.binding.dispose();
    this.session.dispose();
  }
}

/**
 * The fraction of the returns' variance the values explain, over response tokens:
 * 1 − Var(R − V) / Var(R) (verl's `vf_explained_var`); NaN when the returns do not vary.
 */
export function explainedVariance(returns: readonly number[], values: readonly number[]): number {
  const n = returns.length;
  if (n < 2 || values.length !== n) return NaN;
  const mean = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const variance = (xs: readonly number[]) => {
    const m = mean(xs);
    return xs.reduce((a, x) => a + (x - m) ** 2, 0) / xs.length;
  };
  const v = variance(returns);
  return v > 0 ? 1 - variance(returns.map((r, i) => r - values[i])) / v : NaN;
}

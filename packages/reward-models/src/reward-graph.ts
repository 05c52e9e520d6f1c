/**
 * The reward model as a graph: the decoder trunk (no LM head) and a linear `score` head [1, hidden]
 * without bias, as transformers' `…ForSequenceClassification` computes it. Read at each row's last
 * real token it is a reward per sequence; read at every position it is a value per token (PPO's
 * value model). Rows may be left- or right-padded: the last real token is the last position whose
 * attention mask is 1 (transformers finds it from `pad_token_id` instead, which agrees unless a row
 * ends in a real token equal to the pad id).
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';
import {
  accumulationDtype,
  decoder,
  paddedCausalMask,
  positionsFromPadding,
  rightPaddedAttention,
  rightPaddedGqaInputs,
  SCORE_WEIGHT,
  totalLength,
  valuePerToken,
  type Architecture,
  type DecoderConfig,
  type LogprobAttention,
  type Weights,
} from '@lathe/models';

/** How the trunk attends and what it keeps for the backward pass (the same choices as `causalLmLogprobs`). */
export interface TrunkOptions {
  /** 'composed' (default; any padding, differentiable), 'flash' (differentiable, right-padded rows) or 'gqa' (inference only, right-padded). */
  attention?: LogprobAttention;
  /** With 'flash' or 'gqa': the batch width T as an int32 scalar; default `totalLength(g, ids)`. */
  totalSequenceLength?: Tensor;
  /** Recompute each decoder layer in the backward pass instead of keeping its activations. */
  recompute?: boolean;
  /** With 'composed': ONNX Runtime's fused RMSNorm/RoPE/SiLU kernels. Default off. */
  fused?: boolean;
}

/**
 * The decoder's final hidden states [B, T, hidden] for token ids [B, T] and their attention mask
 * (1 = token): the forward pass `causalLmLogprobs` runs before its LM head, here without one.
 */
export function decoderHidden(cfg: DecoderConfig, w: Weights, ids: Tensor, attentionMask: Tensor, opts: TrunkOptions = {}): Tensor {
  const attention = opts.attention ?? 'composed';
  const width = () => opts.totalSequenceLength ?? totalLength(ids.graph, ids);
  if (attention === 'gqa') return decoder(cfg, w, rightPaddedGqaInputs(ids, attentionMask, width())).hidden;
  return decoder(cfg, w, {
    inputIds: ids,
    positionIds: positionsFromPadding(attentionMask),
    attentionMask: paddedCausalMask(attentionMask),
    recompute: opts.recompute,
    ...(opts.fused === undefined ? {} : { fused: opts.fused }),
    ...(attention === 'flash' ? { flashAttention: rightPaddedAttention(attentionMask, width()) } : {}),
  }).hidden;
}

/**
 * One reward per row, [B] float32 (float64 for a float64 model): the score head at the row's last
 * real token. `cfg` must be a reward model's (see {@link rewardModelConfig}).
 */
export function sequenceRewards(cfg: DecoderConfig, w: Weights, ids: Tensor, attentionMask: Tensor, opts: TrunkOptions = {}): Tensor {
  checkRewardConfig(cfg);
  const hidden = decoderHidden(cfg, w, ids, attentionMask, opts);
  const acc = accumulationDtype(hidden.dtype);
  // The head at every token, then the last one picked by a one-hot sum (exact: one term is nonzero),
  // as transformers scores; models' valueAtLastToken takes a Range over a run-time T instead, which
  // ONNX Runtime computes on the CPU.
  const perToken = L.cast(valuePerToken(hidden, w(SCORE_WEIGHT)), acc);
  return L.reduceSum(L.mul(perToken, L.cast(lastTokenMask(attentionMask), acc)), [1]);
}

/**
 * bool [B, T]: true at each row's last real token (the last position whose mask is 1), for left-
 * or right-padded rows: the token where the running count of tokens reaches the row's total.
 */
export function lastTokenMask(attentionMask: Tensor): Tensor {
  const m = L.cast(attentionMask, 'int64');
  const count = L.cumsum(m, 1);
  return L.and(L.cast(m, 'bool'), L.equal(count, L.reduceSum(m, [1], true)));
}

/**
 * A value at every position, [B, T] float32 (0 at padding): the score head at each token, as a PPO
 * value model reads it (position t values the state after token t).
 */
export function tokenValues(cfg: DecoderConfig, w: Weights, ids: Tensor, attentionMask: Tensor, opts: TrunkOptions = {}): Tensor {
  checkRewardConfig(cfg);
  const hidden = decoderHidden(cfg, w, ids, attentionMask, opts);
  const values = L.cast(valuePerToken(hidden, w(SCORE_WEIGHT)), accumulationDtype(hidden.dtype));
  return L.where(L.cast(attentionMask, 'bool'), values, 0);
}

/**
 * The reward model config of a causal LM's: the same decoder as `…ForSequenceClassification` with
 * one score output, and `pad_token_id` set (transformers needs it to find each row's last token in a
 * batch). `padTokenId` defaults to the config's own; with neither it is an error.
 */
export function rewardModelConfig(config: DecoderConfig, padTokenId?: number): DecoderConfig {
  const pad = padTokenId ?? config.padTokenId;
  if (pad === undefined) {
    throw new Error(`reward model from ${config.architecture}: its config has no pad_token_id; pass padTokenId (the tokenizer's pad token, which transformers' sequence classifiers need to find each row's last token)`);
  }
  if (!Number.isInteger(pad) || pad < 0 || pad >= config.vocabSize) throw new Error(`reward model: padTokenId ${pad} is not a token id of a vocabulary of ${config.vocabSize}`);
  const architecture = config.architecture.replace(/For(CausalLM|SequenceClassification)$/, 'ForSequenceClassification') as Architecture;
  return { ...config, architecture, scoreLabels: 1, padTokenId: pad };
}

/** Throws unless `cfg` is a sequence classifier with one score output. */
export function checkRewardConfig(cfg: DecoderConfig): void {
  if (cfg.scoreLabels !== 1) {
    const what = cfg.scoreLabels === undefined ? 'a causal LM (no score head)' : `a classifier with ${cfg.scoreLabels} score outputs`;
    throw new Error(`reward model: ${cfg.architecture} is ${what}; a reward model has one (num_labels 1): see rewardModelConfig`);
  }
}

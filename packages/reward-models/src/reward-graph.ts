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
  decoderHidden,
  SCORE_WEIGHT,
  valueAtLastToken,
  valuePerToken,
  type Architecture,
  type DecoderConfig,
  type TrunkOptions,
  type Weights,
} from '@lathe/models';

/**
 * One reward per row, [B] float32 (float64 for a float64 model): the score head at the row's last
 * real token (`valueAtLastToken`). `cfg` must be a reward model's (see {@link rewardModelConfig}).
 */
export function sequenceRewards(cfg: DecoderConfig, w: Weights, ids: Tensor, attentionMask: Tensor, opts: TrunkOptions = {}): Tensor {
  checkRewardConfig(cfg);
  return valueAtLastToken(decoderHidden(cfg, w, ids, attentionMask, opts), attentionMask, w(SCORE_WEIGHT));
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

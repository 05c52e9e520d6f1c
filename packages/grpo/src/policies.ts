/**
 * Policies for the RL loss: graph builders that turn the trainable parameters and the batch's token
 * ids into per-token log-probs (and entropies) in predicting-position coordinates — position t holds
 * log π(ids[t+1] | ids ≤ t). `decoderPolicy` is the LLM; any other differentiable builder (a tabular
 * policy in tests, a value-augmented model later) plugs into `rlLoss` the same way.
 */
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import { accumulationDtype, chunkedTargetLogprobs, decoder, linear, lmHeadName, paddedCausalMask, positionsFromPadding, rightPaddedAttention, totalLength, type DecoderConfig, type Weights } from '@lathe/models';
import { castWeights, shiftLeft } from '@lathe/train';

/** What a policy gives the loss. */
export interface PolicyOutputs {
  /** log π_θ(ids[t+1] | ids ≤ t), [B, T] float32 (the last column is meaningless: the mask excludes it). */
  logp: Tensor;
  /** Entropy of π_θ(· | ids ≤ t), [B, T] float32, when the policy was asked for it. */
  entropy?: Tensor;
}

/**
 * Builds the policy's outputs in graph `g` from the float32 master parameters. It declares its own
 * inputs (token ids, attention mask, …) with `g.input`.
 */
export type PolicyBuilder = (g: Graph, params: Map<string, Tensor>) => PolicyOutputs;

/** Options of {@link decoderPolicy}. */
export interface DecoderPolicyOptions {
  /** Dtype of the forward/backward compute (master weights stay float32). Default float32. */
  compute?: DType;
  /** Vocabulary rows per chunk of the log-partition (and entropy). Default 16,384. */
  chunk?: number;
  /** Sampling temperature: log-probs are those of softmax(logits / temperature), as generation used. Default 1. */
  temperature?: number;
  /** Also compute per-token entropies (one more pass over the LM head). Default false. */
  entropy?: boolean;
  /** How the decoder's weights come from the trainable parameters (LoRA passes its own); default: each cast to `compute`. */
  weights?: (g: Graph, params: Map<string, Tensor>) => Weights;
  /** Recompute each decoder layer in the backward pass instead of keeping its activations (less memory, ~⅓ more compute). */
  recompute?: boolean;
  /**
   * Attend through GroupQueryAttention (flash attention on CUDA; composed backward pass) instead of
   * MatMul/Softmax. Rows must be right-padded, as the RL batch lays them out; the graph then also
   * reads `total_sequence_length` (int32 scalar T).
   */
  flashAttention?: boolean;
}

/**
 * A decoder LM as the policy. Inputs: `input_ids` int64 [B, T] (prompt + response, padded),
 * `attention_mask` int64 [B, T] (1 = token), and with `flashAttention` `total_sequence_length`.
 */
export function decoderPolicy(cfg: DecoderConfig, opts: DecoderPolicyOptions = {}): PolicyBuilder {
  const chunk = opts.chunk ?? 16384;
  const temperature = opts.temperature ?? 1;
  if (!(temperature > 0)) throw new Error(`decoderPolicy: temperature must be > 0, got ${temperature}`);
  return (g, params) => {
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    const attention = g.input('attention_mask', 'int64', ['B', 'T']);
    const w = opts.weights ? opts.weights(g, params) : castWeights(params, opts.compute ?? 'float32');
    const { hidden } = decoder(cfg, w, {
      inputIds: ids,
      positionIds: positionsFromPadding(attention),
      attentionMask: paddedCausalMask(attention),
      recompute: opts.recompute,
      ...(opts.flashAttention ? { flashAttention: rightPaddedAttention(attention, totalLength(g, ids)) } : {}),
    });
    const logp = chunkedTargetLogprobs(cfg, w, hidden, shiftLeft(ids), { chunk, temperature, recompute: opts.recompute });
    return opts.entropy ? { logp, entropy: chunkedEntropy(cfg, w, hidden, { chunk, temperature, recompute: opts.recompute }) } : { logp };
  };
}

/**
 * Entropy [B, T] of softmax(hidden · Wᵀ / temperature), vocabulary chunk by chunk:
 * H = log Z − Σ_v p_v·l_v. Differentiable (built from primitives).
 */
export function chunkedEntropy(cfg: DecoderConfig, w: Weights, hidden: Tensor, opts: { chunk?: number; temperature?: number; recompute?: boolean } = {}): Tensor {
  const chunk = opts.chunk ?? 16384;
  const temperature = opts.temperature ?? 1;
  const acc = accumulationDtype(hidden.dtype);
  const W = w(lmHeadName(cfg));
  const sizes: number[] = [];
  for (let s = 0; s < cfg.vocabSize; s += chunk) sizes.push(Math.min(chunk, cfg.vocabSize - s));
  const parts = sizes.length === 1 ? [W] : L.split(W, sizes, 0);
  // Without recompute each chunk's logits are built once and feed both sums.
  const built = new Map<Tensor, Tensor>();
  const logits = (Wk: Tensor) => {
    const cached = opts.recompute ? undefined : built.get(Wk);
    if (cached) return cached;
    const l0 = L.cast(linear(hidden, Wk), acc);
    const l = temperature === 1 ? l0 : L.div(l0, temperature);
    built.set(Wk, l);
    return l;
  };
  // With `recompute`, each chunk's logits are rebuilt in the backward pass, one chunk at a time.
  const region = (inputs: Tensor[], fn: () => Tensor) => (opts.recompute ? L.checkpoint(inputs, fn) : fn());
  const logZ = L.logSumExp(L.concat(parts.map((Wk) => region([hidden], () => L.logSumExp(logits(Wk), -1, true))), -1), -1, true); // [B, T, 1]
  const expected = parts
    .map((Wk) => region([hidden, logZ], () => { const l = logits(Wk); return L.reduceSum(L.mul(L.exp(L.sub(l, logZ)), l), [-1]); }))
    .reduce((a, b) => L.add(a, b));
  return L.sub(L.squeeze(logZ, [hidden.rank - 1]), expected);
}

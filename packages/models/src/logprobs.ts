/**
 * Teacher-forced next-token log-probs of a causal LM — the one graph builder that training losses,
 * RL policies and scoring graphs all wrap. Position t holds log p(ids[t+1] | ids ≤ t) ("predicting
 * position" coordinates); the last column wraps around and is the caller's to mask. The decoder
 * trunk under it, {@link decoderHidden}, is also what score heads (reward models, critics) read.
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';
import type { DecoderConfig } from './config';
import { decoder, paddedCausalMask, positionsFromPadding, rightPaddedAttention, rightPaddedGqaInputs, totalLength, type FlashAttentionInputs, type Weights } from './decoder';
import { chunkedLogprobsAndEntropy, chunkedTargetLogprobs, type LogprobKernel } from './heads';

/**
 * Shifts [B, T] left by one along T (the last column wraps around: mask it out). A static T takes
 * one Gather: a Concat of unequal parts would copy an index table from the host on every run.
 */
export function shiftLeft(x: Tensor): Tensor {
  const T = x.shape[1];
  if (typeof T === 'number') return L.gather(x, x.graph.constant(Array.from({ length: T }, (_, t) => (t + 1) % T), 'int64', [T]), 1);
  return L.concat([L.slice(x, [1], [1]), L.slice(x, [1], [0], [1])], 1);
}

/**
 * How the decoder trunk attends ({@link decoderHidden}, and so {@link causalLmLogprobs}):
 * - 'composed': MatMul/Softmax from primitives — any padding, differentiable.
 * - 'flash': GroupQueryAttention with a composed backward pass (flash attention on CUDA, which runs
 *   it in float16/bfloat16 only) — differentiable, keeps no [B, heads, T, T] activations; rows must
 *   be right-padded.
 * - 'gqa': GroupQueryAttention with RoPE inside the kernel — inference only (scoring), right-padded.
 */
export type LogprobAttention = 'composed' | 'flash' | 'gqa';

/** How {@link decoderHidden} runs the decoder trunk: the attention and what the backward pass keeps. */
export interface TrunkOptions {
  /** Default 'composed'. */
  attention?: LogprobAttention;
  /**
   * With 'flash' or 'gqa': the batch width T as an int32 scalar (see `totalLength`); default
   * `totalLength(g, ids)` — a constant for a static T, else the `total_sequence_length` input.
   */
  totalSequenceLength?: Tensor;
  /**
   * With 'flash': attend through this kernel (Lathe's flash-attention forward and backward,
   * `flashAttentionOps(...).attend` of @lathe/kernels) instead of GroupQueryAttention with its
   * composed backward; the session then needs the kernels' custom-op domain.
   */
  attentionKernel?: FlashAttentionInputs['kernel'];
  /** With 'flash': rotate queries and keys through this kernel instead of ONNX Runtime's RotaryEmbedding (`ropeOps(...).rotate` of @lathe/kernels); the session then needs its custom-op domain. */
  ropeKernel?: FlashAttentionInputs['ropeKernel'];
  /** With 'flash': each MLP's silu(gate)·up through this kernel instead of QuickGelu and Mul (`swigluOps(...).apply` of @lathe/kernels); the session then needs its custom-op domain. */
  swigluKernel?: FlashAttentionInputs['swigluKernel'];
  /** Recompute each decoder layer (in causalLmLogprobs, each head chunk too) in the backward pass instead of keeping its activations. */
  recompute?: boolean;
  /** With 'composed': ONNX Runtime's fused RMSNorm/RoPE/SiLU kernels. Default off (the decoder's default). */
  fused?: boolean;
}

/** Options of {@link causalLmLogprobs}: the trunk's and the LM head's. */
export interface CausalLmLogprobsOptions extends TrunkOptions {
  /** Log-probs of softmax(logits / temperature) (the sampling temperature). Default 1. */
  temperature?: number;
  /** Vocabulary rows per chunk of the log-partition (and entropy). Default 16,384. */
  chunk?: number;
  /** Also the entropy of each next-token distribution (one pass over each chunk gives both). Default false. */
  entropy?: boolean;
  /** Each vocabulary chunk's log-partition (and entropy) by this fused kernel (Lathe's cross-entropy kernels, @lathe/kernels) instead of composed ops; the session then needs its custom-op domain. */
  logprobKernel?: LogprobKernel;
}

/** What {@link causalLmLogprobs} returns. */
export interface CausalLmLogprobs {
  /** log p(ids[t+1] | ids ≤ t), [B, T] float32; the last column is meaningless. */
  logp: Tensor;
  /** Entropy of p(· | ids ≤ t), [B, T] float32, with the `entropy` option. */
  entropy?: Tensor;
  /** The decoder's final hidden states [B, T, hidden] (for other heads over the same forward pass). */
  hidden: Tensor;
}

/**
 * Next-token log-probs (and entropies) of token ids [B, T] under the decoder with weights `w`;
 * `attentionMask` [B, T] is 1 on tokens. Full-vocabulary logits are never materialised: the
 * log-partition runs over vocabulary chunks (`chunkedTargetLogprobs`, or with the entropy
 * `chunkedLogprobsAndEntropy`, which keeps more for the backward pass).
 */
export function causalLmLogprobs(cfg: DecoderConfig, w: Weights, ids: Tensor, attentionMask: Tensor, opts: CausalLmLogprobsOptions & { entropy: true }): CausalLmLogprobs & { entropy: Tensor };
export function causalLmLogprobs(cfg: DecoderConfig, w: Weights, ids: Tensor, attentionMask: Tensor, opts?: CausalLmLogprobsOptions): CausalLmLogprobs;
export function causalLmLogprobs(cfg: DecoderConfig, w: Weights, ids: Tensor, attentionMask: Tensor, opts: CausalLmLogprobsOptions = {}): CausalLmLogprobs {
  const hidden = decoderHidden(cfg, w, ids, attentionMask, opts);
  const head = { chunk: opts.chunk, temperature: opts.temperature, recompute: opts.recompute, ...(opts.logprobKernel ? { kernel: opts.logprobKernel } : {}) };
  if (opts.entropy) return { ...chunkedLogprobsAndEntropy(cfg, w, hidden, shiftLeft(ids), head), hidden };
  return { logp: chunkedTargetLogprobs(cfg, w, hidden, shiftLeft(ids), head), hidden };
}

/**
 * The decoder's final hidden states [B, T, hidden] for token ids [B, T] and their attention mask
 * (1 = token), with no head: the forward pass under {@link causalLmLogprobs}, and under a score head
 * (reward models, critics).
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
    ...(attention === 'flash' ? { flashAttention: { ...rightPaddedAttention(attentionMask, width()), ...(opts.attentionKernel ? { kernel: opts.attentionKernel } : {}), ...(opts.ropeKernel ? { ropeKernel: opts.ropeKernel } : {}), ...(opts.swigluKernel ? { swigluKernel: opts.swigluKernel } : {}) } } : {}),
  }).hidden;
}

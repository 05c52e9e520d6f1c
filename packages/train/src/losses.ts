/**
 * Losses as LossBuilders (see train-step.ts). Token losses are sums divided by a normaliser fed
 * per step (`loss_tokens`: the number of loss tokens in the whole optimizer batch), so that a
 * batch split into micro-batches gives exactly the same gradient as the whole batch.
 */
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import { causalLmLogprobs, chunkedTargetLogprobs, decoder, packedCausalMask, shiftLeft, totalLength, type DecoderConfig, type LogprobKernel, type TrunkOptions, type Weights } from '@lathe/models';
import type { LossBuilder } from './train-step';

/** The attention choice of `lathe sft`, `lathe grpo` and `GrpoTrainer`. */
export type AttentionChoice = 'auto' | 'composed' | 'flash';

/**
 * Whether a train step attends through flash attention: 'auto' (the default) picks it on CUDA with
 * a half-precision compute dtype, where it is the faster (docs/benchmarks.md), and composed attention
 * otherwise: on the CPU that is faster, and ONNX Runtime's CUDA GroupQueryAttention kernel exists
 * for float16/bfloat16 only, so a float32 step on CUDA cannot use it. 'flash' there is an error
 * naming the setting rather than ONNX Runtime's "nodes assigned to the CPU" at session creation.
 */
export function useFlashAttention(choice: AttentionChoice | undefined, device: 'cpu' | 'cuda', compute: DType = 'bfloat16', opts: { packing?: boolean } = {}): boolean {
  const half = compute === 'bfloat16' || compute === 'float16';
  if (choice === 'flash' && opts.packing) throw new Error(PACKING_WITH_FLASH);
  if (choice === 'flash' && device === 'cuda' && !half) {
    throw new Error(`attention 'flash' on cuda needs a bfloat16 or float16 compute dtype, got ${compute} (ONNX Runtime's CUDA GroupQueryAttention has no ${compute} kernel); use attention 'composed' or 'auto'`);
  }
  // packed rows need the segment mask only composed attention takes: 'auto' picks it
  return choice === 'flash' || ((choice ?? 'auto') === 'auto' && device === 'cuda' && half && !opts.packing);
}

/** Why packing and flash attention do not go together (the error of {@link useFlashAttention} and {@link sftLoss}). */
const PACKING_WITH_FLASH =
  "packing with attention 'flash' is not supported: GroupQueryAttention attends causally over a whole row and takes no segment mask, so each example would attend to the examples packed before it; use attention 'composed' (or 'auto', which picks it when packing)";

/** Weights for the decoder from master parameters, cast to the compute dtype once each. */
export function castWeights(params: Map<string, Tensor>, compute: DType): Weights {
  const cache = new Map<string, Tensor>();
  return (name) => {
    const p = params.get(name);
    if (!p) throw new Error(`no parameter '${name}'`);
    let c = cache.get(name);
    if (!c) cache.set(name, (c = L.cast(p, compute)));
    return c;
  };
}

/**
 * Per-token log-probs of the next token, [B, T], position T−1 meaningless (mask it): the training
 * form of `causalLmLogprobs` (@lathe/models). With `flashAttention` (the total-length tensor, see
 * `totalLength`) rows must be right-padded.
 */
export function nextTokenLogprobs(
  cfg: DecoderConfig,
  w: Weights,
  ids: Tensor,
  attentionMask: Tensor,
  opts: { temperature?: number; chunk?: number; recompute?: boolean; flashAttention?: Tensor; attentionKernel?: TrunkOptions['attentionKernel']; ropeKernel?: TrunkOptions['ropeKernel']; swigluKernel?: TrunkOptions['swigluKernel']; logprobKernel?: LogprobKernel } = {},
): Tensor {
  const { flashAttention, attentionKernel, ropeKernel, swigluKernel, ...head } = opts;
  return causalLmLogprobs(cfg, w, ids, attentionMask, { ...head, ...(flashAttention ? { attention: 'flash' as const, totalSequenceLength: flashAttention, attentionKernel, ropeKernel, swigluKernel } : {}) }).logp;
}

/** How a loss builds the decoder's forward pass: the options every decoder loss takes (SFT, the pair losses, the critic's). */
export interface DecoderLossOptions {
  /** Dtype of the forward/backward compute (master weights stay float32). Default float32. */
  compute?: DType;
  /**
   * How the decoder's weights come from the trainable parameters (default: each parameter cast to
   * `compute`). LoRA passes a function that declares the frozen base and adds the adapters.
   */
  weights?: (g: Graph, params: Map<string, Tensor>) => Weights;
  /**
   * A fixed batch shape [rows, T] instead of symbolic dims: every shape in the graph is then a
   * constant, no shape arithmetic runs at run time, and the step can be captured as a CUDA graph.
   */
  shape?: [number, number];
  /** Recompute each decoder layer in the backward pass instead of keeping its activations (less memory, ~⅓ more compute). */
  recompute?: boolean;
  /**
   * Attend through GroupQueryAttention (flash attention on CUDA) with its composed backward pass
   * instead of MatMul/Softmax: no [B, heads, T, T] activations kept. Rows must be right-padded (as
   * `padBatch` makes them); with symbolic shapes the batch also carries `total_sequence_length`.
   */
  flashAttention?: boolean;
  /** With `flashAttention`: attend through this kernel instead of GroupQueryAttention (see TrunkOptions.attentionKernel, @lathe/models). */
  attentionKernel?: TrunkOptions['attentionKernel'];
  /** With `flashAttention`: rotate queries and keys through this kernel instead of ONNX Runtime's RotaryEmbedding (see TrunkOptions.ropeKernel, @lathe/models). */
  ropeKernel?: TrunkOptions['ropeKernel'];
  /** With `flashAttention`: each MLP's silu(gate)·up through this kernel instead of QuickGelu and Mul (see TrunkOptions.swigluKernel, @lathe/models). */
  swigluKernel?: TrunkOptions['swigluKernel'];
  /**
   * The LM head's log-partition per vocabulary chunk through this fused kernel (Lathe's cross-entropy
   * kernels, `crossEntropyOps(...)` of @lathe/kernels) instead of composed ops: the session then needs
   * its custom-op domain. Losses without a vocabulary head ignore it.
   */
  logprobKernel?: LogprobKernel;
}

/** Options of the SFT loss. */
export interface SftLossOptions extends DecoderLossOptions {
  /** Vocabulary chunk of the log-prob computation. */
  chunk?: number;
  /**
   * Packed rows (TRL's `packing`): each row holds several examples one after another, told apart
   * by `segment_ids` (1, 2, … per example, 0 at padding), with `position_ids` restarting at 0 in
   * each. Attention is block-diagonal causal (an example sees only its own earlier tokens), and the
   * last token of an example never predicts the first of the next, so a packed row computes what
   * its examples compute alone. Composed attention only (flash attention is refused).
   */
  packing?: boolean;
}

/**
 * Masked next-token cross-entropy. Batch inputs: `input_ids` [B, T] int64, `attention_mask`
 * [B, T] int64 (1 = token), `loss_mask` [B, T] int64 (1 on tokens to predict, e.g. the response),
 * `loss_tokens` float32 scalar (loss tokens in the whole optimizer batch), and with
 * `flashAttention` over symbolic shapes `total_sequence_length` (int32 scalar T, see
 * `totalLengthTensor` in @lathe/models). With `packing`, `segment_ids` and `position_ids` [B, T]
 * int64 take the place of `attention_mask`. Metric: `token_nll_sum`.
 */
export function sftLoss(cfg: DecoderConfig, opts: SftLossOptions = {}): LossBuilder {
  if (opts.packing && opts.flashAttention) throw new Error(`sftLoss: ${PACKING_WITH_FLASH}`);
  return (g: Graph, params) => {
    const dims = opts.shape ?? ['B', 'T'];
    const ids = g.input('input_ids', 'int64', dims);
    const packed = opts.packing ? { segments: g.input('segment_ids', 'int64', dims), positions: g.input('position_ids', 'int64', dims) } : undefined;
    const attention = packed ? undefined : g.input('attention_mask', 'int64', dims);
    const lossMask = g.input('loss_mask', 'int64', dims);
    const normaliser = g.input('loss_tokens', 'float32', []);
    const w = opts.weights ? opts.weights(g, params) : castWeights(params, opts.compute ?? 'float32');
    const flashAttention = opts.flashAttention ? totalLength(g, ids) : undefined;
    const logp = packed
      ? packedNextTokenLogprobs(cfg, w, ids, packed.segments, packed.positions, { chunk: opts.chunk, recompute: opts.recompute, logprobKernel: opts.logprobKernel })
      : nextTokenLogprobs(cfg, w, ids, attention!, { chunk: opts.chunk, recompute: opts.recompute, flashAttention, attentionKernel: opts.attentionKernel, ropeKernel: opts.ropeKernel, swigluKernel: opts.swigluKernel, logprobKernel: opts.logprobKernel });
    // Position t predicts token t+1: weight it by loss_mask[t+1]; the wrapped last column gets 0,
    // and in packed rows so does an example's last token (the next token begins another example).
    let predicted = L.mul(shiftLeft(lossMask), lastColumnZero(lossMask));
    if (packed) predicted = L.mul(predicted, L.cast(L.equal(shiftLeft(packed.segments), packed.segments), 'int64'));
    const nllSum = L.neg(L.reduceSum(L.mul(logp, L.cast(predicted, 'float32'))));
    return { loss: L.div(nllSum, normaliser), metrics: { token_nll_sum: nllSum } };
  };
}

/**
 * {@link nextTokenLogprobs} of packed rows: the decoder with a block-diagonal causal mask from the
 * segment ids (`packedCausalMask`) and the given per-example positions, then the LM head's
 * chunked log-probs — composed attention, with the same numerics as the rows' examples alone.
 */
export function packedNextTokenLogprobs(cfg: DecoderConfig, w: Weights, ids: Tensor, segmentIds: Tensor, positionIds: Tensor, opts: { chunk?: number; recompute?: boolean; logprobKernel?: LogprobKernel } = {}): Tensor {
  const { hidden } = decoder(cfg, w, { inputIds: ids, positionIds, attentionMask: packedCausalMask(segmentIds), recompute: opts.recompute });
  return chunkedTargetLogprobs(cfg, w, hidden, shiftLeft(ids), { chunk: opts.chunk, recompute: opts.recompute, ...(opts.logprobKernel ? { kernel: opts.logprobKernel } : {}) });
}

/** 1 everywhere except the last column (int64 [B, T]). */
function lastColumnZero(x: Tensor): Tensor {
  const T = x.shape[1];
  if (typeof T === 'number') return L.mul(L.add(L.mul(x, 0), 1), x.graph.constant(Array.from({ length: T }, (_, t) => (t < T - 1 ? 1 : 0)), x.dtype, [1, T]));
  const ones = L.add(L.mul(x, 0), 1);
  const zeros = L.mul(L.slice(x, [1], [0], [1]), 0);
  return L.concat([L.slice(ones, [1], [0], [-1]), zeros], 1);
}

/** −mean log σ(r_chosen − r_rejected): the Bradley-Terry pairwise loss. */
export function bradleyTerry(chosen: Tensor, rejected: Tensor): Tensor {
  return L.neg(L.mean(L.logSigmoid(L.sub(chosen, rejected))));
}

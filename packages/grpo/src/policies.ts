/**
 * Policies for the RL loss: graph builders that turn the trainable parameters and the batch's token
 * ids into per-token log-probs (and entropies) in predicting-position coordinates — position t holds
 * log π(ids[t+1] | ids ≤ t). `decoderPolicy` is the LLM; any other differentiable builder (a tabular
 * policy in tests, a value-augmented model later) plugs into `rlLoss` the same way.
 */
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import { causalLmLogprobs, valuePerToken, type DecoderConfig, type LogprobKernel, type TrunkOptions, type Weights } from '@lathe/models';
import { castWeights } from '@lathe/train';

/** What a policy gives the loss. */
export interface PolicyOutputs {
  /** log π_θ(ids[t+1] | ids ≤ t), [B, T] float32 (the last column is meaningless: the mask excludes it). */
  logp: Tensor;
  /** Entropy of π_θ(· | ids ≤ t), [B, T] float32, when the policy was asked for it. */
  entropy?: Tensor;
  /** V(ids ≤ t) of a value head on the same trunk, [B, T] float32 (0 at padding), with `valueHead`. */
  values?: Tensor;
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
  /** Each chunk's log-partition and entropy through this fused kernel (CausalLmLogprobsOptions.logprobKernel, @lathe/models); the sessions then need its custom-op domain. */
  logprobKernel?: LogprobKernel;
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
  /** With `flashAttention`: attend through this kernel (Lathe's flash attention, `TrunkOptions.attentionKernel`) instead of GroupQueryAttention; the sessions then need its custom-op domain. */
  attentionKernel?: TrunkOptions['attentionKernel'];
  /** With `flashAttention`: rotate queries and keys through this kernel (Lathe's RoPE, `TrunkOptions.ropeKernel`) instead of RotaryEmbedding; the sessions then need its custom-op domain. */
  ropeKernel?: TrunkOptions['ropeKernel'];
  /** With `flashAttention`: each MLP's silu(gate)·up through this kernel (Lathe's SwiGLU, `TrunkOptions.swigluKernel`) instead of QuickGelu and Mul; the sessions then need its custom-op domain. */
  swigluKernel?: TrunkOptions['swigluKernel'];
  /**
   * Also a value per position from a linear head on the same hidden states (PPO's critic sharing the
   * policy's trunk): the parameter of this name, [1, hidden], must be among the trained ones.
   */
  valueHead?: string;
}

/**
 * A decoder LM as the policy: `causalLmLogprobs` (@lathe/models) over its own inputs. Inputs:
 * `input_ids` int64 [B, T] (prompt + response, padded), `attention_mask` int64 [B, T] (1 = token),
 * and with `flashAttention` `total_sequence_length`.
 */
export function decoderPolicy(cfg: DecoderConfig, opts: DecoderPolicyOptions = {}): PolicyBuilder {
  const chunk = opts.chunk ?? 16384;
  const temperature = opts.temperature ?? 1;
  if (!(temperature > 0)) throw new Error(`decoderPolicy: temperature must be > 0, got ${temperature}`);
  return (g, params) => {
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    const attention = g.input('attention_mask', 'int64', ['B', 'T']);
    const w = opts.weights ? opts.weights(g, params) : castWeights(params, opts.compute ?? 'float32');
    const { logp, entropy, hidden } = causalLmLogprobs(cfg, w, ids, attention, { chunk, temperature, recompute: opts.recompute, entropy: opts.entropy, attention: opts.flashAttention ? 'flash' : 'composed', ...(opts.logprobKernel ? { logprobKernel: opts.logprobKernel } : {}), ...(opts.flashAttention && opts.attentionKernel ? { attentionKernel: opts.attentionKernel } : {}), ...(opts.flashAttention && opts.ropeKernel ? { ropeKernel: opts.ropeKernel } : {}), ...(opts.flashAttention && opts.swigluKernel ? { swigluKernel: opts.swigluKernel } : {}) });
    const values = opts.valueHead ? L.where(L.cast(attention, 'bool'), L.cast(valuePerToken(hidden, w(opts.valueHead)), 'float32'), 0) : undefined;
    return { logp, ...(entropy ? { entropy } : {}), ...(values ? { values } : {}) };
  };
}


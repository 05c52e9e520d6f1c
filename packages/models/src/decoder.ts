/**
 * The decoder-only transformer shared by Qwen3, Qwen2 and Llama, in the graph DSL, written to
 * compute exactly what transformers computes: RMSNorm in float32, RoPE with cos/sin from position
 * ids (rope.ts), grouped-query attention with a float32 softmax, SwiGLU MLP. Read top to bottom:
 * rmsNorm → attention (three kinds) → mlp → decoderLayer → decoder.
 */
import * as L from '@lathe/onnx';
import type { DType, Tensor } from '@lathe/onnx';
import type { DecoderConfig } from './config';
import { accumulationDtype } from './precision';
import { rope, ropeCaches, type Rope, type RopeKernel } from './rope';

/**
 * Looks up a weight by its Hugging Face name, already in the compute dtype. It may also carry a
 * side branch for the decoder's projections (LoRA's low-rank term): {@link project} adds
 * `branch(name, x)` to x·Wᵀ, and `w(name)` is then the frozen base alone.
 */
export interface Weights {
  (hfName: string): Tensor;
  /** The term added to the output of the projection whose weight is `hfName` (input x), or undefined where there is none. */
  branch?: (hfName: string, x: Tensor) => Tensor | undefined;
  /**
   * x·Wᵀ computed by the weights themselves for the projection whose weight is `hfName` (e.g. a
   * quantized kernel, @lathe/quantization), or undefined to read `w(hfName)` as usual.
   */
  matmul?: (hfName: string, x: Tensor) => Tensor | undefined;
  /**
   * Whether `matmul`'s output for `hfName` already includes the projection's bias (weights that add
   * one concatenated bias before splitting a concatenated projection's output), so {@link project}
   * does not add it again. Default: it does not.
   */
  biasInMatmul?: (hfName: string) => boolean;
  /**
   * The weight `hfName` in float32 where the graph holds such a copy without a per-run cast (a bound
   * float32 copy, or a cast of an initializer that ONNX Runtime folds), or undefined. Inference graphs
   * in 16-bit dtypes fuse each residual add and RMSNorm only with a float32 norm weight (the residual
   * stream is float32); without one they keep Add + RMSNorm.
   */
  float32?: (hfName: string) => Tensor | undefined;
  /**
   * The output of a layer's projection group as one tensor, for kernels that read it in place:
   * 'qkv' of the `self_attn` module `prefix` ([.., (H + 2·KV)·headDim]: q, k, v) or 'gate_up' of the
   * `mlp` module `prefix` ([.., 2·intermediate]: gate, up), each member's bias added — or undefined
   * where the weights do not hold the group concatenated (then read the members through {@link project}).
   */
  packed?: (group: 'qkv' | 'gate_up', prefix: string, x: Tensor) => Tensor | undefined;
}

/** Keys and values of one layer: [B, numKvHeads, S, headDim]. */
export interface KvPair {
  key: Tensor;
  value: Tensor;
}

/** Inputs of the decoder with attention composed from primitives (masks of any shape). */
export interface DecoderInputs {
  /** Token ids, int64 [B, T]. */
  inputIds: Tensor;
  /** Position of each token, int64 [B, T] (per segment when sequences are packed). */
  positionIds: Tensor;
  /** bool [B, 1, T, S] (broadcastable): true where a query may attend a key. */
  attentionMask: Tensor;
  /** Cached keys/values of earlier positions, one pair per layer (generation). */
  past?: KvPair[];
  /**
   * Use ONNX Runtime's fused kernels for RMSNorm, RoPE and SiLU (far fewer nodes per layer; what
   * generation and scoring use; all have gradient rules). Default: on with `flashAttention`, off
   * otherwise (the composed path keeps the CPU training numerics it was tested with).
   */
  fused?: boolean;
  /**
   * Recompute each layer's activations in the backward pass instead of keeping them (gradient
   * checkpointing, see `checkpoint` in @lathe/onnx): training keeps only the layers' inputs, at
   * the cost of running every layer's forward twice. No effect without gradients.
   */
  recompute?: boolean;
  /**
   * Attend through ONNX Runtime's GroupQueryAttention (flash attention on CUDA) instead of the
   * composed MatMul/Softmax — differentiable (the op's gradient rule recomputes the probabilities
   * in the backward pass), so it serves training as well as scoring, and keeps no [B, heads, T, T]
   * value alive between the passes. Rows must be right-padded (see {@link rightPaddedAttention}):
   * `attentionMask` is then not read; a left-padded row would attend its padding.
   */
  flashAttention?: FlashAttentionInputs;
}

/** The row lengths GroupQueryAttention reads for a right-padded batch; see {@link rightPaddedAttention}. */
export interface FlashAttentionInputs {
  /** int32 [B]: each row's length − 1. */
  seqlensK: Tensor;
  /** int32 scalar T, read by the CUDA kernel in host memory: a constant or a graph input (never computed on the device). */
  totalSequenceLength: Tensor;
  /** bool [B, T, 1]: true at tokens; attention outputs at padding are zeroed with it. */
  tokens: Tensor;
  /**
   * Attend through Lathe's own flash-attention kernels instead of GroupQueryAttention and its
   * composed gradient rule: given GroupQueryAttention's inputs (query [B, T, H·hd], key and value
   * [B, T, KV·hd], RoPE applied) and the head counts, returns the output [B, T, H·hd]
   * (`flashAttentionOps(...).attend` of @lathe/kernels; the session then needs its custom-op
   * domain). Opt-in, CUDA bf16/fp16 only.
   */
  kernel?: (x: { query: Tensor; key: Tensor; value: Tensor; seqlensK: Tensor; totalSequenceLength: Tensor }, heads: { numHeads: number; kvNumHeads: number }) => Tensor;
  /** Rotate queries and keys through this kernel instead of ONNX Runtime's RotaryEmbedding (see {@link RopeKernel}). */
  ropeKernel?: RopeKernel;
  /** Each MLP's silu(gate)·up through this kernel instead of QuickGelu and Mul (see {@link SwigluKernel}). */
  swigluKernel?: SwigluKernel;
}

/**
 * The int32 scalar graph input holding a batch's width T where GroupQueryAttention reads it with
 * symbolic shapes: the CUDA kernel reads T in host memory, so it is fed, never computed on the
 * device (that would copy it back to the host every run).
 */
export const TOTAL_LENGTH_INPUT = 'total_sequence_length';

/** T for GroupQueryAttention: a constant when `ids` [B, T] has a static T, else the {@link TOTAL_LENGTH_INPUT} input. */
export function totalLength(g: L.Graph, ids: Tensor): Tensor {
  const T = ids.shape[1];
  return typeof T === 'number' ? g.constant(T, 'int32', []) : g.input(TOTAL_LENGTH_INPUT, 'int32', []);
}

/** The host value fed to {@link TOTAL_LENGTH_INPUT} for a batch T tokens wide. */
export function totalLengthTensor(T: number): { data: Int32Array; dims: number[] } {
  return { data: Int32Array.of(T), dims: [] };
}

/**
 * {@link FlashAttentionInputs} from a right-padded batch's mask [B, T] (1 = token, every row's
 * tokens first) and T (a constant when the shape is static, else an int32 scalar graph input).
 */
export function rightPaddedAttention(padMask: Tensor, totalSequenceLength: Tensor): FlashAttentionInputs {
  const g = padMask.graph;
  return {
    seqlensK: L.sub(L.reduceSum(L.cast(padMask, 'int32'), [1]), g.constant(1, 'int32', [])),
    totalSequenceLength,
    tokens: L.unsqueeze(L.cast(padMask, 'bool'), [2]),
  };
}

/**
 * Inputs of the decoder with ONNX Runtime's GroupQueryAttention (flash attention on CUDA; no
 * gradient rules, so inference only). Rows are right-padded and positions implicit: row b holds
 * positions 0..seqlensK[b]. Norms and RoPE are always fused here.
 */
export interface GqaDecoderInputs {
  /** Token ids, int64 [B, T]: a right-padded prompt (T > 1) or one new token per row (T = 1). */
  inputIds: Tensor;
  /** int32 [B]: each row's total length − 1 (for a decode step: the new token's position). */
  seqlensK: Tensor;
  /** int32 scalar: T for a prompt; the cache length M for a decode step. */
  totalSequenceLength: Tensor;
  /**
   * KV cache buffers [B, numKvHeads, M, headDim], one pair per layer, bound as both the input and
   * the output of each layer so the kernel appends in place. Omitted: no cache (scoring).
   */
  past?: KvPair[];
  /**
   * Qwen3's per-head Q/K RMSNorm inside GroupQueryAttention's kernel (its q_norm_weight /
   * k_norm_weight inputs) rather than as two norm nodes per layer. CUDA only: ONNX Runtime's CPU
   * kernel refuses those inputs. No effect on models without a Q/K norm.
   */
  qkNormInKernel?: boolean;
  /**
   * Weights with a concatenated q/k/v projection (`Weights.packed`) hand GroupQueryAttention its
   * output packed, [B, S, (H + 2·KV)·hd] (no Split), where no Q/K norm outside the kernel needs q and
   * k apart. Default on; off keeps the split q, k and v (an A/B or a fallback).
   */
  packedQkv?: boolean;
  /**
   * Each residual add and the RMSNorm after it as one SkipSimplifiedLayerNormalization kernel (see
   * {@link addRmsNorm}): two nodes fewer a layer. Default on; off gives the unfused graph (A/B checks).
   */
  fuseResidualNorm?: boolean;
  /**
   * The residual stream's dtype between the layers (see {@link ResidualDtype}). Default 'float32'.
   */
  residualDtype?: ResidualDtype;
  /** Each MLP's silu(gate)·up through this kernel instead of QuickGelu and Mul (see {@link SwigluKernel}). */
  swigluKernel?: SwigluKernel;
}

/**
 * The dtype of an inference graph's residual stream: 'float32' (default) holds the running sum in
 * float32 whatever the compute dtype, so each sub-block's output and each norm's input cross a Cast
 * (and a fused norm reads a float32 copy of its weight); 'compute' keeps it in the compute dtype
 * (the embeddings' dtype) as transformers does in bf16/fp16, each sum rounded once by the fused
 * norm, with no Casts between the layers. The same graph in float32.
 */
export type ResidualDtype = 'float32' | 'compute';

/** What the decoder returns. */
export interface DecoderOutputs {
  /** Final-norm hidden states [B, T, hidden]. */
  hidden: Tensor;
  /** Keys/values including this call's positions, one pair per layer. */
  present: KvPair[];
}

/**
 * RMSNorm as transformers computes it: in float32, cast to the weight's (compute) dtype, then scaled
 * by the weight. The fused kernel keeps the product with the weight in float32 too (one rounding
 * fewer in half precision). `x` may be float32 when the weight is not (the residual stream, below).
 */
export function rmsNormHf(x: Tensor, weight: Tensor, eps: number, fused = false): Tensor {
  if (fused) return L.simplifiedLayerNorm(L.cast(x, weight.dtype), weight, eps);
  const y = L.rmsNorm(L.cast(x, accumulationDtype(x.dtype)), undefined, eps);
  return L.mul(L.cast(y, weight.dtype), weight);
}

/**
 * The residual stream between the sub-blocks of an inference graph: the sum so far (float32, or the
 * compute dtype with {@link ResidualDtype} 'compute') and the
 * last sub-block's output not yet added to it, which the next norm adds (see {@link addRmsNorm}).
 */
export interface ResidualStream {
  sum: Tensor;
  pending?: Tensor;
}

/**
 * sum + pending, and RMSNorm of it by weight `name` (as {@link rmsNormHf} with the fused kernel): one
 * SkipSimplifiedLayerNormalization (inference only, no gradient rule) where the weight is in the
 * stream's dtype or `w.float32` has it, else Add + RMSNorm. Returns the normed value in the weight's
 * dtype and the new sum. In 16-bit dtypes the fused norm rounds its float32 output once, where
 * the unfused one normalizes the sum already rounded to the weight's dtype.
 */
export function addRmsNorm(w: Weights, name: string, stream: ResidualStream, eps: number, fuse = true): { normed: Tensor; sum: Tensor } {
  const weight = w(name);
  const { sum, pending } = stream;
  const gamma = sum.dtype === weight.dtype ? weight : w.float32?.(name);
  if (pending && fuse && gamma) {
    const r = L.skipSimplifiedLayerNorm(sum, L.cast(pending, sum.dtype), gamma, eps);
    return { normed: L.cast(r.output, weight.dtype), sum: r.sum };
  }
  const next = pending ? L.add(sum, L.cast(pending, sum.dtype)) : sum;
  return { normed: rmsNormHf(next, weight, eps, true), sum: next };
}

const transposed = new WeakMap<Tensor, Tensor>();

/**
 * x·Wᵀ (+ b): a PyTorch Linear with weight [out, in]. Wᵀ is made once per weight, in the weight's
 * own graph: inside a decode loop's body it is then an outer value, not a per-step transpose.
 */
export function linear(x: Tensor, weight: Tensor, bias?: Tensor): Tensor {
  let wt = transposed.get(weight);
  if (!wt) {
    wt = L.Graph.build(weight.graph, () => L.transpose(weight, [1, 0]));
    transposed.set(weight, wt);
  }
  const y = L.matmul(x, wt);
  return bias ? L.add(y, bias) : y;
}

/**
 * A projection of the decoder (q/k/v/o, gate/up/down) by its module name: x·Wᵀ (or the weights'
 * own `matmul` for it) (+ `<module>.bias` when `bias`) (+ the weights' side branch for that weight, if any). Every projection goes through
 * here, so a side branch reaches them all.
 */
export function project(w: Weights, module: string, x: Tensor, bias = false): Tensor {
  const name = `${module}.weight`;
  const own = w.matmul?.(name, x);
  const y = own ? (bias && !w.biasInMatmul?.(name) ? L.add(own, w(`${module}.bias`)) : own) : linear(x, w(name), bias ? w(`${module}.bias`) : undefined);
  const side = w.branch?.(name, x);
  return side ? L.add(y, side) : y;
}

/** Whether `hfName` is a weight the decoder reads through {@link project} (where a side branch applies). */
export function isProjectionWeight(hfName: string): boolean {
  return /\.(self_attn\.[qkvo]|mlp\.(gate|up|down))_proj\.weight$/.test(hfName);
}

/**
 * A layer's attention inputs from x [B, T, hidden]: queries [B, T, H, headDim] and keys
 * [B, T, KV, headDim] (QK-normed where the model has it, before RoPE), values [B, T, KV·headDim].
 */
function projectQkv(cfg: DecoderConfig, w: Weights, prefix: string, x: Tensor, fused = false, qkNorm = true): { q: Tensor; k: Tensor; v: Tensor } {
  const [B, T] = x.shape;
  const proj = (name: string) => project(w, `${prefix}.${name}`, x, cfg.attentionBias);
  const heads = (t: Tensor, n: number) => L.reshape(t, [B, T, n, cfg.headDim]);
  let q = heads(proj('q_proj'), cfg.numHeads);
  let k = heads(proj('k_proj'), cfg.numKvHeads);
  if (cfg.qkNorm && qkNorm) {
    q = rmsNormHf(q, w(`${prefix}.q_norm.weight`), cfg.rmsNormEps, fused);
    k = rmsNormHf(k, w(`${prefix}.k_norm.weight`), cfg.rmsNormEps, fused);
  }
  return { q, k, v: proj('v_proj') };
}

/** Grouped-query self-attention of one layer. */
export function attention(
  cfg: DecoderConfig,
  w: Weights,
  prefix: string,
  x: Tensor,
  applyRotary: Rope,
  mask: Tensor,
  past?: KvPair,
  fused = false,
): { out: Tensor; present: KvPair } {
  const { numHeads: H, numKvHeads: KV, headDim: hd } = cfg;
  const [B, T] = x.shape;
  const p = projectQkv(cfg, w, prefix, x, fused);
  const v = L.transpose(L.reshape(p.v, [B, T, KV, hd]), [0, 2, 1, 3]);
  const q = applyRotary(L.transpose(p.q, [0, 2, 1, 3])); // [B, H, T, hd]
  const k = applyRotary(L.transpose(p.k, [0, 2, 1, 3])); // [B, KV, T, hd]
  const key = past ? L.concat([past.key, k], 2) : k;
  const value = past ? L.concat([past.value, v], 2) : v;
  const G = H / KV;
  if (T === 1) {
    // One query per row (a decode step): the G query heads of each KV head are the rows of one
    // plain batched matmul, [B, KV, G, hd] · [B, KV, hd, S] — no broadcast copies of the cache,
    // and ONNX Runtime folds the key transpose into the matmul.
    const q4 = L.reshape(q, [B, KV, G, hd]);
    const s4 = L.mul(L.cast(L.matmul(q4, L.transpose(key, [0, 1, 3, 2])), accumulationDtype(x.dtype)), 1 / Math.sqrt(hd)); // [B, KV, G, S]
    const p4 = L.cast(L.maskedSoftmax(s4, mask), x.dtype); // mask [B, 1, 1, S] broadcasts over KV and G
    const merged1 = L.reshape(L.matmul(p4, value), [B, 1, H * hd]); // [B, KV, G, hd] → [B, 1, H·hd]
    const out1 = project(w, `${prefix}.o_proj`, merged1, cfg.outputBias);
    return { out: out1, present: { key, value } };
  }
  // Queries grouped per KV head: [B, KV, H/KV, T, hd] against keys [B, KV, 1, S, hd].
  const qg = L.reshape(q, [B, KV, G, T, hd]);
  const kt = L.unsqueeze(L.transpose(key, [0, 1, 3, 2]), [2]);
  const scores = L.mul(L.cast(L.matmul(qg, kt), accumulationDtype(x.dtype)), 1 / Math.sqrt(hd)); // [B, KV, G, T, S]
  const probs = L.cast(L.maskedSoftmax(scores, L.unsqueeze(mask, [1])), x.dtype);
  const ctx = L.matmul(probs, L.unsqueeze(value, [2])); // [B, KV, G, T, hd]
  const merged = L.reshape(L.transpose(L.reshape(ctx, [B, H, T, hd]), [0, 2, 1, 3]), [B, T, H * hd]);
  const out = project(w, `${prefix}.o_proj`, merged, cfg.outputBias);
  return { out, present: { key, value } };
}

/**
 * Attention of a right-padded batch through GroupQueryAttention, differentiable: projections,
 * QK-norm (fused RMSNorm kernels) and RoPE (the fused RotaryEmbedding kernel on [B, T, heads·headDim],
 * so no transposes) here, each with its gradient rule, then the kernel attends causally within
 * each row's length. Outputs at padding are zeroed, which keeps them out of later layers and makes
 * their output gradients 0, as the op's gradient rule expects.
 */
export function flashAttention(cfg: DecoderConfig, w: Weights, prefix: string, x: Tensor, rotary: Rope, rows: FlashAttentionInputs): { out: Tensor; present: KvPair } {
  const { numHeads: H, numKvHeads: KV, headDim: hd } = cfg;
  const [B, T] = x.shape;
  const { q, k, v } = projectQkv(cfg, w, prefix, x, true);
  const flat = (t: Tensor, n: number) => rotary(L.reshape(t, [B, T, n * hd]));
  if (rows.kernel) {
    const key = flat(k, KV);
    const o = rows.kernel({ query: flat(q, H), key, value: v, seqlensK: rows.seqlensK, totalSequenceLength: rows.totalSequenceLength }, { numHeads: H, kvNumHeads: KV });
    const kept = L.where(rows.tokens, o, x.graph.constant(0, o.dtype, []));
    const present = (t: Tensor) => L.transpose(L.reshape(t, [B, T, KV, hd]), [0, 2, 1, 3]);
    return { out: project(w, `${prefix}.o_proj`, kept, cfg.outputBias), present: { key: present(key), value: present(v) } };
  }
  const r = L.groupQueryAttention({ query: flat(q, H), key: flat(k, KV), value: v, seqlensK: rows.seqlensK, totalSequenceLength: rows.totalSequenceLength }, { numHeads: H, kvNumHeads: KV });
  const attended = L.where(rows.tokens, r.output, x.graph.constant(0, r.output.dtype, []));
  const out = project(w, `${prefix}.o_proj`, attended, cfg.outputBias);
  return { out, present: { key: r.presentKey, value: r.presentValue } };
}

/**
 * The same attention through ONNX Runtime's GroupQueryAttention: projections and QK-norm here,
 * then one kernel applies RoPE, appends keys/values to the cache and attends causally.
 */
export function gqaAttention(
  cfg: DecoderConfig,
  w: Weights,
  prefix: string,
  x: Tensor,
  kv: { seqlensK: Tensor; totalSequenceLength: Tensor; rotary: { cos: Tensor; sin: Tensor }; qkNormInKernel?: boolean; packedQkv?: boolean },
  past?: KvPair,
): { out: Tensor; present: KvPair } {
  const { numHeads: H, numKvHeads: KV, headDim: hd } = cfg;
  const [B, T] = x.shape;
  const inKernel = cfg.qkNorm && kv.qkNormInKernel;
  const qkNorm = inKernel ? { q: w(`${prefix}.q_norm.weight`), k: w(`${prefix}.k_norm.weight`), epsilon: cfg.rmsNormEps } : undefined;
  const common = { past, seqlensK: kv.seqlensK, totalSequenceLength: kv.totalSequenceLength, rotary: kv.rotary, qkNorm };
  // Weights with a concatenated q/k/v projection hand it over packed (no Split), where no norm
  // outside the kernel needs q and k apart.
  const packed = kv.packedQkv !== false && (!cfg.qkNorm || inKernel) ? w.packed?.('qkv', prefix, x) : undefined;
  let r: ReturnType<typeof L.groupQueryAttention>;
  if (packed) r = L.groupQueryAttention({ query: packed, ...common }, { numHeads: H, kvNumHeads: KV });
  else {
    const p = projectQkv(cfg, w, prefix, x, true, !inKernel);
    r = L.groupQueryAttention({ query: L.reshape(p.q, [B, T, H * hd]), key: L.reshape(p.k, [B, T, KV * hd]), value: p.v, ...common }, { numHeads: H, kvNumHeads: KV });
  }
  const out = project(w, `${prefix}.o_proj`, r.output, cfg.outputBias);
  return { out, present: { key: r.presentKey, value: r.presentValue } };
}

/**
 * A SwiGLU activation kernel standing in for the MLP's SiLU and product: given gate and up of one
 * shape and dtype, returns silu(gate)·up, differentiable in both (`swigluOps(...).apply` of
 * @lathe/kernels; the session then needs its custom-op domain).
 */
export interface SwigluKernel {
  (gate: Tensor, up: Tensor): Tensor;
  /** silu(gate)·up of one packed gu [.., 2·I] (gate, then up: `Weights.packed`'s 'gate_up') → [.., I]; inference only. */
  packed?: (gu: Tensor) => Tensor;
}

/**
 * SwiGLU MLP: down(silu(gate(x)) · up(x)). `fused`: SiLU as ONNX Runtime's QuickGelu kernel (α = 1),
 * one pass where the composed x·σ(x) takes two, and two fewer in the backward pass; `kernel`: the
 * whole activation in one pass (and its gradient in one) instead; a kernel with `packed` reads the
 * weights' packed gate/up (`Weights.packed`) where they have it.
 */
export function mlp(cfg: DecoderConfig, w: Weights, prefix: string, x: Tensor, fused = false, kernel?: SwigluKernel): Tensor {
  // A kernel that reads gate/up packed takes the weights' concatenated projection as it is (no Split).
  const gu = kernel?.packed ? w.packed?.('gate_up', prefix, x) : undefined;
  if (gu && kernel?.packed) return project(w, `${prefix}.down_proj`, kernel.packed(gu), cfg.mlpBias);
  const gate = project(w, `${prefix}.gate_proj`, x, cfg.mlpBias);
  const up = project(w, `${prefix}.up_proj`, x, cfg.mlpBias);
  const act = kernel ? kernel(gate, up) : L.mul(fused ? L.quickGelu(gate, 1) : L.silu(gate), up);
  return project(w, `${prefix}.down_proj`, act, cfg.mlpBias);
}

/**
 * One layer's self-attention over its normed input x [B, T, hidden] — the same kind for every layer
 * of a decoder call, chosen once by {@link layerAttention}. `prefix` is the layer's `self_attn`
 * module name; `past` its cached keys/values, if any.
 */
export type LayerAttention = (x: Tensor, prefix: string, past?: KvPair) => { out: Tensor; present: KvPair };

/**
 * The attention of a decoder call, chosen once from its inputs (with the RoPE tables it reads):
 * GroupQueryAttention with RoPE inside the kernel ({@link GqaDecoderInputs}), differentiable flash
 * attention (`flashAttention`), or attention composed from primitives (any mask).
 */
export function layerAttention(cfg: DecoderConfig, w: Weights, inputs: DecoderInputs | GqaDecoderInputs, dtype: DType, fused: boolean): LayerAttention {
  if ('seqlensK' in inputs) {
    const kv = { seqlensK: inputs.seqlensK, totalSequenceLength: inputs.totalSequenceLength, rotary: ropeCaches(cfg, inputs.inputIds.graph, dtype), qkNormInKernel: inputs.qkNormInKernel, packedQkv: inputs.packedQkv };
    return (x, prefix, past) => gqaAttention(cfg, w, prefix, x, kv, past);
  }
  const flash = inputs.flashAttention;
  if (flash) {
    if (inputs.past) throw new Error('decoder: flashAttention takes no KV cache (it attends within the batch)');
    const rotary = rope(cfg, inputs.positionIds, dtype, true, flash.ropeKernel);
    return (x, prefix) => flashAttention(cfg, w, prefix, x, rotary, flash);
  }
  const rotary = rope(cfg, inputs.positionIds, dtype, fused);
  return (x, prefix, past) => attention(cfg, w, prefix, x, rotary, inputs.attentionMask, past, fused);
}

/**
 * Layer `i`, a pre-norm block: h + attention(norm(h)), then + mlp(norm(·)) (its activation through
 * `swiglu` when given). `x` is the float32 residual stream; each sub-block's output is cast into it.
 * Scopes name the nodes (attn/…, mlp/…) so profiles attribute time by block.
 */
export function decoderLayer(cfg: DecoderConfig, w: Weights, i: number, x: Tensor, attend: LayerAttention, past?: KvPair, fused = false, swiglu?: SwigluKernel): { hidden: Tensor; present: KvPair } {
  const g = x.graph;
  const p = `model.layers.${i}`;
  const norm = (t: Tensor, name: string) => rmsNormHf(t, w(name), cfg.rmsNormEps, fused);
  const a = g.scope('attn', () => attend(norm(x, `${p}.input_layernorm.weight`), `${p}.self_attn`, past));
  const mid = L.add(x, L.cast(a.out, x.dtype));
  const hidden = L.add(mid, L.cast(g.scope('mlp', () => mlp(cfg, w, `${p}.mlp`, norm(mid, `${p}.post_attention_layernorm.weight`), fused, swiglu)), x.dtype));
  return { hidden, present: a.present };
}

/**
 * Layer `i` of an inference graph: {@link decoderLayer}'s computation with each residual add left
 * pending for the next norm, which fuses the two ({@link addRmsNorm}). Takes and returns the stream.
 */
export function inferenceLayer(cfg: DecoderConfig, w: Weights, i: number, x: ResidualStream, attend: LayerAttention, past?: KvPair, fuse = true, swiglu?: SwigluKernel): { stream: ResidualStream; present: KvPair } {
  const g = x.sum.graph;
  const p = `model.layers.${i}`;
  const eps = cfg.rmsNormEps;
  let mid: Tensor | undefined;
  const a = g.scope('attn', () => {
    const n = addRmsNorm(w, `${p}.input_layernorm.weight`, x, eps, fuse);
    return { ...attend(n.normed, `${p}.self_attn`, past), sum: n.sum };
  });
  const out = g.scope('mlp', () => {
    const n = addRmsNorm(w, `${p}.post_attention_layernorm.weight`, { sum: a.sum, pending: a.out }, eps, fuse);
    mid = n.sum;
    return mlp(cfg, w, `${p}.mlp`, n.normed, true, swiglu);
  });
  return { stream: { sum: mid!, pending: out }, present: a.present };
}

/**
 * The layers and final norm of an inference graph over embeddings `h` (the residual stream, in h's dtype):
 * N {@link inferenceLayer}s, each in scope `layer{i}`, then the final norm fused with the last add.
 */
export function inferenceLayers(cfg: DecoderConfig, w: Weights, h: Tensor, attend: LayerAttention, past?: KvPair[], fuse = true, swiglu?: SwigluKernel): DecoderOutputs {
  const g = h.graph;
  let stream: ResidualStream = { sum: h };
  const present: KvPair[] = [];
  for (let i = 0; i < cfg.numLayers; i++) {
    const x = stream;
    stream = g.scope(`layer${i}`, () => {
      const out = inferenceLayer(cfg, w, i, x, attend, past?.[i], fuse, swiglu);
      present.push(out.present);
      return out.stream;
    });
  }
  return { hidden: addRmsNorm(w, 'model.norm.weight', stream, cfg.rmsNormEps, fuse).normed, present };
}

/**
 * The decoder: embeddings → N {@link decoderLayer} blocks → final norm. Attention is composed from
 * primitives (any mask; differentiable), differentiable flash attention, or, given
 * {@link GqaDecoderInputs}, ONNX Runtime's GroupQueryAttention (right-padded rows; inference only).
 */
export function decoder(cfg: DecoderConfig, w: Weights, inputs: DecoderInputs | GqaDecoderInputs): DecoderOutputs {
  const g = inputs.inputIds.graph;
  const embedded = L.gather(w('model.embed_tokens.weight'), inputs.inputIds, 0);
  // The residual stream is float32 whatever the compute dtype (unless an inference graph asks for
  // residualDtype 'compute'): in bf16/fp16 each layer's output is rounded once, as a matmul output,
  // but the running sum is not rounded again after every add (as it is when transformers runs in
  // bf16). The layers themselves compute in the weights' dtype.
  const gqa = 'seqlensK' in inputs;
  let h = gqa && inputs.residualDtype === 'compute' ? embedded : L.cast(embedded, accumulationDtype(embedded.dtype));
  // ONNX Runtime's fused RMSNorm/RoPE/SiLU kernels: for GroupQueryAttention graphs, and by default with
  // flash attention (a kernel path already; their gradient rules make them trainable).
  const fused = gqa ? true : (inputs.fused ?? Boolean(inputs.flashAttention));
  const recompute = !gqa && inputs.recompute;
  const attend = layerAttention(cfg, w, inputs, embedded.dtype, fused);
  // GroupQueryAttention graphs are inference only: their residual adds fuse into the norms.
  if (gqa) return inferenceLayers(cfg, w, h, attend, inputs.past, inputs.fuseResidualNorm ?? true, inputs.swigluKernel);
  const swiglu = inputs.flashAttention?.swigluKernel;
  const present: KvPair[] = [];
  for (let i = 0; i < cfg.numLayers; i++) {
    const input = h;
    const layer = () => {
      const out = decoderLayer(cfg, w, i, input, attend, inputs.past?.[i], fused, swiglu);
      present.push(out.present);
      return out.hidden;
    };
    h = g.scope(`layer${i}`, () => (recompute ? L.checkpoint([input], layer) : layer()));
  }
  return { hidden: rmsNormHf(h, w('model.norm.weight'), cfg.rmsNormEps, fused), present };
}

// ---- masks and positions -----------------------------------------------------------------------

/** Causal mask combined with key padding: bool [B, 1, T, T] from a [B, T] mask (1 = token). */
export function paddedCausalMask(padMask: Tensor): Tensor {
  const causal = L.causalMask(padMask, 1); // [T, T]
  const keys = L.unsqueeze(L.cast(padMask, 'bool'), [1, 2]); // [B, 1, 1, T]
  return L.and(L.unsqueeze(causal, [0, 1]), keys);
}

/**
 * Block-diagonal causal mask for packed rows: bool [B, 1, T, T], true where the key precedes the
 * query within the same segment. Segment id 0 marks padding.
 */
export function packedCausalMask(segmentIds: Tensor): Tensor {
  const causal = L.unsqueeze(L.causalMask(segmentIds, 1), [0, 1]);
  const q = L.unsqueeze(segmentIds, [1, 3]); // [B, 1, T, 1]
  const k = L.unsqueeze(segmentIds, [1, 2]); // [B, 1, 1, T]
  const sameSegment = L.equal(q, k);
  const notPad = L.greater(k, k.graph.constant(0, k.dtype, []));
  return L.and(L.and(causal, sameSegment), notPad);
}

/**
 * GroupQueryAttention inputs for a right-padded batch without a cache (scoring): each row's length
 * − 1 from its mask [B, T], and T as given (an int32 scalar the kernel reads in host memory — a
 * graph input, since computing it from a shape would put nodes on the CPU).
 */
export function rightPaddedGqaInputs(inputIds: Tensor, padMask: Tensor, totalSequenceLength: Tensor): GqaDecoderInputs {
  const g = padMask.graph;
  return { inputIds, seqlensK: L.sub(L.reduceSum(L.cast(padMask, 'int32'), [1]), g.constant(1, 'int32', [])), totalSequenceLength };
}

/** Positions that skip left padding: cumsum(mask) − 1, clamped at 0 (as HF generate does). */
export function positionsFromPadding(padMask: Tensor): Tensor {
  const m = L.cast(padMask, 'int64');
  return L.maximum(L.sub(L.cumsum(m, 1), 1), 0);
}

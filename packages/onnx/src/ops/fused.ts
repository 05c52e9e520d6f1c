/**
 * Fused ops ONNX Runtime provides beyond the ONNX standard, used where they measure faster: one
 * node instead of the 6–10 primitives they replace, which matters most inside a decode loop whose
 * every node is a kernel launch per token. They have no gradient rules (training builds the same
 * math from primitives); each is tested against its primitive composition.
 */
import { formatShape } from '../dim';
import { isFloat } from '../dtype';
import { applyOp, type Tensor } from '../graph';
import { attr, defineOp } from '../op';

/** RMSNorm over the last axis: x / √(mean(x²) + ε) · scale, statistics in float32. */
export const simplifiedLayerNormOp = defineOp<{ epsilon: number }>({
  name: 'SimplifiedLayerNormalization',
  infer: ([x, scale]) => {
    if (!isFloat(x!.dtype)) throw new Error(`input must be floating point, got ${x!.dtype}`);
    if (scale!.dtype !== x!.dtype) throw new Error(`scale must be ${x!.dtype}, got ${scale!.dtype}`);
    if (scale!.shape.length !== 1) throw new Error(`scale must be 1-D, got ${formatShape(scale!.shape)}`);
    return [{ dtype: x!.dtype, shape: [...x!.shape] }];
  },
  onnxAttrs: ({ epsilon }) => ({ axis: attr.int(-1), epsilon: attr.float(epsilon), stash_type: attr.int(1) }),
});

/** RMSNorm over the last axis with a learned scale, as one ONNX Runtime kernel. */
export function simplifiedLayerNorm(x: Tensor, scale: Tensor, epsilon: number): Tensor {
  return applyOp(simplifiedLayerNormOp, [x, scale], { epsilon })[0];
}

/**
 * Rotary embedding (com.microsoft.RotaryEmbedding, non-interleaved: the halves of each head are
 * rotated as transformers' `rotate_half` does). x is [B, heads, S, headDim]; positions int64
 * [B, S]; caches [maxPositions, headDim/2] in x's dtype.
 */
export const rotaryEmbeddingOp = defineOp({
  name: 'RotaryEmbedding',
  domain: 'com.microsoft',
  infer: ([x, pos, cos, sin]) => {
    if (x!.shape.length !== 4) throw new Error(`input must be [B, heads, S, headDim], got ${formatShape(x!.shape)}`);
    if (pos!.dtype !== 'int64') throw new Error(`position ids must be int64, got ${pos!.dtype}`);
    for (const c of [cos!, sin!]) {
      if (c.dtype !== x!.dtype) throw new Error(`cos/sin caches must be ${x!.dtype}, got ${c.dtype}`);
      const hd = x!.shape[3];
      if (c.shape.length !== 2 || (typeof hd === 'number' && c.shape[1] !== hd / 2)) {
        throw new Error(`cos/sin caches must be [maxPositions, ${typeof hd === 'number' ? hd / 2 : 'headDim/2'}], got ${formatShape(c.shape)}`);
      }
    }
    return [{ dtype: x!.dtype, shape: [...x!.shape] }];
  },
  onnxAttrs: () => ({ interleaved: attr.int(0) }),
});

/** Applies RoPE to [B, heads, S, headDim] at the given positions, reading precomputed cos/sin tables. */
export function rotaryEmbedding(x: Tensor, positionIds: Tensor, cosCache: Tensor, sinCache: Tensor): Tensor {
  return applyOp(rotaryEmbeddingOp, [x, positionIds, cosCache, sinCache], {})[0];
}

/** Attributes of {@link groupQueryAttention}. */
export interface GroupQueryAttentionAttrs {
  numHeads: number;
  kvNumHeads: number;
  /** Apply RoPE (non-interleaved) to queries and keys inside the kernel, from cos/sin caches. */
  doRotary: boolean;
}

/**
 * Causal grouped-query attention with a KV cache (com.microsoft.GroupQueryAttention; flash
 * attention on CUDA, which registers it for float16/bfloat16 only — the CPU kernel takes float32
 * too). Inputs: query [B, S, H·hd], key/value [B, S, KV·hd], past key/value [B, KV, M, hd] or
 * null, seqlens_k int32 [B] (each row's total length − 1), total_sequence_length int32 [] (kept in
 * host memory by the CUDA kernel), cos/sin caches [maxPositions, hd/2] or null. Rows are
 * right-padded: row b's keys are positions 0..seqlens_k[b]; with S > 1 (a prompt) S must equal
 * total_sequence_length, with S = 1 (a decode step) the new key lands at position seqlens_k[b].
 * When past and present are bound to the same buffer, the kernel writes the new keys in place.
 * Outputs: attention output [B, S, H·hd], present key/value [B, KV, M or S, hd].
 */
export const groupQueryAttentionOp = defineOp<GroupQueryAttentionAttrs>({
  name: 'GroupQueryAttention',
  domain: 'com.microsoft',
  infer: ([q, k, v, pastK, pastV, seqlens, total, cos, sin], { numHeads, kvNumHeads }) => {
    if (q!.shape.length !== 3 || k!.shape.length !== 3 || v!.shape.length !== 3) {
      throw new Error(`query/key/value must be [B, S, heads·headDim], got ${formatShape(q!.shape)}, ${formatShape(k!.shape)}, ${formatShape(v!.shape)}`);
    }
    if (k!.dtype !== q!.dtype || v!.dtype !== q!.dtype) throw new Error(`query, key and value must share a dtype, got ${q!.dtype}, ${k!.dtype}, ${v!.dtype}`);
    if (numHeads % kvNumHeads !== 0) throw new Error(`numHeads (${numHeads}) must be a multiple of kvNumHeads (${kvNumHeads})`);
    const width = q!.shape[2];
    if (typeof width !== 'number') throw new Error('the query width must be static');
    const hd = width / numHeads;
    if (!Number.isInteger(hd) || hd % 8 !== 0) throw new Error(`head size ${width}/${numHeads} must be a multiple of 8`);
    if (k!.shape[2] !== kvNumHeads * hd) throw new Error(`key width must be ${kvNumHeads * hd}, got ${k!.shape[2]}`);
    if (seqlens!.dtype !== 'int32' || seqlens!.shape.length !== 1) throw new Error(`seqlens_k must be int32 [B], got ${seqlens!.dtype} ${formatShape(seqlens!.shape)}`);
    if (total!.dtype !== 'int32' || total!.shape.length !== 0) throw new Error(`total_sequence_length must be an int32 scalar, got ${total!.dtype} ${formatShape(total!.shape)}`);
    if (!pastK !== !pastV) throw new Error('past key and value must both be given or both omitted');
    for (const c of [cos, sin]) {
      if (c && (c.dtype !== q!.dtype || c.shape.length !== 2 || c.shape[1] !== hd / 2)) {
        throw new Error(`cos/sin caches must be ${q!.dtype} [maxPositions, ${hd / 2}], got ${c.dtype} ${formatShape(c.shape)}`);
      }
    }
    const [B, S] = q!.shape;
    const kvShape = pastK ? [...pastK.shape] : [B, kvNumHeads, S, hd];
    return [
      { dtype: q!.dtype, shape: [B, S, width] },
      { dtype: q!.dtype, shape: kvShape },
      { dtype: q!.dtype, shape: kvShape },
    ];
  },
  onnxAttrs: ({ numHeads, kvNumHeads, doRotary }) => ({
    num_heads: attr.int(numHeads),
    kv_num_heads: attr.int(kvNumHeads),
    do_rotary: attr.int(doRotary ? 1 : 0),
    rotary_interleaved: attr.int(0),
  }),
  nonDiffInputs: [5, 6],
});

/** Inputs of {@link groupQueryAttention}. */
export interface GroupQueryAttentionInputs {
  query: Tensor;
  key: Tensor;
  value: Tensor;
  past?: { key: Tensor; value: Tensor };
  seqlensK: Tensor;
  totalSequenceLength: Tensor;
  rotary?: { cos: Tensor; sin: Tensor };
}

/** Causal GQA with an optional in-place KV cache; see {@link groupQueryAttentionOp}. */
export function groupQueryAttention(
  x: GroupQueryAttentionInputs,
  heads: { numHeads: number; kvNumHeads: number },
): { output: Tensor; presentKey: Tensor; presentValue: Tensor } {
  const [output, presentKey, presentValue] = applyOp(
    groupQueryAttentionOp,
    [x.query, x.key, x.value, x.past?.key ?? null, x.past?.value ?? null, x.seqlensK, x.totalSequenceLength, x.rotary?.cos ?? null, x.rotary?.sin ?? null],
    { ...heads, doRotary: !!x.rotary },
  );
  return { output, presentKey, presentValue };
}

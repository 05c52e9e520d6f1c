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

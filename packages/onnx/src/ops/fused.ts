/**
 * Fused ops ONNX Runtime provides beyond the ONNX standard, used where they measure faster: one
 * node instead of the 6–10 primitives they replace, which matters most inside a decode loop whose
 * every node is a kernel launch per token. Each is tested against its primitive composition.
 * Each has a gradient rule composed from primitives (GroupQueryAttention's in the manner of flash
 * attention's backward pass), so training runs its forward through the fused kernels; the one
 * exception, SkipSimplifiedLayerNormalization, serves inference graphs only.
 */
import { formatShape, shapeSize, type Dim } from '../dim';
import { isFloat } from '../dtype';
import { applyOp, GraphError, type Tensor } from '../graph';
import { attr, defineOp, type GradContext } from '../op';
import { causalMask } from '../nn';
import { constant } from './core';
import { add, cast, div, greaterOrEqual, lessOrEqual, mul, neg, onesLike, reciprocal, sigmoid, sqrt, sub, where } from './elementwise';
import { matmul } from './linalg';
import { cumsum, reduceSum, reduceSumSquare, softmax } from './reduce';
import { concat, reshape, reshapeLike, slice, split, transpose, unsqueeze } from './shape-ops';

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
  grad: (ctx) => simplifiedLayerNormGrad(ctx),
});

/**
 * y = x̂ ⊙ w with x̂ = x·r, r = (mean(x²) + ε)^(−1/2) per row, in float32 (the kernel's stash type):
 *   dw = Σ_rows u,   dx = r · (g − x̂ · mean(g ⊙ x̂))  with u = dy ⊙ x̂ and g = dy ⊙ w.
 * mean(g ⊙ x̂) = (u · w) / D is one matrix-vector product over u, which dw needs anyway: no
 * g ⊙ x̂ tensor is written (a pass over [rows, D] float32 per norm, four norms a layer in Qwen3).
 * The rule works on [rows, D]: ONNX Runtime 1.29 multiplies by a per-row [rows, 1] operand with
 * its per-channel kernel, but by a [B, T, 1] one (two non-1 dims) with its general broadcast kernel.
 * r is recomputed from x (the kernel's inverse-std output would need a second output kept alive).
 */
function simplifiedLayerNormGrad({ inputs: [x, scale], dy: [dy], attrs }: GradContext<{ epsilon: number }>): (Tensor | null)[] {
  const acc = x!.dtype === 'float64' ? 'float64' : 'float32';
  const D = x!.shape[x!.rank - 1] as number;
  const rows = (t: Tensor) => reshape(t, [-1, D]);
  const xf = rows(cast(x!, acc));
  const dyf = rows(cast(dy!, acc));
  const w = cast(scale!, acc);
  const r = reciprocal(sqrt(add(div(reduceSumSquare(xf, [-1], true), D), attrs.epsilon))); // [rows, 1]
  const xhat = mul(xf, r);
  const u = mul(dyf, xhat);
  const dot = div(matmul(u, reshape(w, [D, 1])), D); // [rows, 1]
  const dxRows = mul(sub(mul(dyf, w), mul(xhat, dot)), r);
  // Back to x's shape: by a constant spec when it is static, else read from x at run time.
  const dx = cast(x!.shape.every((d) => typeof d === 'number') ? reshape(dxRows, x!.shape) : reshapeLike(dxRows, x!), x!.dtype);
  const dw = cast(reduceSum(u, [0]), scale!.dtype);
  return [dx, dw];
}

/** RMSNorm over the last axis with a learned scale, as one ONNX Runtime kernel. */
export function simplifiedLayerNorm(x: Tensor, scale: Tensor, epsilon: number): Tensor {
  return applyOp(simplifiedLayerNormOp, [x, scale], { epsilon })[0];
}

/**
 * The residual add and the RMSNorm after it as one kernel (com.microsoft.SkipSimplifiedLayerNormalization;
 * CPU and CUDA kernels for float32 and float16, CUDA for bfloat16 too): s = x + skip, y = s / √(mean(s²) + ε) · γ,
 * statistics in float32. x and skip are [B, S, D] or [rows, D], γ [D], all one dtype. Outputs y and s
 * (ONNX outputs 0 and 3; the training-only mean and inverse-std outputs 1 and 2 are emitted for the
 * slots but left unread). Inference only: it has no gradient rule, so autodiff refuses a path through
 * it (training graphs keep Add and {@link simplifiedLayerNormOp}, which have rules).
 */
export const skipSimplifiedLayerNormOp = defineOp<{ epsilon: number }>({
  name: 'SkipSimplifiedLayerNormalization',
  domain: 'com.microsoft',
  infer: ([x, skip, gamma]) => {
    if (!isFloat(x!.dtype) || x!.dtype === 'float64') throw new Error(`input must be float32, float16 or bfloat16, got ${x!.dtype}`);
    if (x!.shape.length !== 3 && x!.shape.length !== 2) throw new Error(`input must be [B, S, hidden] or [rows, hidden], got ${formatShape(x!.shape)}`);
    if (skip!.dtype !== x!.dtype || gamma!.dtype !== x!.dtype) throw new Error(`skip and gamma must be ${x!.dtype}, got ${skip!.dtype} and ${gamma!.dtype}`);
    if (skip!.shape.length !== x!.shape.length || skip!.shape.some((d, i) => typeof d === 'number' && typeof x!.shape[i] === 'number' && d !== x!.shape[i])) {
      throw new Error(`skip must have the input's shape ${formatShape(x!.shape)}, got ${formatShape(skip!.shape)}`);
    }
    const D = x!.shape[x!.shape.length - 1];
    if (gamma!.shape.length !== 1 || (typeof D === 'number' && typeof gamma!.shape[0] === 'number' && gamma!.shape[0] !== D)) {
      throw new Error(`gamma must be [${String(D)}], got ${formatShape(gamma!.shape)}`);
    }
    const stats = [...x!.shape.slice(0, -1), 1];
    return [
      { dtype: x!.dtype, shape: [...x!.shape] },
      { dtype: 'float32', shape: stats },
      { dtype: 'float32', shape: stats },
      { dtype: x!.dtype, shape: [...x!.shape] },
    ];
  },
  onnxAttrs: ({ epsilon }) => ({ epsilon: attr.float(epsilon) }),
});

/** RMSNorm of x + skip with a learned scale, and the sum itself, in one kernel; {@link skipSimplifiedLayerNormOp}. */
export function skipSimplifiedLayerNorm(x: Tensor, skip: Tensor, gamma: Tensor, epsilon: number): { output: Tensor; sum: Tensor } {
  const [output, , , sum] = applyOp(skipSimplifiedLayerNormOp, [x, skip, gamma], { epsilon });
  return { output, sum };
}

/**
 * Rotary embedding (com.microsoft.RotaryEmbedding, non-interleaved: the halves of each head are
 * rotated as transformers' `rotate_half` does). x is [B, heads, S, headDim], or [B, S, heads·headDim]
 * (headDim from the caches); positions int64 [B, S]; caches [maxPositions, headDim/2] in x's dtype.
 * The gradient is the inverse rotation: the same op on dy with the sine negated.
 */
export const rotaryEmbeddingOp = defineOp({
  name: 'RotaryEmbedding',
  domain: 'com.microsoft',
  nonDiffInputs: [1, 2, 3],
  infer: ([x, pos, cos, sin]) => {
    if (x!.shape.length !== 4 && x!.shape.length !== 3) throw new Error(`input must be [B, heads, S, headDim] or [B, S, heads·headDim], got ${formatShape(x!.shape)}`);
    if (pos!.dtype !== 'int64') throw new Error(`position ids must be int64, got ${pos!.dtype}`);
    for (const c of [cos!, sin!]) {
      if (c.dtype !== x!.dtype) throw new Error(`cos/sin caches must be ${x!.dtype}, got ${c.dtype}`);
      const last = x!.shape[x!.shape.length - 1];
      const half = c.shape[1];
      const fits = x!.shape.length === 4 ? last === (half as number) * 2 : (last as number) % ((half as number) * 2) === 0;
      if (c.shape.length !== 2 || (typeof last === 'number' && typeof half === 'number' && !fits)) {
        throw new Error(`cos/sin caches must be [maxPositions, headDim/2] for input ${formatShape(x!.shape)}, got ${formatShape(c.shape)}`);
      }
    }
    return [{ dtype: x!.dtype, shape: [...x!.shape] }];
  },
  onnxAttrs: () => ({ interleaved: attr.int(0) }),
  grad: ({ inputs: [, pos, cos, sin], dy: [dy] }) => [rotaryEmbedding(dy!, pos!, cos!, neg(sin!)), null, null, null],
});

/** Applies RoPE to [B, heads, S, headDim] (or [B, S, heads·headDim]) at the given positions, reading precomputed cos/sin tables. */
export function rotaryEmbedding(x: Tensor, positionIds: Tensor, cosCache: Tensor, sinCache: Tensor): Tensor {
  return applyOp(rotaryEmbeddingOp, [x, positionIds, cosCache, sinCache], {})[0];
}

/**
 * x·σ(α·x) (com.microsoft.QuickGelu; with α = 1, SiLU in one kernel where the composed form runs
 * Sigmoid and Mul; CUDA kernels for float32, float16 and bfloat16, a CPU kernel for float32).
 * Gradient from the output y and a recomputed s = σ(α·x): dy/dx = s + α·y·(1 − s), five passes
 * (the composed form's autodiff takes six and keeps σ(x) from the forward pass).
 */
export const quickGeluOp = defineOp<{ alpha: number }>({
  name: 'QuickGelu',
  domain: 'com.microsoft',
  infer: ([x]) => {
    if (!isFloat(x!.dtype)) throw new Error(`expects a floating-point tensor, got ${x!.dtype}`);
    return [{ dtype: x!.dtype, shape: [...x!.shape] }];
  },
  onnxAttrs: ({ alpha }) => ({ alpha: attr.float(alpha) }),
  grad: ({ inputs: [x], outputs: [y], dy: [g], attrs: { alpha } }) => {
    const one = constant(x!.graph, 1, x!.dtype, []);
    const s = sigmoid(alpha === 1 ? x! : mul(x!, constant(x!.graph, alpha, x!.dtype, [])));
    const ay = alpha === 1 ? y! : mul(y!, constant(x!.graph, alpha, x!.dtype, []));
    return [mul(g!, add(s, mul(ay, sub(one, s))))];
  },
});

/** x·σ(α·x) in one kernel; {@link quickGeluOp}. `quickGelu(x, 1)` is SiLU. */
export function quickGelu(x: Tensor, alpha: number): Tensor {
  return applyOp(quickGeluOp, [x], { alpha })[0];
}

/** Attributes of {@link groupQueryAttention}. */
export interface GroupQueryAttentionAttrs {
  numHeads: number;
  kvNumHeads: number;
  /** Apply RoPE (non-interleaved) to queries and keys inside the kernel, from cos/sin caches. */
  doRotary: boolean;
  /**
   * Epsilon of the per-head RMSNorm the kernel applies to queries and keys before RoPE, with
   * weights given as inputs 14 and 15 (Qwen3's q_norm/k_norm). Unset: no norm. CUDA only: ONNX
   * Runtime's CPU kernel refuses these inputs.
   */
  qkNormEpsilon?: number;
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
  infer: ([q, k, v, pastK, pastV, seqlens, total, cos, sin, , , , , , qNorm, kNorm], { numHeads, kvNumHeads, doRotary, qkNormEpsilon }) => {
    if (!k !== !v) throw new Error('key and value must both be given, or both omitted (query then holds q, k and v packed)');
    if (q!.shape.length !== 3 || (k && (k.shape.length !== 3 || v!.shape.length !== 3))) {
      throw new Error(`query/key/value must be [B, S, heads·headDim], got ${[q, k, v].filter((t) => t).map((t) => formatShape(t!.shape)).join(', ')}`);
    }
    if (k && (k.dtype !== q!.dtype || v!.dtype !== q!.dtype)) throw new Error(`query, key and value must share a dtype, got ${q!.dtype}, ${k.dtype}, ${v!.dtype}`);
    if (numHeads % kvNumHeads !== 0) throw new Error(`numHeads (${numHeads}) must be a multiple of kvNumHeads (${kvNumHeads})`);
    const packedWidth = q!.shape[2];
    if (typeof packedWidth !== 'number') throw new Error('the query width must be static');
    // packed: [B, S, (H + 2·KV)·hd], q then k then v
    const hd = k ? packedWidth / numHeads : packedWidth / (numHeads + 2 * kvNumHeads);
    const width = numHeads * hd;
    if (!Number.isInteger(hd) || hd % 8 !== 0) throw new Error(`head size ${k ? `${packedWidth}/${numHeads}` : `${packedWidth}/(${numHeads} + 2·${kvNumHeads}) of the packed query`} must be a multiple of 8`);
    if (k && k.shape[2] !== kvNumHeads * hd) throw new Error(`key width must be ${kvNumHeads * hd}, got ${k.shape[2]}`);
    if (seqlens!.dtype !== 'int32' || seqlens!.shape.length !== 1) throw new Error(`seqlens_k must be int32 [B], got ${seqlens!.dtype} ${formatShape(seqlens!.shape)}`);
    if (total!.dtype !== 'int32' || total!.shape.length !== 0) throw new Error(`total_sequence_length must be an int32 scalar, got ${total!.dtype} ${formatShape(total!.shape)}`);
    if (!pastK !== !pastV) throw new Error('past key and value must both be given or both omitted');
    for (const c of [cos, sin]) {
      if (c && (c.dtype !== q!.dtype || c.shape.length !== 2 || c.shape[1] !== hd / 2)) {
        throw new Error(`cos/sin caches must be ${q!.dtype} [maxPositions, ${hd / 2}], got ${c.dtype} ${formatShape(c.shape)}`);
      }
    }
    if (qkNormEpsilon !== undefined) {
      if (!doRotary) throw new Error('the in-kernel Q/K norm needs the in-kernel rotary (it runs before RoPE)');
      for (const w of [qNorm, kNorm]) {
        if (!w || w.dtype !== q!.dtype || w.shape.length !== 1 || w.shape[0] !== hd) throw new Error(`q/k norm weights must both be ${q!.dtype} [${hd}], got ${w ? `${w.dtype} ${formatShape(w.shape)}` : 'none'}`);
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
  onnxAttrs: ({ numHeads, kvNumHeads, doRotary, qkNormEpsilon }) => ({
    num_heads: attr.int(numHeads),
    kv_num_heads: attr.int(kvNumHeads),
    do_rotary: attr.int(doRotary ? 1 : 0),
    rotary_interleaved: attr.int(0),
    ...(qkNormEpsilon !== undefined ? { qk_norm_epsilon: attr.float(qkNormEpsilon) } : {}),
  }),
  nonDiffInputs: [5, 6],
  grad: (ctx) => groupQueryAttentionGrad(ctx),
});

/**
 * Gradient of GroupQueryAttention without a KV cache and without in-kernel rotary (a whole
 * right-padded batch at once, as training runs it). The forward kernel keeps no probabilities, so
 * the rule recomputes them from q and k — P = softmax((q·scale)·kᵀ + causal mask bias) — and
 * applies flash attention's backward:
 *   dV = Pᵀ·dO,  dP = dO·Vᵀ,  D = rowsum(dO ⊙ O),  dS = P ⊙ (dP − D),  dQ = dS·K·scale,  dK = dSᵀ·(Q·scale).
 * The G query heads that share a KV head are stacked as rows, [B, KV, G·S, ·], so every product
 * is a strided batch over [B, KV] (a key broadcast over a G axis, as pointer-array batches, is no
 * faster), and dV = Pᵀ·dO and dK = dSᵀ·Q sum over the G heads inside the matmul (a ReduceSum over
 * that axis runs as a slow cuDNN reduction; docs/benchmarks.md).
 * The [B, heads, S, S] values exist only while this layer's backward runs, and they are the rule's
 * cost (each pass over them moves 8·16·1024² elements per layer at 8 × 1024 for the 0.6B shape),
 * so they stay in the compute dtype: the softmax accumulates in float32 inside its kernel, D is
 * summed in float32 and dP − D is formed in the float32 accumulator of one matmul, but P, dP − D
 * and dS are stored in bf16/fp16. Flash attention also rounds P and dS to half precision for its
 * products; it forms dS = P ⊙ (dP − D) in float32 registers, where this rule rounds dP − D before
 * the product (the losses still agree with PyTorch's; docs/benchmarks.md). In float32 nothing is
 * rounded.
 * Only the causal mask is applied: the key-length mask is implied for every query row that
 * matters, since a query i < len_b sees keys j ≤ i < len_b. Rows past a row's length (padding)
 * see padding keys, but their dO is expected to be 0 (the decoder zeroes those outputs, so it is),
 * which makes their dS rows 0; they use O = 0 in D, so whatever the kernel wrote there cannot reach
 * the gradient.
 */
function groupQueryAttentionGrad({ inputs, outputs, dy, attrs }: GradContext<GroupQueryAttentionAttrs>): (Tensor | null)[] {
  const [q, k, v, pastKey, , seqlens, , cos] = inputs;
  if (!k) throw new GraphError('GroupQueryAttention: the gradient rule takes separate query, key and value (not a packed query)');
  if (pastKey || cos || attrs.doRotary) {
    throw new GraphError('GroupQueryAttention: the gradient rule covers calls without a KV cache and without in-kernel rotary only (apply RoPE before the op)');
  }
  const [dOut, dPresentKey, dPresentValue] = dy;
  const { numHeads: H, kvNumHeads: KV } = attrs;
  const G = H / KV;
  const [B, S, W] = q!.shape as [Dim, Dim, number];
  const hd = W / H;
  const scale = 1 / Math.sqrt(hd);
  const dt = q!.dtype;
  const acc = dt === 'float64' ? 'float64' : 'float32';
  const g = q!.graph;
  // Queries [B, KV, G·S, hd] (head g's rows at g·S…); keys and values [B, KV, S, hd].
  const queries5 = (t: Tensor) => transpose(reshape(t, [B, S, KV, G, hd]), [0, 2, 3, 1, 4]); // [B, KV, G, S, hd]
  const stacked = (t: Tensor) => reshape(t, [B, KV, -1, t.shape[4]!]);
  const fromQueries = (t: Tensor) => reshape(transpose(reshape(t, [B, KV, G, S, hd]), [0, 3, 1, 2, 4]), [B, S, W]);
  const keys = (t: Tensor) => transpose(reshape(t, [B, S, KV, hd]), [0, 2, 1, 3]);
  // [B, KV, hd, S] → [B, S, KV·hd]
  const fromKeysTransposed = (t: Tensor) => reshape(transpose(t, [0, 3, 1, 2]), [B, S, KV * hd]);
  const swap = (t: Tensor) => transpose(t, [0, 1, 3, 2]);
  // The present key/value outputs are k and v in [B, KV, S, hd] layout (no cache): their gradients
  // flow straight back.
  const fromPresent = (t: Tensor) => reshape(transpose(t, [0, 2, 1, 3]), [B, S, KV * hd]);
  const plus = (a: Tensor | null, x: Tensor | null | undefined): Tensor | null => (x ? (a ? add(a, fromPresent(x)) : fromPresent(x)) : a);
  if (!dOut) return [null, plus(null, dPresentKey), plus(null, dPresentValue), null, null, null, null, null, null];

  // The scale goes on q ([S, hd]) rather than on the scores ([S, S]).
  const qScaled = stacked(mul(queries5(q!), constant(g, scale, dt, [])));
  const k4 = keys(k!);
  const v4 = keys(v!);
  const masked = dt === 'float16' ? -6e4 : -1e9;
  const bias = causalBias(q!, masked); // [S, S]
  // scores [B, KV, G·S, S] + bias [S, S], added as [B, KV, G, S·S] + [S·S] (free reshapes): ONNX
  // Runtime 1.29 runs a right-aligned operand with two non-1 dims through its slow general
  // broadcast kernel, one with a single non-1 dim through its per-channel kernel.
  const scores = matmul(qScaled, swap(k4));
  const area = shapeSize(bias.shape);
  const p = softmax(reshapeLike(add(reshape(scores, [B, KV, G, area]), reshape(bias, [area])), scores), -1); // [B, KV, G·S, S]

  // Positions i + 1 ([S]): constants for a static S, else counted along any [S] slice of q.
  const pos =
    typeof S === 'number'
      ? constant(g, Array.from({ length: S }, (_, i) => i + 1), acc, [S])
      : cumsum(onesLike(cast(reshape(slice(q!, [0, 2], [0, 0], [1, 1]), [S]), acc)), 0);
  const valid = lessOrEqual(unsqueeze(pos, [0]), add(cast(unsqueeze(seqlens!, [1]), acc), 1)); // [B, S]: position i < len_b
  const dO = stacked(queries5(dOut));
  const o = stacked(where(reshape(valid, [B, 1, 1, S, 1]), queries5(outputs[0]!), constant(g, 0, dt, [])));
  const rowDot = cast(reduceSum(mul(cast(dO, acc), cast(o, acc)), [-1], true), dt); // D, [B, KV, G·S, 1]
  // dP − D as one product, [dO, −D, 0…]·[V, 1, 0…]ᵀ: the matmul accumulates the difference in
  // float32 and rounds it once, and no broadcast subtract runs over [S, S] (the slow general
  // broadcast kernel). 7 zero columns pad hd + 1 to a multiple of 8 for the tensor cores.
  // They are sliced and scaled rather than made from a Shape: ONNX Runtime turns
  // Shape(Slice(Transpose(…))) into a Gather it runs on the CPU, one per layer.
  // The 8 extra columns are [−D, 0…] and [1, 0…]: a column broadcast against e₀ = [1, 0, …, 0].
  const e0 = constant(g, [1, 0, 0, 0, 0, 0, 0, 0], dt, [8]);
  const zeros8 = (t: Tensor) => mul(slice(t, [3], [0], [8]), constant(g, 0, dt, []));
  const dOD = appendColumns(dO, mul(neg(rowDot), e0)); // [B, KV, G·S, hd + 8]
  const v1 = appendColumns(v4, add(zeros8(v4), e0)); // [B, KV, S, hd + 8]
  const dS = mul(p, matmul(dOD, swap(v1)));
  // The products that need an [S, S] operand transposed are formed transposed — (dOᵀ·P)ᵀ,
  // (Qᵀ·dS)ᵀ — so only [S, hd] values are transposed.
  const dv = fromKeysTransposed(matmul(swap(dO), p)); // from [B, KV, hd, S]
  const dq = mul(fromQueries(matmul(dS, k4)), constant(g, scale, dt, []));
  const dk = fromKeysTransposed(matmul(swap(qScaled), dS));
  return [dq, plus(dk, dPresentKey), plus(dv, dPresentValue), null, null, null, null, null, null];
}

/**
 * [t, extra] along the last axis, t [B, KV, R, hd] and extra [B, KV, R, 8], joined as hd/8 + 1
 * equal 8-wide parts: ONNX Runtime's CUDA Split and Concat pass up to 32 equal parts by value,
 * while a Concat of unequal parts copies index tables from the host on every run, which CUDA-graph
 * replay would read stale. Head sizes that do not split so fall back to the plain Concat.
 */
function appendColumns(t: Tensor, extra: Tensor): Tensor {
  const hd = t.shape[3];
  if (typeof hd !== 'number' || hd % 8 !== 0 || hd / 8 + 1 > 32) return concat([t, extra], 3);
  const lead = t.shape.slice(0, 3);
  const columns = split(reshape(t, [...lead, hd / 8, 8]), new Array<number>(hd / 8).fill(1), 3);
  return reshape(concat([...columns, reshape(extra, [...lead, 1, 8])], 3), [...lead, hd + 8]);
}

/** Each graph's causal bias, by (S, dtype): built once and shared by every layer's rule. */
const causalBiasCache = new WeakMap<object, Map<string, Tensor>>();

/**
 * The causal additive bias [S, S] for queries `like` [B, S, ·]: 0 where key ≤ query and `masked`
 * elsewhere, built once per graph and sequence-length dim and shared by all layers. With a static
 * S it comes from constants (ONNX Runtime folds it when the session is created); a symbolic S is
 * read at run time from the first `like` it is built for.
 */
function causalBias(like: Tensor, masked: number): Tensor {
  const g = like.graph;
  const dt = like.dtype;
  const S = like.shape[1]!;
  const acc = dt === 'float64' ? 'float64' : 'float32';
  const key = `${S}|${dt}|${masked}`;
  const perGraph = causalBiasCache.get(g) ?? new Map<string, Tensor>();
  causalBiasCache.set(g, perGraph);
  let made = perGraph.get(key);
  if (!made) {
    const positions = Array.from({ length: typeof S === 'number' ? S : 0 }, (_, i) => i);
    const visible =
      typeof S === 'number'
        ? greaterOrEqual(constant(g, positions, 'int64', [S, 1]), constant(g, positions, 'int64', [1, S]))
        : causalMask(reshape(slice(like, [0, 2], [0, 0], [1, 1]), [S]), 0);
    made = cast(where(visible, constant(g, 0, acc, []), constant(g, masked, acc, [])), dt);
    perGraph.set(key, made);
  }
  return made;
}

/** Inputs of {@link groupQueryAttention}. */
export interface GroupQueryAttentionInputs {
  /** [B, S, H·hd]; or, with key and value omitted, q, k and v packed: [B, S, (H + 2·KV)·hd]. */
  query: Tensor;
  key?: Tensor;
  value?: Tensor;
  past?: { key: Tensor; value: Tensor };
  seqlensK: Tensor;
  totalSequenceLength: Tensor;
  rotary?: { cos: Tensor; sin: Tensor };
  /** Per-head RMSNorm of queries and keys inside the kernel, before RoPE (CUDA only; needs `rotary`). */
  qkNorm?: { q: Tensor; k: Tensor; epsilon: number };
}

/** Causal GQA with an optional in-place KV cache; see {@link groupQueryAttentionOp}. */
export function groupQueryAttention(
  x: GroupQueryAttentionInputs,
  heads: { numHeads: number; kvNumHeads: number },
): { output: Tensor; presentKey: Tensor; presentValue: Tensor } {
  const [output, presentKey, presentValue] = applyOp(
    groupQueryAttentionOp,
    [
      x.query, x.key ?? null, x.value ?? null, x.past?.key ?? null, x.past?.value ?? null, x.seqlensK, x.totalSequenceLength, x.rotary?.cos ?? null, x.rotary?.sin ?? null,
      ...(x.qkNorm ? [null, null, null, null, null, x.qkNorm.q, x.qkNorm.k] : []),
    ],
    { ...heads, doRotary: !!x.rotary, ...(x.qkNorm ? { qkNormEpsilon: x.qkNorm.epsilon } : {}) },
  );
  return { output, presentKey, presentValue };
}

/**
 * Fused ops ONNX Runtime provides beyond the ONNX standard, used where they measure faster: one
 * node instead of the 6–10 primitives they replace, which matters most inside a decode loop whose
 * every node is a kernel launch per token. Each is tested against its primitive composition.
 * Each has a gradient rule composed from primitives (GroupQueryAttention's in the manner of flash
 * attention's backward pass), so training runs its forward through the fused kernels.
 */
import { formatShape, type Dim } from '../dim';
import { isFloat } from '../dtype';
import { applyOp, GraphError, type Tensor } from '../graph';
import { attr, defineOp, type GradContext } from '../op';
import { add, cast, div, greaterOrEqual, lessOrEqual, mul, neg, reciprocal, sqrt, sub, where } from './elementwise';
import { matmul } from './linalg';
import { concat, reshape, slice, split, transpose, unsqueeze } from './shape-ops';
import { causalMask } from '../nn';
import { reduceSum, reduceSumSquare, softmax } from './reduce';

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
 *   dw = Σ_rows dy ⊙ x̂,   dx = r · (g − x̂ · mean(g ⊙ x̂))  with g = dy ⊙ w.
 * r is recomputed from x (the kernel's inverse-std output would need a second output kept alive).
 */
function simplifiedLayerNormGrad({ inputs: [x, scale], dy: [dy], attrs }: GradContext<{ epsilon: number }>): (Tensor | null)[] {
  const acc = x!.dtype === 'float64' ? 'float64' : 'float32';
  const D = x!.shape[x!.rank - 1] as number;
  const xf = cast(x!, acc);
  const dyf = cast(dy!, acc);
  const r = reciprocal(sqrt(add(div(reduceSumSquare(xf, [-1], true), D), attrs.epsilon)));
  const xhat = mul(xf, r);
  const g = mul(dyf, cast(scale!, acc));
  const dot = div(reduceSum(mul(g, xhat), [-1], true), D);
  const dx = cast(mul(r, sub(g, mul(xhat, dot))), x!.dtype);
  const rows = [...Array(x!.rank - 1).keys()];
  const dw = cast(reduceSum(mul(dyf, xhat), rows), scale!.dtype);
  return [dx, dw];
}

/** RMSNorm over the last axis with a learned scale, as one ONNX Runtime kernel. */
export function simplifiedLayerNorm(x: Tensor, scale: Tensor, epsilon: number): Tensor {
  return applyOp(simplifiedLayerNormOp, [x, scale], { epsilon })[0];
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

/** Attributes of {@link groupQueryAttention}. */
export interface GroupQueryAttentionAttrs {
  numHeads: number;
  kvNumHeads: number;
  /** Apply RoPE (non-interleaved) to queries and keys inside the kernel, from cos/sin caches. */
  doRotary: boolean;
  /**
   * Query blocks the gradient rule splits the sequence into (see {@link causalBlockCount}, the
   * default). Not an ONNX attribute: it shapes only the backward graph.
   */
  gradBlocks?: number;
}

/**
 * How many query blocks the attention gradient rule splits a sequence of S positions into: 4
 * blocks of at least 256 rows, else 2, else 1 (a symbolic S is never split). Block i's queries see
 * keys [0, (i + 1)·S/n) only, so the [S, S] values the rule forms — scores, P, dP − D, dS — and the
 * products over them cover (n + 1)/(2n) of the square: 5/8 with 4 blocks. Flash attention skips
 * the masked tiles the same way, at a finer grain.
 */
export function causalBlockCount(S: Dim): number {
  if (typeof S !== 'number') return 1;
  return [4, 2].find((n) => S % n === 0 && S / n >= 256) ?? 1;
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
  grad: (ctx) => groupQueryAttentionGrad(ctx),
});

/**
 * Gradient of GroupQueryAttention without a KV cache and without in-kernel rotary (a whole
 * right-padded batch at once, as training runs it). The forward kernel keeps no probabilities, so
 * the rule recomputes them from q and k — P = softmax((q·scale)·kᵀ + causal mask bias), the
 * key-length mask being implied for the rows that matter (see below) — and applies flash
 * attention's backward:
 *   dV = Pᵀ·dO,  dP = dO·Vᵀ,  D = rowsum(dO ⊙ O),  dS = P ⊙ (dP − D),  dQ = dS·K·scale,  dK = dSᵀ·(Q·scale),
 * summing dK and dV over the query heads that share a KV head (inside the products). The rows are
 * taken in causal blocks ({@link causalBlockCount}): block i's queries against keys
 * [0, (i + 1)·S/n) only, key blocks' gradients summed over the query blocks that see them. The
 * [B, heads, S, S] values exist only while this layer's backward runs, and they are the rule's cost
 * (each pass over them moves 8·16·1024² elements per layer at 8 × 1024 for the 0.6B shape), so
 * they stay in the compute dtype: the softmax accumulates in float32 inside its kernel, D is summed
 * in float32 and dP − D is formed in the float32 accumulator of one matmul, but P, dP − D and dS
 * are stored in bf16/fp16. Flash attention also rounds P and dS to half precision for its
 * products; it forms dS = P ⊙ (dP − D) in float32 registers, where this rule rounds dP − D before
 * the product (measured at the 0.6B shape: losses within 4e-6 of PyTorch's after 5 steps,
 * docs/benchmarks.md). In float32 nothing is rounded.
 * Query rows past a row's length (padding) use O = 0 in D, so whatever the kernel wrote there cannot
 * reach the gradient; their dO is expected to be 0 (the decoder zeroes those outputs, so it is).
 */
function groupQueryAttentionGrad({ inputs, outputs, dy, attrs }: GradContext<GroupQueryAttentionAttrs>): (Tensor | null)[] {
  const [q, k, v, pastKey, , seqlens, , cos] = inputs;
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
  const n = attrs.gradBlocks ?? causalBlockCount(S);
  if (n > 1 && (typeof S !== 'number' || S % n !== 0)) throw new GraphError(`GroupQueryAttention: ${n} gradient blocks do not divide the sequence length ${S}`);
  const b = n > 1 ? (S as number) / n : S; // rows per query block
  // Queries [B, KV, G, s, hd] for s rows; keys and values [B, KV, 1, S, hd] (broadcast over the G
  // query heads).
  const queries = (t: Tensor) => transpose(reshape(t, [B, t.shape[1]!, KV, G, hd]), [0, 2, 3, 1, 4]);
  const keys = (t: Tensor) => unsqueeze(transpose(reshape(t, [B, S, KV, hd]), [0, 2, 1, 3]), [2]);
  const fromQueries = (t: Tensor) => reshape(transpose(t, [0, 3, 1, 2, 4]), [B, S, W]);
  // [B, KV, G, s, X] → [B, KV, G·s, X] (free: the G query heads' rows stacked). A product that
  // contracts over these rows — dV = Pᵀ·dO, dK = dSᵀ·Q — then also sums over the G heads that
  // share a KV head, inside the matmul (a separate ReduceSum over that middle axis ran as a cuDNN
  // reduction at 244 µs per call, 14 ms a step at the 0.6B shape, 8 × 1024).
  const stacked = (t: Tensor) => reshape(t, [B, KV, -1, t.shape[4]!]);
  // [B, KV, hd, S] → [B, S, KV·hd]
  const fromKeysTransposed = (t: Tensor) => reshape(transpose(t, [0, 3, 1, 2]), [B, S, KV * hd]);
  const swap = (t: Tensor) => transpose(t, [0, 1, 2, 4, 3]);
  const swap4 = (t: Tensor) => transpose(t, [0, 1, 3, 2]);
  // Query rows in n blocks of b (one Split node each); keys [0, (i + 1)·b) of a [B, KV, ·, S, ·]
  // value for block i (the rest are masked for every query of the block).
  const blocks = (t: Tensor, axis: number) => (n === 1 ? [t] : split(t, new Array<Dim>(n).fill(b), axis));
  const visible = (t: Tensor, i: number) => (i === n - 1 ? t : slice(t, [3], [0], [(i + 1) * (b as number)]));
  const k5 = keys(k!);
  const v5 = keys(v!);

  // Key j is visible to query i when j ≤ i and j < len_b (len_b = seqlens_k[b] + 1). The additive
  // bias (0 or a large negative) comes from the causal mask alone: the key-length mask is implied
  // for every query row that matters, since a query i < len_b sees keys j ≤ i < len_b. Rows past
  // the length (padding) see padding keys, but their dO is 0, so their dS row is 0 and they reach
  // no gradient. A bias of [rows, keys] (not [B, 1, 1, rows, keys]) also gets ONNX Runtime's
  // per-channel broadcast kernel; the batch-shaped one took its general kernel (465 µs a layer at
  // 8 × 1024 on the H100).
  const masked = dt === 'float16' ? -6e4 : -1e9;
  const biases = causalBiasBlocks(q!, S, n, masked);
  const pos = typeof S === 'number' ? q!.graph.constant(Array.from({ length: S }, (_, i) => i + 1), acc, [S]) : reduceSum(cast(causalMask(reshape(slice(q!, [0, 2], [0, 0], [1, 1]), [S]), 0), acc), [1]);
  const last = cast(unsqueeze(seqlens!, [1]), acc); // len_b − 1, [B, 1]
  const valid = lessOrEqual(unsqueeze(pos, [0]), add(last, 1)); // [B, S]: position i < len_b
  const queryValid = reshape(valid, [B, 1, 1, S, 1]);

  const dqs: Tensor[] = [];
  const dks: Tensor[] = [];
  const dvs: Tensor[] = [];
  if (dOut) {
    // The scale goes on q ([S, hd]) rather than on the scores ([S, S]).
    const qScaled = blocks(mul(queries(q!), q!.graph.constant(scale, dt, [])), 3);
    const dO5 = queries(dOut);
    const o5 = where(queryValid, queries(outputs[0]!), q!.graph.constant(0, dt, []));
    const rowDot = cast(reduceSum(mul(cast(dO5, acc), cast(o5, acc)), [-1], true), dt); // D, [B, KV, G, S, 1]
    // dP − D as one product, [dO, −D, 0…]·[V, 1, 0…]ᵀ: the matmul accumulates the difference in
    // float32 and rounds it once, and no broadcast subtract runs over [S, S] (465 µs a layer at
    // 8 × 1024 on the H100). 7 zero columns pad hd + 1 to a multiple of 8 for the tensor cores.
    // They are sliced and scaled rather than made from a Shape: ONNX Runtime turns
    // Shape(Slice(Transpose(…))) into a Gather it runs on the CPU, one per layer (seen on the H100).
    const zeros = (t: Tensor, width: number) => mul(slice(t, [4], [0], [width]), q!.graph.constant(0, dt, []));
    const dOD = blocks(concat([dO5, neg(rowDot), zeros(dO5, 7)], 4), 3); // [B, KV, G, b, hd + 8] each
    const dOs = blocks(dO5, 3);
    const v1 = concat([v5, add(zeros(v5, 1), q!.graph.constant(1, dt, [])), zeros(v5, 7)], 4); // [B, KV, 1, S, hd + 8]
    for (let i = 0; i < n; i++) {
      const ki = visible(k5, i);
      const p = softmax(add(matmul(qScaled[i]!, swap(ki)), biases[i]!), -1); // [B, KV, G, b, visible keys]
      // The products that need an [S, S] operand transposed are formed transposed — (dOᵀ·P)ᵀ,
      // (Qᵀ·dS)ᵀ — so only [S, hd] values are transposed.
      const dS = mul(p, matmul(dOD[i]!, swap(visible(v1, i))));
      dvs.push(matmul(swap4(stacked(dOs[i]!)), stacked(p))); // [B, KV, hd, visible keys]
      dqs.push(matmul(dS, ki)); // [B, KV, G, b, hd]
      dks.push(matmul(swap4(stacked(qScaled[i]!)), stacked(dS))); // [B, KV, hd, visible keys]
    }
  }
  // Key block j's gradient sums the contributions of query blocks j..n−1.
  const keyBlocks = (parts: Tensor[]) => {
    if (n === 1) return parts[0]!;
    // parts[i] covers key blocks 0..i; key block j sums parts[j..n−1]'s block j
    const pieces = parts.map((t, i) => (i === 0 ? [t] : split(t, new Array<Dim>(i + 1).fill(b), 3)));
    const sums = pieces.map((_, j) => pieces.slice(j).map((ps) => ps[j]!).reduce((x, y) => add(x, y)));
    return concat(sums, 3);
  };
  const dq = dOut ? mul(fromQueries(n === 1 ? dqs[0]! : concat(dqs, 3)), q!.graph.constant(scale, dt, [])) : null;
  const dk = dOut ? fromKeysTransposed(keyBlocks(dks)) : null;
  const dv = dOut ? fromKeysTransposed(keyBlocks(dvs)) : null;
  // The present key/value outputs are k and v in [B, KV, S, hd] layout (no cache): their gradients
  // flow straight back.
  const fromPresent = (t: Tensor) => reshape(transpose(t, [0, 2, 1, 3]), [B, S, KV * hd]);
  const plus = (a: Tensor | null, x: Tensor | null | undefined): Tensor | null => (x ? (a ? add(a, fromPresent(x)) : fromPresent(x)) : a);
  return [dq, plus(dk, dPresentKey), plus(dv, dPresentValue), null, null, null, null, null, null];
}

/** Each graph's causal bias blocks, by (S, n, dtype): built once and shared by every layer's rule. */
const causalBiasCache = new WeakMap<object, Map<string, Tensor[]>>();

/**
 * The causal additive bias for the rule's n query blocks: block i is [S/n, (i + 1)·S/n], 0 where
 * key ≤ query and `masked` elsewhere. With a static S it is built from constants (ONNX Runtime
 * folds it when the session is created) and shared by all layers; a symbolic S (one block) reads
 * its length from `like` [B, S, ·] at run time.
 */
function causalBiasBlocks(like: Tensor, S: Dim, n: number, masked: number): Tensor[] {
  const g = like.graph;
  const dt = like.dtype;
  const acc = dt === 'float64' ? 'float64' : 'float32';
  const toBias = (visibleMask: Tensor) => cast(where(visibleMask, g.constant(0, acc, []), g.constant(masked, acc, [])), dt);
  if (typeof S !== 'number') return [toBias(causalMask(reshape(slice(like, [0, 2], [0, 0], [1, 1]), [S]), 0))];
  const key = `${S}|${n}|${dt}|${masked}`;
  const perGraph = causalBiasCache.get(g) ?? new Map<string, Tensor[]>();
  causalBiasCache.set(g, perGraph);
  const cached = perGraph.get(key);
  if (cached) return cached;
  const b = S / n;
  const made = Array.from({ length: n }, (_, i) => {
    const queryPos = g.constant(Array.from({ length: b }, (_, r) => i * b + r), 'int64', [b, 1]);
    const keyPos = g.constant(Array.from({ length: (i + 1) * b }, (_, c) => c), 'int64', [1, (i + 1) * b]);
    return toBias(greaterOrEqual(queryPos, keyPos));
  });
  perGraph.set(key, made);
  return made;
}

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
  heads: { numHeads: number; kvNumHeads: number; gradBlocks?: number },
): { output: Tensor; presentKey: Tensor; presentValue: Tensor } {
  const [output, presentKey, presentValue] = applyOp(
    groupQueryAttentionOp,
    [x.query, x.key, x.value, x.past?.key ?? null, x.past?.value ?? null, x.seqlensK, x.totalSequenceLength, x.rotary?.cos ?? null, x.rotary?.sin ?? null],
    { ...heads, doRotary: !!x.rotary },
  );
  return { output, presentKey, presentValue };
}

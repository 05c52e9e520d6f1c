/**
 * Heads on top of the decoder's hidden states: LM logits, per-token log-probs of given tokens
 * (computed in-graph so full-vocabulary logits never leave the device), scalar value heads and a
 * restricted-vocabulary head over a contiguous id range.
 */
import * as L from '@lathe/onnx';
import type { DType, Tensor } from '@lathe/onnx';
import type { DecoderConfig } from './config';
import { linear, type Weights } from './decoder';
import { accumulationDtype } from './precision';
import { lmHeadName } from './params';

/** Logits [B, T, vocab] in the compute dtype (through the weights' own `matmul` for the head when they supply one, e.g. a quantized head). */
export function lmLogits(cfg: DecoderConfig, w: Weights, hidden: Tensor): Tensor {
  const name = lmHeadName(cfg);
  return w.matmul?.(name, hidden) ?? linear(hidden, w(name));
}

/**
 * A fused log-prob / log-sum-exp / entropy over rows of logits [rows, n] read in their own dtype, with
 * its own gradient rule — Lathe's cross-entropy kernels (`crossEntropyOps(...)` of @lathe/kernels) —
 * in place of the composed float32 cast, LogSoftmax and gather. Results are float32 [rows] of
 * softmax(logits / temperature); a target outside [0, n) gives log-prob 0.
 */
export interface LogprobKernel {
  tokenLogprobs(logits: Tensor, targets: Tensor, opts: { temperature: number; entropy: boolean }): { logp: Tensor; lse: Tensor; entropy?: Tensor };
  rowLogSumExp(logits: Tensor, opts: { temperature: number; entropy: boolean }): { lse: Tensor; entropy?: Tensor };
  /** Why the kernel cannot take logits of `dtype` over `vocab` ids (the head then keeps its composed ops; the kernel counts it), or undefined. */
  unsupported?(dtype: DType, vocab: number): string | undefined;
}

/** `kernel` where it takes `logits` [..., n] (n static), else undefined (the composed ops). */
function kernelFor(kernel: LogprobKernel | undefined, logits: Tensor): LogprobKernel | undefined {
  const n = logits.shape[logits.rank - 1];
  return kernel && typeof n === 'number' && !kernel.unsupported?.(logits.dtype, n) ? kernel : undefined;
}

/**
 * log p(targets) [B, T] under softmax(logits / temperature), in float32: position t scores
 * targets[:, t] (callers shift inputs and targets as they need). With `kernel`, computed by it from
 * the logits as they are (see {@link LogprobKernel}).
 */
export function targetLogprobs(logits: Tensor, targets: Tensor, temperature = 1, kernel?: LogprobKernel): Tensor {
  const k = kernelFor(kernel, logits);
  if (k) {
    // the fused kernel reads the logits in their own dtype: no float32 copy, no LogSoftmax output
    const { logp } = k.tokenLogprobs(L.reshape(logits, [-1, logits.shape[logits.rank - 1] as number]), L.reshape(targets, [-1]), { temperature, entropy: false });
    return targets.shape.every((d) => typeof d === 'number') ? L.reshape(logp, targets.shape) : L.reshapeLike(logp, targets);
  }
  const l = L.cast(logits, accumulationDtype(logits.dtype));
  return L.tokenLogprobs(temperature === 1 ? l : L.div(l, temperature), targets);
}

/** Logits restricted to ids [start, start + count) (e.g. the critic's distribution tokens). */
export function restrictedLogits(cfg: DecoderConfig, w: Weights, hidden: Tensor, start: number, count: number): Tensor {
  if (start < 0 || start + count > cfg.vocabSize) {
    throw new Error(`restricted head: ids [${start}, ${start + count}) fall outside the vocabulary of ${cfg.vocabSize}`);
  }
  const rows = L.slice(w(lmHeadName(cfg)), [0], [start], [start + count]);
  return linear(hidden, rows);
}

/**
 * log-softmax over ids [start, start + count) only, in float32 [B, T, count]: the distribution
 * renormalised over the range (the critic's distribution tokens), whatever the rest of the
 * vocabulary would score.
 */
export function restrictedLogprobs(cfg: DecoderConfig, w: Weights, hidden: Tensor, start: number, count: number): Tensor {
  const logits = restrictedLogits(cfg, w, hidden, start, count);
  return L.logSoftmax(L.cast(logits, accumulationDtype(logits.dtype)), -1);
}

/** A scalar per position: hidden · weight + bias, weight [1, hidden] (HF `score`-style Linear). */
export function valuePerToken(hidden: Tensor, weight: Tensor, bias?: Tensor): Tensor {
  return L.squeeze(linear(hidden, weight, bias), [2]);
}

/**
 * A scalar per row read at its last real token (reward models), [B] in the accumulation dtype
 * (float32; float64 for a float64 model). `padMask` [B, T] is 1 on tokens; rows may be left- or
 * right-padded. The head runs at every token and the last is picked by a one-hot sum (exact: one
 * term is nonzero), not gathered at an index from a Range over the run-time T, which ONNX Runtime
 * computes on the CPU (a CUDA session with CPU fallback off refuses it).
 */
export function valueAtLastToken(hidden: Tensor, padMask: Tensor, weight: Tensor, bias?: Tensor): Tensor {
  const perToken = L.cast(valuePerToken(hidden, weight, bias), accumulationDtype(hidden.dtype));
  return L.reduceSum(L.mul(perToken, L.cast(lastTokenMask(padMask), perToken.dtype)), [1]);
}

/**
 * bool [B, T]: true at each row's last real token (the last position whose mask is 1), for left-
 * or right-padded rows: the token where the running count of tokens reaches the row's total.
 */
export function lastTokenMask(attentionMask: Tensor): Tensor {
  const m = L.cast(attentionMask, 'int64');
  const count = L.cumsum(m, 1);
  return L.and(L.cast(m, 'bool'), L.equal(count, L.reduceSum(m, [1], true)));
}

/**
 * log p(targets) [B, T] in float32 without materialising full-vocabulary logits: the target's
 * logit comes from its own LM-head row, and the log-partition from a log-sum-exp over vocabulary
 * chunks of `chunk` rows. Each chunk's logits are [B, T, chunk], which keeps memory small and every
 * tensor under 2³¹ elements (ONNX Runtime's CUDA kernels index with 32-bit offsets; [16, 1024,
 * 151936] logits would overflow them). `like`: a tensor of the targets' shape that the result's
 * shape is read from instead of the targets' own (ONNX Runtime places a shape computation that starts
 * at a graph input, such as ids gathered from one, on the CPU, which a CUDA session may refuse).
 * `kernel`: each chunk's log-partition by a fused kernel ({@link LogprobKernel}) from its logits in
 * the compute dtype.
 */
export function chunkedTargetLogprobs(
  cfg: DecoderConfig,
  w: Weights,
  hidden: Tensor,
  targets: Tensor,
  opts: { chunk?: number; temperature?: number; recompute?: boolean; like?: Tensor; kernel?: LogprobKernel } = {},
): Tensor {
  const head = vocabularyHead(cfg, w, hidden, targets, opts);
  const kernel = opts.kernel;
  // Each chunk's log-partition in one LogSoftmax pass (rowLogSumExp), not max, subtract, exp, sum;
  // with a kernel, one read of the chunk's logits in the compute dtype (and one in the backward pass).
  const partial = (Wk: Tensor) => {
    const raw = head.rawLogits(Wk);
    const k = kernelFor(kernel, raw);
    return k ? L.unsqueeze(k.rowLogSumExp(raw, { temperature: head.temperature, entropy: false }).lse, [1]) : L.rowLogSumExp(head.scaled(raw)); // [rows, 1]
  };
  // With `recompute`, each chunk's logits are rebuilt in the backward pass (one chunk alive at a
  // time) instead of all chunks' logits being kept from the forward pass for it.
  const partials = head.parts.map((Wk) => (opts.recompute ? L.checkpoint([head.h], () => partial(Wk)) : partial(Wk)));
  return head.like(L.sub(head.targetLogit, L.logSumExp(L.concat(partials, -1), -1)));
}

/**
 * Sizes of the vocabulary chunks for a requested chunk size: equal chunks where a count between
 * ⌈V / chunk⌉ and 32 divides V (151,936 in 16 chunks of 9,496 for chunk 16,384), since ONNX Runtime's
 * CUDA Split and Concat copy per-run index tables from the host for unequal parts (stale under
 * CUDA-graph replay); otherwise chunks of `chunk` and a shorter last one.
 */
export function vocabularyChunks(vocabSize: number, chunk: number): number[] {
  const least = Math.ceil(vocabSize / chunk);
  for (let n = least; n <= Math.max(least, 32); n++) if (vocabSize % n === 0) return new Array<number>(n).fill(vocabSize / n);
  const sizes: number[] = [];
  for (let start = 0; start < vocabSize; start += chunk) sizes.push(Math.min(chunk, vocabSize - start));
  return sizes;
}

/**
 * What the chunked heads share: hidden states as rows [B·T, D], the LM head split into vocabulary
 * chunks, each chunk's logits (raw, and float32 divided by the temperature), the targets' own logits [rows]
 * from their LM-head rows, and the reshape of a [rows] result back to the targets' shape.
 */
function vocabularyHead(cfg: DecoderConfig, w: Weights, hidden: Tensor, targets: Tensor, opts: { chunk?: number; temperature?: number; like?: Tensor }) {
  const chunk = opts.chunk ?? 16384;
  const temperature = opts.temperature ?? 1;
  const acc = accumulationDtype(hidden.dtype);
  const W = w(lmHeadName(cfg));
  const scale = (t: Tensor) => (temperature === 1 ? t : L.div(t, temperature));
  // Tokens as rows, [B·T, D]: the per-row [rows, 1] max and sums then broadcast with ONNX Runtime's
  // per-channel kernels, where [B, T, 1] (two non-1 dims) takes its general broadcast kernel.
  const h = L.reshape(hidden, [-1, hidden.shape[hidden.rank - 1]!]);
  const rows = L.gather(W, L.cast(L.reshape(targets, [-1]), 'int64'), 0); // [rows, D]
  const sizes = vocabularyChunks(cfg.vocabSize, chunk);
  return {
    h,
    parts: sizes.length === 1 ? [W] : L.split(W, sizes, 0),
    /** A chunk's logits [rows, chunk] as the matmul gives them (compute dtype, temperature not applied): a kernel's input. */
    rawLogits: (Wk: Tensor) => linear(h, Wk),
    /** A chunk's raw logits in float32, divided by the temperature: the composed ops' input. */
    scaled: (raw: Tensor) => scale(L.cast(raw, acc)),
    temperature,
    targetLogit: scale(L.reduceSum(L.mul(L.cast(h, acc), L.cast(rows, acc)), [1])),
    like: (t: Tensor) => (targets.shape.every((d) => typeof d === 'number') ? L.reshape(t, targets.shape) : L.reshapeLike(t, opts.like ?? targets)),
  };
}

/**
 * log p(targets) and the entropy, both [B, T] in float32, under softmax(hidden·Wᵀ / temperature),
 * from one pass over each vocabulary chunk's logits (computed once for both). Per chunk k one
 * LogSoftmax gives y = l − lse_k, so lse_k = l₀ − y₀ and the entropy within the chunk is
 * H_k = −Σ exp(y)·y; with log Z = logsumexp_k lse_k and w_k = exp(lse_k − log Z) (the chunk's
 * probability mass), the entropy is Σ_k w_k·(H_k − log w_k) and log p = target logit − log Z.
 * Differentiable; with `recompute` each chunk's logits are rebuilt in the backward pass, one chunk
 * alive at a time. For log-probs alone {@link chunkedTargetLogprobs} keeps less for the backward pass.
 * `kernel`: each chunk's lse_k and H_k by a fused kernel ({@link LogprobKernel}) in one read of its logits.
 */
export function chunkedLogprobsAndEntropy(
  cfg: DecoderConfig,
  w: Weights,
  hidden: Tensor,
  targets: Tensor,
  opts: { chunk?: number; temperature?: number; recompute?: boolean; kernel?: LogprobKernel } = {},
): { logp: Tensor; entropy: Tensor } {
  const head = vocabularyHead(cfg, w, hidden, targets, opts);
  const kernel = opts.kernel;
  // [rows, 2] per chunk: its log-partition lse_k and its within-chunk entropy H_k.
  const perChunk = (Wk: Tensor) => {
    const raw = head.rawLogits(Wk);
    const k = kernelFor(kernel, raw);
    if (k) {
      const r = k.rowLogSumExp(raw, { temperature: head.temperature, entropy: true });
      return L.concat([L.unsqueeze(r.lse, [1]), L.unsqueeze(r.entropy!, [1])], 1);
    }
    const l = head.scaled(raw);
    const y = L.logSoftmax(l, -1);
    const first = (t: Tensor) => L.slice(t, [1], [0], [1]);
    const within = L.neg(L.reduceSum(L.mul(L.exp(y), y), [1], true));
    return L.concat([L.sub(first(l), first(y)), within], 1);
  };
  const stats = head.parts.map((Wk) => (opts.recompute ? L.checkpoint([head.h], () => perChunk(Wk)) : perChunk(Wk)));
  const pick = (j: number) => L.concat(stats.map((s) => L.slice(s, [1], [j], [j + 1])), 1); // [rows, chunks]
  const lse = pick(0);
  const logZ = L.logSumExp(lse, -1, true); // [rows, 1]
  const logMass = L.sub(lse, logZ);
  const entropy = L.reduceSum(L.mul(L.exp(logMass), L.sub(pick(1), logMass)), [1]);
  return { logp: head.like(L.sub(head.targetLogit, L.squeeze(logZ, [1]))), entropy: head.like(entropy) };
}

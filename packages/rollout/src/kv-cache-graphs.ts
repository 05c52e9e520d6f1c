/**
 * The two graphs of generation as a loop of runs over a KV cache that stays bound on the device
 * (the runtime layer's IoBinding), both built on ONNX Runtime's GroupQueryAttention:
 *
 * - **prefill**: B right-padded prompts → their keys/values, repeated for the group (row r of the
 *   cache holds prompt expand_index[r]) and extended to the cache length M (by a slice of a bound
 *   zero buffer: Pad has no bfloat16 CUDA kernel, and computing pad amounts from shapes would put
 *   nodes on the CPU), written straight into the bound cache buffers; and the first sampled token
 *   of every row.
 * - **decode step**: one token per row → the next one. Each layer's cache is bound as both its
 *   past input and its present output, so GroupQueryAttention appends the new key/value in place
 *   (no cache copies) and attends over each row's own length. The step's bookkeeping (the next
 *   position per row, the step counter that picks the noise column) is computed in the graph, so
 *   a step needs no host input: two bindings over swapped token/position buffers ("ping-pong")
 *   alternate, and each can be replayed as a CUDA graph.
 *
 * Row lengths live in `seqlens` (int32 [R], the GroupQueryAttention convention: the index of each
 * row's newest token). Each step's result is also written into a `history` of the last K steps
 * (column step mod K), carried through the ping-pong buffers like the token, so the host can read K
 * steps' results in one copy and queue the runs in between without waiting for them. Graph inputs
 * and outputs (beyond the weights, named by their HF names):
 *
 *   prefill  in:  input_ids int64 [B, P] (right-padded), seqlens int32 [B] (prompt length − 1),
 *                 last_index int64 [B] (= b·P + seqlens[b]: each prompt's last token in the
 *                 flattened batch, from the host so no shape arithmetic lands on the CPU),
 *                 prompt_width int32 [] (= P, host), cache_start int64 [1] (= P, host),
 *                 cache_tail [R, KV, M, hd] (zeros, device), expand_index int64 [R],
 *                 noise float32 [R, N] (when sampling)
 *            out: present.{i}.key / present.{i}.value [R, KV, M, hd], next_token int64 [R, 1],
 *                 next_seqlens int32 [R], next_step int64 [1], next_history float32 [R, K, 3]
 *                 (step 0's result in column 0, zeros elsewhere)
 *   decode   in:  token int64 [R, 1], seqlens int32 [R], step int64 [1], noise float32 [R, N],
 *                 history float32 [R, K, 3], cache_length int32 [] (= M, host), cache.{i}.key /
 *                 value (bound in place)
 *            out: the same outputs as prefill, present.{i}.key / value bound to the cache buffers,
 *                 next_history = history with column (step mod K) replaced by this step's result
 *
 * A step's result packs what the host reads into one row per sample, so a read costs one
 * device→host copy rather than one per result: the token id (exact in float32, as ids are below
 * 2²⁴), its log-prob under the sampling distribution and under the raw model. `next_token` carries
 * the same ids as int64 for the next step's input and stays on the device.
 */
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import { decoder, lmLogits, type DecoderConfig, type KvPair, type Weights } from '@lathe/models';
import { sampleNext, type SamplingOptions } from './sampling';

/** Name of layer i's key or value cache: `cache.*` as a decode input, `present.*` as an output. */
export function cacheName(i: number, which: 'key' | 'value', as: 'input' | 'output'): string {
  return `${as === 'input' ? 'cache' : 'present'}.${i}.${which}`;
}

/** Columns of a step's result in the history, per row. */
export const SAMPLED_COLUMNS = ['token', 'logprob', 'raw_logprob'] as const;

/**
 * Samples the next token and writes `next_token` and `next_history`: `history` [R, K, 3] (zeros
 * when absent) with column (step mod K) replaced by this step's [token, logprob, raw_logprob].
 */
function emitStep(g: Graph, cfg: DecoderConfig, weights: Weights, lastHidden: Tensor, noiseColumn: Tensor | undefined, opts: SamplingOptions, at: { step: Tensor; history?: Tensor; K: number }, expand?: Tensor): void {
  if (cfg.vocabSize >= 2 ** 24) throw new Error(`KV-cache generation: vocab_size ${cfg.vocabSize} ≥ 2²⁴: token ids would not be exact in the float32 history`);
  let logits = L.cast(L.squeeze(lmLogits(cfg, weights, lastHidden), [1]), 'float32'); // [rows, V]
  if (expand) logits = L.gather(logits, expand, 0);
  const s = sampleNext(logits, opts, noiseColumn);
  g.output(L.unsqueeze(s.tokens, [1]), 'next_token');
  const column = (t: Tensor) => L.unsqueeze(t, [1]);
  const result = L.unsqueeze(L.concat([column(L.cast(s.tokens, 'float32')), column(s.logprobs), column(s.rawLogprobs)], 1), [1]); // [R, 1, 3]
  const slot = L.mod(at.step, g.constant(at.K, 'int64', [])); // [1]
  const here = L.unsqueeze(L.equal(g.constant(Array.from({ length: at.K }, (_, i) => i), 'int64', [at.K]), slot), [0, 2]); // [1, K, 1]
  g.output(L.where(here, result, at.history ?? g.constant(0, 'float32', [])), 'next_history');
}

const sampling = (o: SamplingOptions) => (o.temperature ?? 1) !== 0;

/** How the two graphs are built beyond the model and sampling. */
export interface KvGraphOptions {
  /** The history's width: steps per host read. */
  K: number;
  /** Qwen3's Q/K norm inside GroupQueryAttention's kernel (CUDA only; see `GqaDecoderInputs`). */
  qkNormInKernel?: boolean;
  /**
   * The engine's row count, when fixed: the graphs' R is then a static dim, which lets top-p without
   * a two-stage top-k sort all rows at once (`nucleusOneSort` in sampling.ts). Default: symbolic.
   */
  rows?: number;
}

/** The prefill graph (see the module comment). */
export function addKvPrefill(g: Graph, cfg: DecoderConfig, weights: Weights, dtype: DType, opts: SamplingOptions, { K, qkNormInKernel, rows }: KvGraphOptions): void {
  const R = rows ?? 'R';
  const ids = g.input('input_ids', 'int64', ['B', 'P']);
  const seqlens = g.input('seqlens', 'int32', ['B']);
  const lastIndex = g.input('last_index', 'int64', ['B']);
  const width = g.input('prompt_width', 'int32', []);
  const cacheStart = g.input('cache_start', 'int64', [1]);
  const zeros = g.input('cache_tail', dtype, [R, cfg.numKvHeads, 'M', cfg.headDim]);
  const expand = g.input('expand_index', 'int64', [R]);
  const noise = sampling(opts) ? g.input('noise', 'float32', [R, 'N']) : undefined;

  const out = decoder(cfg, weights, { inputIds: ids, seqlensK: seqlens, totalSequenceLength: width, qkNormInKernel });
  const axis = g.constant([2], 'int64', [1]);
  const spec = { axes: [2], starts: ['P'], ends: [Number.MAX_SAFE_INTEGER], steps: [1] };
  const tail = L.applyOp(L.sliceOp, [zeros, cacheStart, g.constant([Number.MAX_SAFE_INTEGER], 'int64', [1]), axis, g.constant([1], 'int64', [1])], spec)[0];
  out.present.forEach((p, i) => {
    for (const which of ['key', 'value'] as const) {
      g.output(L.concat([L.gather(p[which], expand, 0), tail], 2), cacheName(i, which, 'output'));
    }
  });
  const last = L.unsqueeze(L.gather(L.reshape(out.hidden, [-1, cfg.hiddenSize]), lastIndex, 0), [1]); // [B, 1, D]
  emitStep(g, cfg, weights, last, noise && L.squeeze(L.slice(noise, [1], [0], [1]), [1]), opts, { step: g.constant([0], 'int64', [1]), K }, expand);
  g.output(L.add(L.gather(seqlens, expand, 0), g.constant(1, 'int32', [])), 'next_seqlens');
  g.output(g.constant([1], 'int64', [1]), 'next_step');
}

/** The decode-step graph (see the module comment). */
export function addKvDecodeStep(g: Graph, cfg: DecoderConfig, weights: Weights, dtype: DType, opts: SamplingOptions, { K, qkNormInKernel, rows }: KvGraphOptions): void {
  const R = rows ?? 'R';
  const token = g.input('token', 'int64', [R, 1]);
  const seqlens = g.input('seqlens', 'int32', [R]);
  const step = g.input('step', 'int64', [1]);
  const history = g.input('history', 'float32', [R, K, SAMPLED_COLUMNS.length]);
  const noise = sampling(opts) ? g.input('noise', 'float32', [R, 'N']) : undefined;
  const cacheLength = g.input('cache_length', 'int32', []);
  const past: KvPair[] = [];
  for (let i = 0; i < cfg.numLayers; i++) {
    const shape = [R, cfg.numKvHeads, 'M', cfg.headDim];
    past.push({ key: g.input(cacheName(i, 'key', 'input'), dtype, shape), value: g.input(cacheName(i, 'value', 'input'), dtype, shape) });
  }
  const out = decoder(cfg, weights, { inputIds: token, seqlensK: seqlens, totalSequenceLength: cacheLength, past, qkNormInKernel });
  out.present.forEach((p, i) => {
    g.output(p.key, cacheName(i, 'key', 'output'));
    g.output(p.value, cacheName(i, 'value', 'output'));
  });
  emitStep(g, cfg, weights, out.hidden, noise && L.squeeze(L.gather(noise, step, 1), [1]), opts, { step, history, K });
  g.output(L.add(seqlens, g.constant(1, 'int32', [])), 'next_seqlens');
  g.output(L.add(step, g.constant(1, 'int64', [])), 'next_step');
}

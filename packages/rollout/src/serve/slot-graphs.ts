/**
 * The two graphs of the slot engine (slot-engine.ts), for continuous batching: a fixed set of cache
 * rows ("slots") that requests enter and leave one at a time while the others keep decoding.
 *
 * - **slot prefill**: B right-padded prompts → their keys/values written into the slots the host
 *   names (`scatter_index`), each prompt into as many slots as it has samples (`expand_index`),
 *   with every other slot's cache left as it is: each layer's cache is bound as both an input and
 *   the output of a ScatterND, which writes in place when the two are one buffer (ONNX Runtime
 *   copies the input first only when they differ). Only the prompt's P positions are written; what
 *   an earlier occupant left beyond them is never attended, since attention reads each row's own
 *   length. Also samples each new row's first token.
 * - **slot decode step**: one token per slot → the next one, every slot at its own position
 *   (`seqlens`), sampled with its own temperature, top-k, top-p and min-p and its own uniform. A
 *   free slot runs too (its result is dropped): the step's shapes never change.
 *
 * Unlike the batch engine's step (kv-cache-graphs.ts), nothing is carried from step to step on the
 * device but the caches: the host knows each slot's token and position and uploads them with the
 * step's parameters (a few numbers per slot), since admissions and departures change them between
 * any two steps.
 *
 *   prefill in:  input_ids int64 [B, P], seqlens int32 [B] (prompt length − 1), last_index int64
 *                [B] (b·P + seqlens[b]), prompt_width int32 [] (= P), expand_index int64 [E] (the
 *                prompt each new row continues), scatter_index int64 [E, KV, P, 3] (slot, head,
 *                position of each written cache vector), temperature / top_p / min_p float32 [E],
 *                top_k int64 [E], uniform float32 [E], cache.{i}.key / value [S, KV, M, hd]
 *          out: present.{i}.key / value (bound to the cache buffers), sampled float32 [E, 3]
 *               (token, log-prob under the row's sampling distribution, raw log-prob), and with
 *               top log-probs T > 0: top_logprobs float32 [E, T], top_ids int64 [E, T]
 *   decode  in:  step float32 [S, 7] (columns: token, its position, temperature, top_k, top_p,
 *                min_p, uniform — one upload a step, since each host→device copy costs a round trip
 *                while the GPU waits; ids, positions and top_k are exact in float32 below 2²⁴),
 *                cache_length int32 [] (= M), cache.{i}.key / value
 *          out: as prefill, over [S]
 *   both, with concatProjections: concat.<group>.weight / bias (the pack graph's, kv-cache-graphs.ts)
 *   both, with an e4m3 cache (`decodeAttention` built for float8e4m3): the caches are uint8 and each
 *                layer's scales cache.{i}.key_scale / value_scale float32 [S, KV, M] come in and go
 *                out as present.{i}.*_scale; the prefill quantizes its keys/values (`quantize`) and
 *                scatters bytes and scales with the same index.
 *
 * The decode step's layers are the batch engine's: GroupQueryAttention through `decoder`, or Lathe's
 * decode attention kernel through `kvKernelDecoder`, with the same residual dtype, SwiGLU kernel and
 * packed projections; each slot is a cache row whose `seqlens` is its own position, which is the
 * kernel's contract for ragged rows.
 */
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import { decoder, lmLogits, type DecoderConfig, type KvPair, type Weights } from '@lathe/models';
import { cacheName, cacheScaleName, kvKernelDecoder, withConcatProjections, type KvGraphOptions } from '../kv-cache-graphs';
import { sampleNext, sampleNextPerRow, type RowFilterMode, type RowSamplingInputs } from '../sampling';

/**
 * How a slot graph is built beyond the model: with the batch engine's decode options
 * (`decodeAttention`, `residualDtype`, `swiglu`, `concatProjections`; see {@link KvGraphOptions}).
 */
export interface SlotGraphOptions extends Pick<KvGraphOptions, 'decodeAttention' | 'residualDtype' | 'swiglu' | 'concatProjections'> {
  /** The slot count S of a decode step (static, so its shapes never change; the engine may run a step over its leading slots). */
  slots: number;
  /** How top-k and top-p are applied ({@link RowFilterMode}: none, among the capped largest values, or by a full sort). */
  filters: RowFilterMode;
  /** Alternatives per row to output with their raw log-probs (0: none). */
  topLogprobs: number;
  /** Every row has temperature 1 or 0 and no filter: the sampler's cheaper graph (see `sampleNextPerRow`). */
  plain?: boolean;
  /**
   * Every row samples at temperature 1 with no filter (none greedy): the batch engine's sampling
   * graph (`sampleNext`), the same tokens and log-probs as the plain one without its argmax pass
   * over the vocabulary. The per-row sampling inputs are then unread.
   */
  sampled?: boolean;
  /** Qwen3's Q/K norm inside GroupQueryAttention's kernel (CUDA only). */
  qkNormInKernel?: boolean;
}

function samplingInputs(g: Graph, rows: number | string): { params: RowSamplingInputs; uniform: Tensor } {
  return {
    params: {
      temperature: g.input('temperature', 'float32', [rows]),
      topK: g.input('top_k', 'int64', [rows]),
      topP: g.input('top_p', 'float32', [rows]),
      minP: g.input('min_p', 'float32', [rows]),
    },
    uniform: g.input('uniform', 'float32', [rows]),
  };
}

/** Samples each row's next token from hidden states [N, 1, D] and writes the result outputs. */
function emit(g: Graph, cfg: DecoderConfig, weights: Weights, hidden: Tensor, params: RowSamplingInputs, uniform: Tensor, o: SlotGraphOptions, expand?: Tensor): void {
  if (cfg.vocabSize >= 2 ** 24) throw new Error(`slot engine: vocab_size ${cfg.vocabSize} ≥ 2²⁴: token ids would not be exact in float32`);
  let logits = L.cast(L.squeeze(lmLogits(cfg, weights, hidden), [1]), 'float32'); // [N, V]
  if (expand) logits = L.gather(logits, expand, 0);
  if (o.sampled && o.filters !== 'none') throw new Error(`slot graphs: sampled rows take no top-k/top-p, got filters '${o.filters}'`);
  const s = o.sampled ? sampleNext(logits, { temperature: 1 }, uniform) : sampleNextPerRow(logits, params, uniform, o.filters, o.plain ?? false);
  const column = (t: Tensor) => L.unsqueeze(t, [1]);
  g.output(L.concat([column(L.cast(s.tokens, 'float32')), column(s.logprobs), column(s.rawLogprobs)], 1), 'sampled');
  if (o.topLogprobs > 0) {
    const [values, ids] = L.topK(L.logSoftmax(logits, 1), o.topLogprobs, -1);
    g.output(values, 'top_logprobs');
    g.output(ids, 'top_ids');
  }
}

/** Each layer's cache inputs [S, KV, M, hd] in the cache's dtype (uint8 for e4m3). */
function cacheInputs(g: Graph, cfg: DecoderConfig, dtype: DType, o: SlotGraphOptions): KvPair[] {
  const cacheDtype = o.decodeAttention ? o.decodeAttention.cacheDtype(dtype) : dtype;
  const past: KvPair[] = [];
  for (let i = 0; i < cfg.numLayers; i++) {
    const shape = [o.slots, cfg.numKvHeads, 'M', cfg.headDim];
    past.push({ key: g.input(cacheName(i, 'key', 'input'), cacheDtype, shape), value: g.input(cacheName(i, 'value', 'input'), cacheDtype, shape) });
  }
  return past;
}

/** Whether the slot graphs hold an e4m3 cache (uint8 bytes with per-vector scales). */
const e4m3 = (o: SlotGraphOptions): boolean => o.decodeAttention?.cache === 'float8e4m3';

/** `weights` reading the pack graph's concatenated projections under `concatProjections`. */
function slotWeights(g: Graph, cfg: DecoderConfig, weights: Weights, dtype: DType, o: SlotGraphOptions): Weights {
  return o.concatProjections ? withConcatProjections(g, cfg, weights, dtype) : weights;
}

/** The slot prefill graph (see the module comment). */
export function addSlotPrefill(g: Graph, cfg: DecoderConfig, weights: Weights, dtype: DType, o: SlotGraphOptions): void {
  const ids = g.input('input_ids', 'int64', ['B', 'P']);
  const seqlens = g.input('seqlens', 'int32', ['B']);
  const lastIndex = g.input('last_index', 'int64', ['B']);
  const width = g.input('prompt_width', 'int32', []);
  const expand = g.input('expand_index', 'int64', ['E']);
  const scatter = g.input('scatter_index', 'int64', ['E', cfg.numKvHeads, 'P', 3]);
  const { params, uniform } = samplingInputs(g, 'E');
  const caches = cacheInputs(g, cfg, dtype, o);
  weights = slotWeights(g, cfg, weights, dtype, o);
  const out = decoder(cfg, weights, { inputIds: ids, seqlensK: seqlens, totalSequenceLength: width, qkNormInKernel: o.qkNormInKernel, residualDtype: o.residualDtype, swigluKernel: o.swiglu?.apply });
  const scaleShape = [o.slots, cfg.numKvHeads, 'M'];
  out.present.forEach((p, i) => {
    for (const which of ['key', 'value'] as const) {
      const written = L.gather(p[which], expand, 0); // [E, KV, P, hd]
      if (!e4m3(o)) {
        g.output(L.scatterND(caches[i][which], scatter, written), cacheName(i, which, 'output'));
        continue;
      }
      // bytes [E, KV, P, hd] and scales [E, KV, P]: the same (slot, head, position) index addresses both
      const q = o.decodeAttention!.quantize(written);
      g.output(L.scatterND(caches[i][which], scatter, q.data), cacheName(i, which, 'output'));
      g.output(L.scatterND(g.input(cacheScaleName(i, which, 'input'), 'float32', scaleShape), scatter, q.scale), cacheScaleName(i, which, 'output'));
    }
  });
  const last = L.unsqueeze(L.gather(L.reshape(out.hidden, [-1, cfg.hiddenSize]), lastIndex, 0), [1]); // [B, 1, D]
  emit(g, cfg, weights, last, params, uniform, o, expand);
}

/** The columns of the decode step's packed `step` input, in order. */
export const STEP_ROWS = ['token', 'position', 'temperature', 'top_k', 'top_p', 'min_p', 'uniform'] as const;

/** The slot decode-step graph (see the module comment). */
export function addSlotDecodeStep(g: Graph, cfg: DecoderConfig, weights: Weights, dtype: DType, o: SlotGraphOptions): void {
  const S = o.slots;
  const step = g.input('step', 'float32', [S, STEP_ROWS.length]);
  const row = (name: (typeof STEP_ROWS)[number]) => L.gather(step, g.constant(STEP_ROWS.indexOf(name), 'int64', []), 1); // [S]
  const token = L.unsqueeze(L.cast(row('token'), 'int64'), [1]);
  const seqlens = L.cast(row('position'), 'int32');
  const cacheLength = g.input('cache_length', 'int32', []);
  const params: RowSamplingInputs = { temperature: row('temperature'), topK: L.cast(row('top_k'), 'int64'), topP: row('top_p'), minP: row('min_p') };
  const uniform = row('uniform');
  const past = cacheInputs(g, cfg, dtype, o);
  weights = slotWeights(g, cfg, weights, dtype, o);
  const layers = { residualDtype: o.residualDtype, swigluKernel: o.swiglu?.apply };
  const out: { present: KvPair[]; hidden: Tensor; scales?: KvPair[] } = o.decodeAttention
    ? kvKernelDecoder(g, cfg, weights, dtype, { token, seqlens, past, R: S, ...layers }, o.decodeAttention)
    : decoder(cfg, weights, { inputIds: token, seqlensK: seqlens, totalSequenceLength: cacheLength, past, qkNormInKernel: o.qkNormInKernel, ...layers });
  out.present.forEach((p, i) => {
    g.output(p.key, cacheName(i, 'key', 'output'));
    g.output(p.value, cacheName(i, 'value', 'output'));
    const sc = out.scales?.[i];
    if (sc) {
      g.output(sc.key, cacheScaleName(i, 'key', 'output'));
      g.output(sc.value, cacheScaleName(i, 'value', 'output'));
    }
  });
  emit(g, cfg, weights, out.hidden, params, uniform, o);
}

/**
 * The generation graph: a left-padded batch of prompts → completions in one ONNX Runtime run.
 * Prefill computes the prompt's keys/values and the last position's logits once per prompt; the
 * rows are then repeated for the group (n samples per prompt share one prefill) and an ONNX Loop
 * samples a token, records it, and runs one decoder step on it, carrying the logits, the KV cache
 * (grown by concatenation), the key mask, the next position and the per-row done flags. The loop
 * stops early once every row has emitted a stop token.
 *
 * Inputs:  input_ids int64 [B, P] (left-padded), attention_mask int64 [B, P], max_new_tokens int64
 *          [], stop_ids int64 [E] (E ≥ 1; pass [-1] for none), when sampling noise float32
 *          [B·n, N ≥ max_new_tokens] (one uniform per row and step, see rng.ts), plus the weights.
 * Outputs: tokens int64 [B·n, N], logprobs / raw_logprobs float32 [B·n, N] (0 after the end),
 *          lengths int64 [B·n] (tokens up to and including the stop token), stopped bool [B·n].
 *          N ≤ max_new_tokens is the number of steps run. Row r·n + j is sample j of prompt r.
 * With `expandIndexInput` the rows come from the host instead: input expand_index int64 [R] (row k
 * continues prompt expand_index[k]), and every [B·n] above is [R] — prompts may then have different
 * sample counts in one run, each still prefilled once.
 */
import * as L from '@lathe/onnx';
import type { Graph, Tensor } from '@lathe/onnx';
import { decoder, lmLogits, paddedCausalMask, positionsFromPadding, type DecoderConfig, type KvPair, type Weights } from '@lathe/models';
import { sampleNext, validateSampling, type SamplingOptions } from './sampling';

/** Compile-time options of a generation graph. */
export interface GenerationGraphOptions extends SamplingOptions {
  /** Samples per prompt (a GRPO group). Default 1. */
  groupSize?: number;
  /**
   * Read the group expansion from a host input `expand_index` int64 [R] (row k samples prompt
   * expand_index[k]) instead of repeating every prompt groupSize times, so one compiled graph
   * serves runs whose prompts have different sample counts. groupSize must then be 1. Default false.
   */
  expandIndexInput?: boolean;
  /** Token written after a row has stopped. Default 0. */
  padTokenId?: number;
  /** Use ONNX Runtime's fused RMSNorm and RoPE kernels (default true; false: primitives only). */
  fusedKernels?: boolean;
}

/** Row indices 0..B-1 as int64 [B, 1], computed from the values of `like` [B, …] (no Shape op). */
function rowIndex(like: Tensor): Tensor {
  const column = L.slice(L.reshape(like, [like.shape[0], -1]), [1], [0], [1]); // [B, 1]
  const ones = L.add(L.mul(L.cast(column, 'int64'), 0), 1);
  return L.sub(L.cumsum(ones, 0), 1);
}

/** Repeats each row n times along axis 0: [B, …] → [B·n, …] (rows r·n … r·n+n−1 copy row r). */
function repeatRows(x: Tensor, index: Tensor): Tensor {
  return L.gather(x, index, 0);
}

/**
 * Adds the generation computation to `g`, whose weights come from `weights` (graph inputs or
 * initializers) in compute dtype `dtype`. Declares the inputs and outputs listed above.
 */
export function addGeneration(g: Graph, cfg: DecoderConfig, weights: Weights, opts: GenerationGraphOptions = {}): void {
  validateSampling(opts, cfg.vocabSize);
  const n = opts.groupSize ?? 1;
  if (!Number.isInteger(n) || n < 1) throw new Error(`group size must be a positive integer, got ${opts.groupSize}`);
  if (opts.expandIndexInput && n !== 1) throw new Error(`expandIndexInput takes the rows from expand_index: groupSize must be 1, got ${n}`);
  const pad = opts.padTokenId ?? 0;

  const inputIds = g.input('input_ids', 'int64', ['B', 'P']);
  const promptMask = g.input('attention_mask', 'int64', ['B', 'P']);
  const maxNew = g.input('max_new_tokens', 'int64', []);
  const stopIds = g.input('stop_ids', 'int64', ['E']);
  const rowsDim = opts.expandIndexInput ? 'R' : n === 1 ? 'B' : `B*${n}`;
  const hostExpand = opts.expandIndexInput ? g.input('expand_index', 'int64', ['R']) : undefined;
  const noise = (opts.temperature ?? 1) === 0 ? undefined : g.input('noise', 'float32', [rowsDim, 'N']);

  // Prefill: every prompt position, logits at the last one only (prompts are left-padded).
  const fused = opts.fusedKernels ?? true;
  const prefill = decoder(cfg, weights, {
    inputIds,
    positionIds: positionsFromPadding(promptMask),
    attentionMask: paddedCausalMask(promptMask),
    fused,
  });
  const lastHidden = L.slice(prefill.hidden, [1], [-1], [Number.MAX_SAFE_INTEGER]);
  const firstLogits = L.cast(L.squeeze(lmLogits(cfg, weights, lastHidden), [1]), 'float32'); // [B, V]
  const firstPosition = L.reduceSum(promptMask, [1], true); // [B, 1]: the next token's position

  // Group expansion: sample j of prompt r is row r·n + j (or row k continues prompt expand_index[k]).
  const expandIndex = hostExpand ?? (n === 1 ? undefined : L.reshape(L.add(rowIndex(inputIds), g.constant(new Array(n).fill(0), 'int64', [1, n])), [rowsDim]));
  const rep = (t: Tensor) => (expandIndex ? repeatRows(t, expandIndex) : t);
  const kvInit = prefill.present.flatMap((p) => [rep(p.key), rep(p.value)]);
  const doneInit = L.cast(L.mul(rep(firstPosition), 0), 'bool'); // [B·n, 1] all false
  const init = [rep(firstLogits), L.squeeze(doneInit, [1]), rep(firstPosition), rep(promptMask), ...kvInit];
  const R = init[0].shape[0];
  const kvShape = [R, cfg.numKvHeads, 'S', cfg.headDim];
  const carriedShapes = [init[0].shape, [R], [R, 1], [R, 'S'], ...kvInit.map(() => kvShape)];

  const [, stopped, , , ...rest] = L.loop(
    init,
    (step, [logits, done, position, keyMask, ...kv]) => {
      const s = sampleNext(logits, opts, noise && L.gather(noise, step, 1));
      const active = L.not(done);
      const token = L.where(active, s.tokens, g.constant(pad, 'int64', []));
      const isStop = L.greater(L.reduceMax(L.cast(L.equal(L.unsqueeze(token, [1]), stopIds), 'int64'), [1]), g.constant(0, 'int64', []));
      const nowDone = L.or(done, L.and(active, isStop));
      // One decoder step on the sampled token; rows already done compute too (their output is unused).
      const mask = L.concat([keyMask, L.add(L.mul(position, 0), 1)], 1);
      const past: KvPair[] = [];
      for (let i = 0; i < cfg.numLayers; i++) past.push({ key: kv[2 * i], value: kv[2 * i + 1] });
      const out = decoder(cfg, weights, {
        inputIds: L.unsqueeze(token, [1]),
        positionIds: position,
        attentionMask: L.unsqueeze(L.cast(mask, 'bool'), [1, 2]),
        past,
        fused,
      });
      const nextLogits = L.cast(L.squeeze(lmLogits(cfg, weights, out.hidden), [1]), 'float32');
      const allDone = L.equal(L.reduceMin(L.cast(nowDone, 'int64'), [0]), g.constant(1, 'int64', []));
      return {
        cond: L.not(allDone),
        carried: [nextLogits, nowDone, L.add(position, 1), mask, ...out.present.flatMap((p) => [p.key, p.value])],
        scans: [token, L.where(active, s.logprobs, 0), L.where(active, s.rawLogprobs, 0), L.cast(active, 'int64')],
      };
    },
    { maxTrips: maxNew, carriedShapes },
  );
  const scans = rest.slice(kvInit.length);
  const [tokens, logprobs, rawLogprobs, activeSteps] = scans.map((t) => L.transpose(t, [1, 0]));
  g.output(tokens, 'tokens');
  g.output(logprobs, 'logprobs');
  g.output(rawLogprobs, 'raw_logprobs');
  g.output(L.reduceSum(activeSteps, [1]), 'lengths');
  g.output(stopped, 'stopped');
}

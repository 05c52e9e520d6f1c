/**
 * What the preference recipes (`runRmTrain`, `runDpo`, `runRmEval`) share between their loops: one
 * optimizer step's pairs as micro-batch feeds, and scoring pairs in chunks.
 */
import { pairBatch, pairFeeds, type PairBatch, type PreferencePair } from '@lathe/reward-models';
import { LORA_DROPOUT_KEY, loraDropoutKey, type BatchTensor } from '@lathe/train';

/**
 * The feeds of one optimizer step over `pairs`, split into `microBatches` equal micro-batches; each
 * loss is normalised by the whole step's pair count, so the micro-batches add up to the step.
 * `extra(k, pairs)` adds inputs of micro-batch k beyond the pair batch (DPO's reference log-probs);
 * a LoRA dropout key is added when the loss reads one.
 */
export function pairStepFeeds(
  pairs: readonly PreferencePair[],
  o: {
    microBatches: number;
    padId: number;
    inputs: readonly string[];
    seed: number;
    optimizerStep: number;
    extra?: (k: number, pairs: readonly PreferencePair[]) => Record<string, BatchTensor>;
    /** Pairs in the whole optimizer batch, which the loss is normalised by (default `pairs.length`; a data-parallel rank's share is smaller). */
    pairCount?: number;
    /** Index of the first micro-batch in the whole optimizer batch (a data-parallel rank's), for LoRA dropout's keys. */
    microOffset?: number;
  },
): Record<string, BatchTensor>[] {
  const per = pairs.length / o.microBatches;
  return Array.from({ length: o.microBatches }, (_, k) => {
    const part = pairs.slice(k * per, (k + 1) * per);
    const extra = {
      ...(o.extra ? o.extra(k, part) : {}),
      // LoRA dropout's masks: a function of (seed, optimizer step, micro-batch), so a resume redraws them
      ...(o.inputs.includes(LORA_DROPOUT_KEY) ? { [LORA_DROPOUT_KEY]: loraDropoutKey(o.seed, o.optimizerStep, (o.microOffset ?? 0) + k) } : {}),
    };
    return pairFeeds(pairBatch(part, { padId: o.padId, pairCount: o.pairCount ?? pairs.length }), o.inputs, extra);
  });
}

/** Applies `score` to `pairs` in batches of `size` pairs; returns each pair's chosen and rejected values in input order. */
export async function scorePairs(pairs: readonly PreferencePair[], size: number, padId: number, score: (batch: PairBatch) => Promise<Float32Array>): Promise<{ chosen: Float32Array; rejected: Float32Array }> {
  const chosen = new Float32Array(pairs.length);
  const rejected = new Float32Array(pairs.length);
  for (let start = 0; start < pairs.length; start += size) {
    const batch = pairBatch(pairs.slice(start, start + size), { padId });
    const rows = await score(batch);
    chosen.set(rows.subarray(0, batch.pairs), start);
    rejected.set(rows.subarray(batch.pairs, 2 * batch.pairs), start);
  }
  return { chosen, rejected };
}

/**
 * What the preference recipes (`runRmTrain`, `runDpo`, `runRmEval`) share between their loops: one
 * optimizer step's pairs as micro-batch feeds, scoring pairs in chunks, and where a run starts —
 * fresh from the model folder or from its latest checkpoint.
 */
import { pairBatch, pairFeeds, type PairBatch, type PreferencePair, type TrainedWeights } from '@lathe/reward-models';
import { LORA_DROPOUT_KEY, loraDropoutKey, type BatchTensor, type TrainerState } from '@lathe/train';
import type { RunDir } from './scaffold';

/**
 * The feeds of one optimizer step over `pairs`, split into `microBatches` equal micro-batches; each
 * loss is normalised by the whole step's pair count, so the micro-batches add up to the step.
 * `extra(k, pairs)` adds inputs of micro-batch k beyond the pair batch (DPO's reference log-probs);
 * a LoRA dropout key is added when the loss reads one.
 */
export function pairStepFeeds(
  pairs: readonly PreferencePair[],
  o: { microBatches: number; padId: number; inputs: readonly string[]; seed: number; optimizerStep: number; extra?: (k: number, pairs: readonly PreferencePair[]) => Record<string, BatchTensor> },
): Record<string, BatchTensor>[] {
  const per = pairs.length / o.microBatches;
  return Array.from({ length: o.microBatches }, (_, k) => {
    const part = pairs.slice(k * per, (k + 1) * per);
    const extra = {
      ...(o.extra ? o.extra(k, part) : {}),
      // LoRA dropout's masks: a function of (seed, optimizer step, micro-batch), so a resume redraws them
      ...(o.inputs.includes(LORA_DROPOUT_KEY) ? { [LORA_DROPOUT_KEY]: loraDropoutKey(o.seed, o.optimizerStep, k) } : {}),
    };
    return pairFeeds(pairBatch(part, { padId: o.padId, pairCount: pairs.length }), o.inputs, extra);
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

/** Where a preference run starts: its trained tensors' initial values, AdamW moments and state. */
export interface PreferenceStart {
  state: TrainerState;
  params: Map<string, Float32Array>;
  m?: Map<string, Float32Array>;
  v?: Map<string, Float32Array>;
}

/**
 * A fresh start from `tw`'s initial values, or a resume from the run's latest checkpoint (its kind,
 * LoRA or not, checked first; a different `--seed` refused); a resume cuts what was logged after
 * the checkpoint.
 */
export function preferenceStart(run: RunDir, tw: TrainedWeights, cfg: { seed: number; lora_rank: number }): PreferenceStart {
  if (!run.latest) return { state: { step: 0, dataPosition: 0, seed: cfg.seed }, params: tw.init };
  const c = run.resume(tw.params, { rank: cfg.lora_rank });
  if (c.state.seed !== cfg.seed) throw new Error(`--resume: the checkpoint was trained with --seed ${c.state.seed}, not ${cfg.seed}`);
  run.rewind(c.state.step);
  return { state: c.state, params: c.values, m: c.m, v: c.v };
}

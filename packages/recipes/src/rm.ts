/**
 * `lathe rm train` and `lathe rm eval`. Training, top to bottom: load the model, tokenizer and
 * preference pairs → hold pairs out → tokenize (pairs over max_length or identical skipped and
 * counted) → a reward model (the causal LM's trunk plus a new score head, or a reward model to train
 * further) → the Bradley-Terry loss through the Trainer → loop over optimizer steps, logging
 * metrics, scoring the held-out pairs and checkpointing Hugging Face sequence-classification
 * folders → a final evaluation and checkpoint. Resumes exactly and saves a checkpoint when
 * interrupted. Evaluation scores a pair set with a saved reward model and writes the scores to Parquet.
 */
import { batchOf, scalarData, writeParquet } from '@lathe/data';
import { bradleyTerryLoss, preferenceMetrics, preferenceSums, RewardModel, RewardScorer, type PreferenceMetrics } from '@lathe/reward-models';
import { paramCount } from '@lathe/models';
import { BUILTIN_MODEL } from './demo-task';
import { scorePairs } from './preference-batches';
import { loadPreferenceSplit, preferenceEncoder, readPreferenceData, tokenizePreferences, type PreferenceExample } from './preference-data';
import type { RmEvalConfig, RmTrainConfig } from './rm-config';
import { checkPairOptions, runPairTraining, startPairTraining, type PairRunStart, type PairStepTiming } from './pair-run';
import { inPairSession } from './pair-session';
import { checkComputeDtype, loadRunModel, type RunModel, type TrainRunEvents, type TrainRunResult } from './scaffold';

/** A reward model's pairwise metrics, of a step's pairs or the held-out ones. */
export interface RmPairMetrics {
  /** Share of the pairs with r_chosen > r_rejected. */
  accuracy: number;
  /** Mean r_chosen − r_rejected. */
  margin: number;
  chosen_mean: number;
  chosen_std: number;
  rejected_mean: number;
  rejected_std: number;
}

/** Metrics of one optimizer step (one line of metrics.jsonl). */
export type RmStepMetrics = {
  step: number;
  /** The Bradley-Terry loss (with the centring term when on). */
  loss: number;
} & RmPairMetrics &
  PairStepTiming;

/** The held-out pairs scored at one step. */
export type RmEvalResult = { step: number; pairs: number } & RmPairMetrics;

/** Callbacks for progress display. */
export interface RmTrainEvents extends TrainRunEvents<RmStepMetrics, RmEvalResult> {
  onStart?(info: PairRunStart & { parameters: number }): void;
}

/** What a training run returns; its checkpoint is a sequence-classification folder `RewardModel.fromPretrained` (and transformers) loads. */
export type RmTrainResult = TrainRunResult<RmEvalResult>;

/** Metrics as snake_case fields, from `preferenceMetrics`. */
function preferenceFields(m: PreferenceMetrics): RmPairMetrics {
  return { accuracy: m.accuracy, margin: m.margin, chosen_mean: m.chosenMean, chosen_std: m.chosenStd, rejected_mean: m.rejectedMean, rejected_std: m.rejectedStd };
}

/** The reward model a run starts from: a reward model folder as it is, or a causal LM's trunk with a new score head. */
function startingRewardModel(model: RunModel, seed: number): RewardModel {
  if (model.config.scoreLabels !== undefined) return RewardModel.fromWeights(model.config, model.lm.float32Weights());
  return RewardModel.fromCausalLM(model.lm, { padTokenId: model.tokenizer.padId, seed });
}

/** An evaluation row as eval/step-N.jsonl holds it. */
function evalRow(e: PreferenceExample, chosen: number, rejected: number) {
  return { where: e.where, prompt: e.prompt, chosen: e.chosen, rejected: e.rejected, chosen_reward: chosen, rejected_reward: rejected, correct: chosen > rejected };
}

/** Trains a reward model as configured. `signal` interrupts the run after the current step, with a checkpoint. */
export async function runRmTrain(cfg: RmTrainConfig, events: RmTrainEvents = {}, signal?: AbortSignal): Promise<RmTrainResult> {
  checkPairOptions(cfg);
  return inPairSession(cfg, async ({ dp, run, model, hold }) => {
    const data = await loadPreferenceSplit(cfg, model, { margins: cfg.margin });
    const { held } = data;
    const padId = model.tokenizer.padId;

    const rm = startingRewardModel(model, cfg.seed);
    const training = hold(
      startPairTraining(cfg, run, data, {
        config: rm.config,
        master: rm.float32Weights(),
        tokenizer: { padId, from: model.tokenizerFrom },
        loss: (o) => bradleyTerryLoss(rm.config, { ...o, margin: cfg.margin, centerCoefficient: cfg.center_rewards_coefficient }),
      }, dp),
    );
    // held-out rewards in float32 from the trainer's own buffers (full fine-tuning) or the merged adapters (LoRA)
    const scorer = hold(RewardScorer.create(rm.config, training.device));
    return runPairTraining({
      training,
      evaluate: async (step, weights): Promise<RmEvalResult> => {
        const r = await scorePairs(held.pairs, cfg.batch_size, padId, (b) => scorer.score(b, weights));
        run.writeEval(step, held.examples.map((e, i) => evalRow(e, r.chosen[i], r.rejected[i])));
        return { step, pairs: held.pairs.length, ...preferenceFields(preferenceMetrics(preferenceSums(r.chosen, r.rejected))) };
      },
      stepFields: (m) => preferenceFields(preferenceMetrics(m)),
      nonFiniteCause: ' (a reward is not finite)',
      start: (info) => events.onStart?.({ ...info, parameters: paramCount(rm.config) }),
      events,
      signal,
    });
  });
}

/** What `lathe rm eval` reports. */
export interface RmEvalSummary extends Omit<RmEvalResult, 'step'> {
  /** Pairs left out: longer than max_length, or identical responses. */
  skipped: { overLength: number; identical: number };
  /** The Parquet file written. */
  output: string;
}

/**
 * Scores every pair of `--data` (or the first `--limit`) with a saved reward model: pairwise
 * accuracy, margin and reward statistics, and a Parquet file with one row per scored pair (where,
 * prompt, chosen, rejected, chosen_reward, rejected_reward, margin, correct), written atomically.
 */
export async function runRmEval(cfg: RmEvalConfig, events: { onProgress?(done: number, total: number): void } = {}): Promise<RmEvalSummary> {
  checkComputeDtype(cfg);
  if (cfg.model === '') throw new Error('--model: give the reward model folder to evaluate');
  if (cfg.model === BUILTIN_MODEL) throw new Error(`--model ${BUILTIN_MODEL} is a causal LM, not a reward model (train one with lathe rm train)`);
  if (!cfg.output.endsWith('.parquet')) throw new Error(`--output ${cfg.output}: the scores are written as Parquet (a .parquet file name)`);
  const model = await loadRunModel({ ...cfg, run_dir: '.', seed: 0 });
  const rm = await RewardModel.fromPretrained(model.dir, { device: cfg.device, dtype: cfg.compute_dtype }).catch((e: unknown) => {
    throw new Error(`--model ${cfg.model}: ${(e as Error).message}`);
  });
  try {
    const data = await readPreferenceData(cfg.data);
    const examples = cfg.limit > 0 ? data.examples.slice(0, cfg.limit) : data.examples;
    const { pairs, examples: kept, skipped } = tokenizePreferences(examples, await preferenceEncoder(model, cfg), { maxLength: cfg.max_length, what: cfg.data });
    let done = 0;
    const r = await scorePairs(pairs, cfg.batch_size, model.tokenizer.padId, async (b) => {
      const rewards = await rm.score(b);
      events.onProgress?.((done += b.pairs), pairs.length);
      return rewards;
    });
    const text = (f: (e: PreferenceExample) => string) => scalarData('string', kept.map(f));
    const floats = (xs: ArrayLike<number>) => scalarData('float32', Array.from(xs));
    await writeParquet(cfg.output, [
      batchOf([
        { name: 'where', data: text((e) => e.where) },
        { name: 'prompt', data: text((e) => e.prompt) },
        { name: 'chosen', data: text((e) => e.chosen) },
        { name: 'rejected', data: text((e) => e.rejected) },
        { name: 'chosen_reward', data: floats(r.chosen) },
        { name: 'rejected_reward', data: floats(r.rejected) },
        { name: 'margin', data: floats(r.chosen.map((c, i) => c - r.rejected[i])) },
        { name: 'correct', data: scalarData('bool', Array.from(r.chosen, (c, i) => c > r.rejected[i])) },
      ]),
    ], { metadata: { model: cfg.model, data: cfg.data } });
    return { pairs: pairs.length, ...preferenceFields(preferenceMetrics(preferenceSums(r.chosen, r.rejected))), skipped: { overLength: skipped.overLength, identical: data.identical + skipped.identical }, output: cfg.output };
  } finally {
    rm.dispose();
  }
}

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
import { bradleyTerryLoss, preferenceMetrics, preferenceSums, RewardModel, RewardScorer, trainedWeights, type PreferenceMetrics } from '@lathe/reward-models';
import { paramCount } from '@lathe/models';
import { Device, sizeOf } from '@lathe/runtime';
import { loraFromOptions, Trainer, useFlashAttention } from '@lathe/train';
import { BUILTIN_MODEL } from './demo-task';
import { pairStepFeeds, preferenceStart, scorePairs } from './preference-batches';
import { loadPreferenceSplit, preferenceEncoder, readPreferenceData, tokenizePreferences, type PreferenceExample } from './preference-data';
import type { RmEvalConfig, RmTrainConfig } from './rm-config';
import { checkComputeDtype, EpochStream, loadRunModel, RunDir, scheduledLr, stopRequested, type RunModel } from './scaffold';

/** Metrics of one optimizer step (one line of metrics.jsonl). */
export interface RmStepMetrics {
  step: number;
  /** The Bradley-Terry loss (with the centring term when on). */
  loss: number;
  /** Share of the step's pairs with r_chosen > r_rejected. */
  accuracy: number;
  /** Mean r_chosen − r_rejected. */
  margin: number;
  chosen_mean: number;
  chosen_std: number;
  rejected_mean: number;
  rejected_std: number;
  grad_norm: number;
  lr: number;
  /** Tokens in the step's sequences (two per pair). */
  tokens: number;
  tokens_per_s: number;
  /** Milliseconds preparing the batch on the host and inside ONNX Runtime runs. */
  host_ms: number;
  run_ms: number;
}

/** The held-out pairs scored at one step. */
export interface RmEvalResult {
  step: number;
  pairs: number;
  accuracy: number;
  margin: number;
  chosen_mean: number;
  chosen_std: number;
  rejected_mean: number;
  rejected_std: number;
}

/** Callbacks for progress display. */
export interface RmTrainEvents {
  onStart?(info: { startStep: number; totalSteps: number; trainPairs: number; evalPairs: number; skipped: { overLength: number; identical: number }; parameters: number; trainable: number }): void;
  onStep?(m: RmStepMetrics): void;
  onEval?(r: RmEvalResult): void;
  onCheckpoint?(dir: string, step: number): void;
}

/** What a training run returns. */
export interface RmTrainResult {
  steps: number;
  finalLoss: number;
  evals: RmEvalResult[];
  /** The last checkpoint: a sequence-classification folder `RewardModel.fromPretrained` (and transformers) loads. */
  checkpoint: string;
  interrupted: boolean;
}

/** Metrics as snake_case fields, from `preferenceMetrics`. */
function preferenceFields(m: PreferenceMetrics) {
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
  checkComputeDtype(cfg);
  const compute = cfg.compute_dtype;
  if (cfg.batch_size % cfg.micro_batches !== 0) throw new Error(`--batch_size ${cfg.batch_size} is not divisible by --micro_batches ${cfg.micro_batches}`);
  const run = RunDir.open(cfg);
  const model = await loadRunModel(cfg);
  const { train, held, skipped } = await loadPreferenceSplit(cfg, model, { margins: cfg.margin });
  const padId = model.tokenizer.padId;

  const rm = startingRewardModel(model, cfg.seed);
  const lora = loraFromOptions(cfg);
  const tw = trainedWeights(rm.config, rm.float32Weights(), { lora, compute, seed: cfg.seed });
  const loss = bradleyTerryLoss(rm.config, {
    compute,
    weights: tw.weights,
    recompute: cfg.gradient_checkpointing,
    flashAttention: useFlashAttention(cfg.attention, cfg.device, compute),
    margin: cfg.margin,
    centerCoefficient: cfg.center_rewards_coefficient,
  });
  const start = preferenceStart(run, tw, cfg);
  let state = start.state;

  const device = Device.open(cfg.device);
  const frozen = tw.frozenOn(device);
  const trainer = Trainer.create({ params: tw.params, loss, optimizer: { weightDecay: cfg.weight_decay, maxGradNorm: cfg.max_grad_norm } }, { params: start.params, m: start.m, v: start.v, step: state.step }, { device, microBatches: cfg.micro_batches, frozen });
  // held-out rewards in float32 from the trainer's own buffers (full fine-tuning) or the merged adapters (LoRA)
  const scorer = RewardScorer.create(rm.config, device);
  try {
    run.saveConfig(cfg);
    const evaluate = async (): Promise<RmEvalResult> => {
      const weights = lora ? tw.merged(trainer.downloadParams()) : trainer.params();
      const r = await scorePairs(held.pairs, cfg.batch_size, padId, (b) => scorer.score(b, weights));
      run.writeEval(state.step, held.examples.map((e, i) => evalRow(e, r.chosen[i], r.rejected[i])));
      const result: RmEvalResult = { step: state.step, pairs: held.pairs.length, ...preferenceFields(preferenceMetrics(preferenceSums(r.chosen, r.rejected))) };
      run.metrics.log({ step: state.step, ...Object.fromEntries(Object.entries(result).filter(([k]) => k !== 'step').map(([k, v]) => [`eval_${k}`, v])) });
      events.onEval?.(result);
      return result;
    };
    const checkpoint = () => {
      const snap = trainer.snapshot();
      return run.checkpoint(
        { config: rm.config, model: tw.merged(snap.params), trainable: tw.params, values: snap.params, m: snap.m, v: snap.v, state, lora: Boolean(lora) },
        { keepLast: cfg.keep_last, tokenizerFrom: model.tokenizerFrom, onCheckpoint: (dir, step) => events.onCheckpoint?.(dir, step) },
      );
    };

    events.onStart?.({
      startStep: state.step,
      totalSteps: cfg.steps,
      trainPairs: train.pairs.length,
      evalPairs: held.pairs.length,
      skipped,
      parameters: paramCount(rm.config),
      trainable: tw.params.reduce((s, p) => s + sizeOf(p.shape), 0),
    });
    const stream = new EpochStream(train.pairs, cfg.seed, state.dataPosition);
    const evals: RmEvalResult[] = [];
    let lastLoss = NaN;
    let interrupted = false;
    if (state.step === 0 && held.pairs.length > 0) evals.push(await evaluate());

    while (state.step < cfg.steps) {
      const t0 = performance.now();
      const batchStart = stream.position;
      const pairs = stream.take(cfg.batch_size);
      const lr = scheduledLr(cfg, state.step);
      const feeds = pairStepFeeds(pairs, { microBatches: cfg.micro_batches, padId, inputs: trainer.batchInputs, seed: cfg.seed, optimizerStep: trainer.step });
      const hostMs0 = performance.now() - t0;
      const result = trainer.trainStep(feeds, lr);
      if (!Number.isFinite(result.loss)) {
        const dir = checkpoint();
        throw new Error(
          `step ${state.step + 1}: the loss is ${result.loss} on the pairs at stream positions ${batchStart}..${batchStart + cfg.batch_size - 1} (a reward is not finite); the weights before this step are saved in ${dir}. Lower --lr or check the data.`,
        );
      }
      state = { ...state, step: state.step + 1, dataPosition: stream.position };
      lastLoss = result.loss;
      const tokens = pairs.reduce((s, p) => s + 2 * p.prompt.length + p.chosen.length + p.rejected.length, 0);
      const hostMs = hostMs0 + result.hostMs;
      const metrics: RmStepMetrics = {
        step: state.step,
        loss: result.loss,
        ...preferenceFields(preferenceMetrics(result.metrics)),
        grad_norm: result.gradNorm,
        lr,
        tokens,
        tokens_per_s: tokens / ((hostMs + result.runMs) / 1000),
        host_ms: hostMs,
        run_ms: result.runMs,
      };
      events.onStep?.(metrics);
      // on the log_every schedule only, so a resumed run's metrics.jsonl equals an uninterrupted run's
      if (state.step % cfg.log_every === 0 || state.step === cfg.steps) run.metrics.log({ ...metrics });
      if (held.pairs.length > 0 && ((cfg.eval_every > 0 && state.step % cfg.eval_every === 0) || state.step === cfg.steps)) evals.push(await evaluate());
      if (cfg.save_every > 0 && state.step % cfg.save_every === 0 && state.step < cfg.steps) checkpoint();
      if (await stopRequested(signal)) {
        interrupted = true;
        break;
      }
    }
    const last = run.savedAt(state.step) ?? checkpoint();
    return { steps: state.step, finalLoss: lastLoss, evals, checkpoint: last, interrupted };
  } finally {
    scorer.dispose();
    trainer.dispose();
    for (const t of Object.values(frozen)) t.dispose();
  }
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

/**
 * The training loop the preference recipes (`runRmTrain`, `runDpo`) share once their loss, trainer
 * and scorer are built: an evaluation before the first step, then optimizer steps over the pairs in
 * epoch order, each logged on the `log_every` schedule, the held-out pairs scored and checkpoints
 * saved on theirs, a stop request honoured after the current step, and a final checkpoint.
 */
import type { DecoderConfig } from '@lathe/models';
import type { PreferencePair, TrainedWeights } from '@lathe/reward-models';
import { sizeOf } from '@lathe/runtime';
import type { BatchTensor, Trainer, TrainerState } from '@lathe/train';
import { pairStepFeeds } from './preference-batches';
import { EpochStream, scheduledLr, stopRequested, type RunDir, type TrainRunEvents, type TrainRunResult } from './scaffold';

/** The options of a preference training run that its loop reads. */
export interface PairRunConfig {
  steps: number;
  batch_size: number;
  micro_batches: number;
  seed: number;
  lr: number;
  schedule: 'constant' | 'linear' | 'cosine';
  warmup_steps: number;
  min_lr_ratio: number;
  log_every: number;
  eval_every: number;
  save_every: number;
  keep_last: number;
}

/** A step's timing and throughput fields, after its loss and pair metrics. */
export interface PairStepTiming {
  grad_norm: number;
  lr: number;
  /** Tokens in the step's sequences (two per pair). */
  tokens: number;
  tokens_per_s: number;
  /** Milliseconds preparing the batch on the host and inside ONNX Runtime runs. */
  host_ms: number;
  run_ms: number;
}

/** What every preference run's `onStart` reports; a recipe adds its own fields. */
export interface PairRunStart {
  startStep: number;
  totalSteps: number;
  trainPairs: number;
  evalPairs: number;
  skipped: { overLength: number; identical: number };
  trainable: number;
}

/** The weights a held-out evaluation scores with: the trainer's own buffers, or the merged adapters with LoRA. */
export type PairEvalWeights = ReturnType<Trainer['params']> | Map<string, Float32Array>;

/** A preference run's loop: what it trains and how the recipe scores, reports and names its metrics. */
export interface PairRun<F, S, E> {
  cfg: PairRunConfig;
  run: RunDir;
  trainer: Trainer;
  tw: TrainedWeights;
  lora: boolean;
  /** The checkpoints' model config. */
  config: DecoderConfig;
  tokenizerFrom?: string;
  state: TrainerState;
  train: { pairs: PreferencePair[] };
  held: { pairs: PreferencePair[] };
  skipped: { overLength: number; identical: number };
  padId: number;
  /** Scores the held-out pairs at `step` with `weights`, writes eval/step-N.jsonl; the result (eval_-prefixed in metrics.jsonl). */
  evaluate(step: number, weights: PairEvalWeights): Promise<E>;
  /** A step's pair metrics from the loss's summed metrics. */
  stepFields(metrics: Record<string, number>): F;
  /** Inputs of micro-batch k beyond the pair batch (DPO's reference log-probs). */
  extraFeeds?: (k: number, pairs: readonly PreferencePair[]) => Record<string, BatchTensor>;
  /** Why a loss may not be finite, after the stream positions in that error (e.g. ' (a reward is not finite)'). */
  nonFiniteCause?: string;
  /** Calls the recipe's `onStart` with the shared fields. */
  start(info: PairRunStart): void;
  events: TrainRunEvents<S, E>;
  /** Interrupts the run after the current step, with a checkpoint. */
  signal?: AbortSignal;
}

/** Runs the loop of a preference run (see the module comment); returns what the recipe returns. */
export async function runPairTraining<F, E extends { step: number }>(o: PairRun<F, { step: number; loss: number } & F & PairStepTiming, E>): Promise<TrainRunResult<E>> {
  const { cfg, run, trainer, tw, held, events } = o;
  let state = o.state;
  const evaluate = async (): Promise<E> => {
    const result = await o.evaluate(state.step, o.lora ? tw.merged(trainer.downloadParams()) : trainer.params());
    run.metrics.log({ step: state.step, ...Object.fromEntries(Object.entries(result).filter(([k]) => k !== 'step').map(([k, v]) => [`eval_${k}`, v])) });
    events.onEval?.(result);
    return result;
  };
  const checkpoint = () => {
    const snap = trainer.snapshot();
    return run.checkpoint(
      { config: o.config, model: tw.merged(snap.params), trainable: tw.params, values: snap.params, m: snap.m, v: snap.v, state, lora: o.lora },
      { keepLast: cfg.keep_last, tokenizerFrom: o.tokenizerFrom, onCheckpoint: (dir, step) => events.onCheckpoint?.(dir, step) },
    );
  };

  o.start({
    startStep: state.step,
    totalSteps: cfg.steps,
    trainPairs: o.train.pairs.length,
    evalPairs: held.pairs.length,
    skipped: o.skipped,
    trainable: tw.params.reduce((s, p) => s + sizeOf(p.shape), 0),
  });
  const stream = new EpochStream(o.train.pairs, cfg.seed, state.dataPosition);
  const evals: E[] = [];
  let lastLoss = NaN;
  let interrupted = false;
  if (state.step === 0 && held.pairs.length > 0) evals.push(await evaluate());

  while (state.step < cfg.steps) {
    const t0 = performance.now();
    const batchStart = stream.position;
    const pairs = stream.take(cfg.batch_size);
    const lr = scheduledLr(cfg, state.step);
    const feeds = pairStepFeeds(pairs, { microBatches: cfg.micro_batches, padId: o.padId, inputs: trainer.batchInputs, seed: cfg.seed, optimizerStep: trainer.step, ...(o.extraFeeds ? { extra: o.extraFeeds } : {}) });
    const hostMs0 = performance.now() - t0;
    const result = trainer.trainStep(feeds, lr);
    if (!Number.isFinite(result.loss)) {
      const dir = checkpoint();
      throw new Error(
        `step ${state.step + 1}: the loss is ${result.loss} on the pairs at stream positions ${batchStart}..${batchStart + cfg.batch_size - 1}${o.nonFiniteCause ?? ''}; the weights before this step are saved in ${dir}. Lower --lr or check the data.`,
      );
    }
    state = { ...state, step: state.step + 1, dataPosition: stream.position };
    lastLoss = result.loss;
    const tokens = pairs.reduce((s, p) => s + 2 * p.prompt.length + p.chosen.length + p.rejected.length, 0);
    const hostMs = hostMs0 + result.hostMs;
    const metrics = {
      step: state.step,
      loss: result.loss,
      ...o.stepFields(result.metrics),
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
    if (await stopRequested(o.signal)) {
      interrupted = true;
      break;
    }
  }
  const last = run.savedAt(state.step) ?? checkpoint();
  return { steps: state.step, finalLoss: lastLoss, evals, checkpoint: last, interrupted };
}

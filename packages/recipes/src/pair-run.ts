/**
 * What the preference recipes (`runRmTrain`, `runDpo`) share once their model and pairs are loaded:
 * the trained tensors, the loss and the Trainer, started fresh or from the run's latest checkpoint
 * (`startPairTraining`); then the loop (`runPairTraining`): an evaluation before the first step,
 * optimizer steps over the pairs in epoch order, each logged on the `log_every` schedule, the
 * held-out pairs scored and checkpoints saved on theirs, a stop request honoured after the current
 * step, and a final checkpoint.
 */
import type { DecoderConfig } from '@lathe/models';
import type { PreferencePair, TrainedWeights } from '@lathe/reward-models';
import { sizeOf, type Device, type DeviceTensor } from '@lathe/runtime';
import { loraFromOptions, Trainer, type BatchTensor, type DecoderLossOptions, type LoraOptions, type LossBuilder, type TrainerState } from '@lathe/train';
import type { DType } from '@lathe/onnx';
import { pairStepFeeds } from './preference-batches';
import { runTrainedWeights } from './quantize-lora';
import { anyRankStopped, joinsCheckpoint, type DataParallelRun } from './launch-dp';
import { openTrainDevice, checkTrainAttention, type TrainAttentionChoice } from './train-attention';
import { checkComputeDtype, EpochStream, scheduledLr, stepTiming, stopRequested, type RunDir, type TrainRunEvents, type TrainRunResult } from './scaffold';

/** Options `--resume` accepts with new values in a preference run (they change neither the weights nor the data order). */
export const PAIR_RESUMABLE_KEYS: readonly string[] = ['resume', 'force', 'overwrite', 'eval_every', 'save_every', 'keep_last', 'log_every', 'gradient_checkpointing', 'attention', 'report_to', 'wandb_project', 'zero_stage', 'grad_reduce_dtype', 'grad_overlap', 'grad_bucket_mb'];

/** The options of a preference training run that its setup and loop read. */
export interface PairRunConfig extends LoraOptions {
  device: 'cpu' | 'cuda';
  compute_dtype: 'float32' | 'bfloat16';
  attention: TrainAttentionChoice;
  gradient_checkpointing: boolean;
  /** QLoRA's base format, or 'none'. */
  quantize_base: string;
  steps: number;
  batch_size: number;
  micro_batches: number;
  seed: number;
  lr: number;
  schedule: 'constant' | 'linear' | 'cosine';
  warmup_steps: number;
  min_lr_ratio: number;
  weight_decay: number;
  max_grad_norm: number;
  log_every: number;
  eval_every: number;
  save_every: number;
  keep_last: number;
  force: boolean;
}

/** What every preference loss takes from the run's options: the compute dtype, how weights are read, recomputation and attention. */
export interface PairLossOptions {
  compute: DType;
  weights: TrainedWeights['weights'];
  recompute: boolean;
  flashAttention: boolean;
  /** With `--attention kernels`: the kernel attention goes through. */
  attentionKernel?: DecoderLossOptions['attentionKernel'];
}

/** The training and held-out pairs of a preference run, and how many were left out. */
export interface PairData {
  train: { pairs: PreferencePair[] };
  held: { pairs: PreferencePair[] };
  skipped: { overLength: number; identical: number };
}

/** A preference run set up to train: its options, directory, pairs, trained tensors and Trainer, at the step it starts from. */
export interface PairTraining {
  cfg: PairRunConfig;
  run: RunDir;
  data: PairData;
  /** The tokenizer's pad id and the folder checkpoints copy the tokenizer from. */
  tokenizer: { padId: number; from?: string };
  device: Device;
  /** The checkpoints' model config. */
  config: DecoderConfig;
  tw: TrainedWeights;
  trainer: Trainer;
  lora: boolean;
  /** The step, data position and seed the run starts from. */
  state: TrainerState;
  /** This rank's place in a data-parallel job (lathe launch), if it runs in one. */
  dp?: DataParallelRun;
  /** Rethrows an error the attention kernels raised in the last step (with `--attention kernels`). */
  checkStep(): void;
  /** Frees the Trainer, the frozen tensors and the attention kernels' ops. */
  dispose(): void;
}

/** Refuses options a preference run cannot start with, before anything is loaded. */
export function checkPairOptions(cfg: PairRunConfig): void {
  checkComputeDtype(cfg);
  checkTrainAttention(cfg);
  if (cfg.batch_size % cfg.micro_batches !== 0) throw new Error(`--batch_size ${cfg.batch_size} is not divisible by --micro_batches ${cfg.micro_batches}`);
}

/**
 * Builds a preference run's Trainer over `master` (the starting model's float32 weights) with
 * `loss`: LoRA adapters or every weight as the options say, initial values fresh or from the run's
 * latest checkpoint — whose config must match the options (up to {@link PAIR_RESUMABLE_KEYS})
 * unless `--force`, and whose kind (LoRA or not) and seed must match always; a resume cuts what was
 * logged after the checkpoint. Saves the run's config.
 */
export function startPairTraining(
  cfg: PairRunConfig,
  run: RunDir,
  data: PairData,
  model: { config: DecoderConfig; master: ReadonlyMap<string, Float32Array>; tokenizer: { padId: number; from?: string }; loss: (o: PairLossOptions) => LossBuilder },
  dp?: DataParallelRun,
): PairTraining {
  const lora = loraFromOptions(cfg);
  const compute = cfg.compute_dtype;
  const tw = runTrainedWeights(model.config, model.master, { lora, compute, seed: cfg.seed, quantize_base: cfg.quantize_base, device: cfg.device });
  const { state, init } = run.startFrom(tw.params, cfg, PAIR_RESUMABLE_KEYS, tw.init);
  run.saveConfig(cfg);
  // a data-parallel rank opens its own GPU (LOCAL_RANK); with --attention kernels, through the kernels
  const { device, attention } = openTrainDevice(cfg, model.config, { id: dp?.deviceId ?? 0 });
  const loss = model.loss({ compute, weights: tw.weights, recompute: cfg.gradient_checkpointing, flashAttention: attention.flashAttention, ...attention.loss });
  const frozen: Record<string, DeviceTensor> = tw.frozenOn(device);
  const trainer = Trainer.create(
    { params: tw.params, loss, optimizer: { weightDecay: cfg.weight_decay, maxGradNorm: cfg.max_grad_norm } },
    { ...init, step: state.step },
    { device, microBatches: cfg.micro_batches, frozen, ...attention.trainer, ...(dp ? dp.trainerOptionsFor(device) : {}) },
  );
  return {
    cfg,
    run,
    data,
    tokenizer: model.tokenizer,
    device,
    config: model.config,
    tw,
    trainer,
    lora: Boolean(lora),
    state,
    ...(dp ? { dp } : {}),
    checkStep: () => attention.check(),
    dispose() {
      trainer.dispose();
      for (const t of Object.values(frozen)) t.dispose();
      attention.dispose();
    },
  };
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

/** A preference run's loop: what it trains on and how the recipe scores, reports and names its metrics. */
export interface PairRun<F, S, E> {
  training: PairTraining;
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
  const { events } = o;
  const { cfg, run, trainer, tw, data, dp } = o.training;
  // held-out evaluations and checkpoints on rank 0 only (the other ranks wait for it at their next all-reduce)
  const main = !dp || dp.main;
  const held = main ? data.held : { pairs: [] };
  let state = o.training.state;
  const evaluate = async (): Promise<E> => {
    const result = await o.evaluate(state.step, o.training.lora ? tw.merged(trainer.downloadParams()) : trainer.params());
    run.metrics.log({ step: state.step, ...Object.fromEntries(Object.entries(result).filter(([k]) => k !== 'step').map(([k, v]) => [`eval_${k}`, v])) });
    events.onEval?.(result);
    return result;
  };
  const checkpoint = async () => {
    // with ZeRO-1 every rank gives its moment shards to rank 0's checkpoint
    if (!joinsCheckpoint(dp)) return run.dir;
    const snap = await trainer.snapshotAsync();
    if (!main) return run.dir;
    return run.checkpoint(
      { config: o.training.config, model: tw.merged(snap.params), trainable: tw.params, values: snap.params, m: snap.m, v: snap.v, state, lora: o.training.lora },
      { keepLast: cfg.keep_last, tokenizerFrom: o.training.tokenizer.from, onCheckpoint: (dir, step) => events.onCheckpoint?.(dir, step) },
    );
  };

  o.start({
    startStep: state.step,
    totalSteps: cfg.steps,
    trainPairs: data.train.pairs.length,
    evalPairs: held.pairs.length,
    skipped: data.skipped,
    trainable: tw.params.reduce((s, p) => s + sizeOf(p.shape), 0),
  });
  const stream = new EpochStream(data.train.pairs, cfg.seed, state.dataPosition);
  const evals: E[] = [];
  let lastLoss = NaN;
  let interrupted = false;
  if (state.step === 0 && held.pairs.length > 0) evals.push(await evaluate());

  while (state.step < cfg.steps) {
    const t0 = performance.now();
    const batchStart = stream.position;
    const pairs = stream.take(cfg.batch_size);
    const lr = scheduledLr(cfg, state.step);
    // every rank reads the same global batch and trains on its share; the loss is normalised by the whole batch's pairs
    const mine = dp ? dp.shard(pairs) : pairs;
    const feeds = pairStepFeeds(mine, {
      microBatches: cfg.micro_batches,
      padId: o.training.tokenizer.padId,
      inputs: trainer.batchInputs,
      seed: cfg.seed,
      optimizerStep: trainer.step,
      pairCount: pairs.length,
      microOffset: (dp?.world.rank ?? 0) * cfg.micro_batches,
      ...(o.extraFeeds ? { extra: o.extraFeeds } : {}),
    });
    const hostMs0 = performance.now() - t0;
    const result = await trainer.trainStepAsync(feeds, lr);
    o.training.checkStep();
    if (!Number.isFinite(result.loss)) {
      const dir = await checkpoint();
      throw new Error(
        `step ${state.step + 1}: the loss is ${result.loss} on the pairs at stream positions ${batchStart}..${batchStart + cfg.batch_size - 1}${o.nonFiniteCause ?? ''}; the weights before this step are saved in ${dir}. Lower --lr or check the data.`,
      );
    }
    state = { ...state, step: state.step + 1, dataPosition: stream.position };
    lastLoss = result.loss;
    const tokens = pairs.reduce((s, p) => s + 2 * p.prompt.length + p.chosen.length + p.rejected.length, 0);
    const metrics = { step: state.step, loss: result.loss, ...o.stepFields(result.metrics), ...stepTiming(result, { lr, tokens, prepMs: hostMs0 }) };
    events.onStep?.(metrics);
    // on the log_every schedule only, so a resumed run's metrics.jsonl equals an uninterrupted run's
    if (state.step % cfg.log_every === 0 || state.step === cfg.steps) run.metrics.log({ ...metrics });
    if (held.pairs.length > 0 && ((cfg.eval_every > 0 && state.step % cfg.eval_every === 0) || state.step === cfg.steps)) evals.push(await evaluate());
    if (cfg.save_every > 0 && state.step % cfg.save_every === 0 && state.step < cfg.steps) await checkpoint();
    if (await anyRankStopped(dp, await stopRequested(o.signal))) {
      interrupted = true;
      break;
    }
  }
  const last = run.savedAt(state.step) ?? (await checkpoint());
  return { steps: state.step, finalLoss: lastLoss, evals, checkpoint: last, interrupted };
}

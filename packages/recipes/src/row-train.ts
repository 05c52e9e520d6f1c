/**
 * The training loop `lathe critic train`, `lathe extract train` and `lathe extract rft` share: one
 * device, no evaluation, a stream of ready-made token rows. Top to bottom: the trained tensors
 * (every weight or LoRA adapters) and the recipe's loss → fresh or resumed state → the Trainer →
 * loop over optimizer steps (batch → micro-batch feeds → step → log → checkpoint), a non-finite loss
 * saving the weights before its step and stopping, a stop request honoured after the current step
 * → a final checkpoint. What differs between the recipes — the loss, a batch's feeds, what its loss
 * tokens are and what a step reports — comes in as functions.
 */
import type { DecoderConfig } from '@lathe/models';
import { sizeOf, type HostTensor } from '@lathe/runtime';
import { LORA_DROPOUT_KEY, loraDropoutKey, Trainer, type DecoderLossOptions, type LossBuilder, type TrainStepResult } from '@lathe/train';
import type { PairRunConfig } from './pair-run';
import { recipeTensors } from './quantize-lora';
import { EpochStream, openDevice, scheduledLr, stepTiming, stopRequested, type RunDir, type TrainRunResult } from './scaffold';

/** A step's timing fields in metrics.jsonl: grad_norm, lr, tokens, tokens_per_s, host_ms, run_ms. */
export type StepTimingFields = ReturnType<typeof stepTiming>;

/** The options of a row-stream training run that its setup and loop read: a preference run's (PairRunConfig) less attention and evaluation, QLoRA and --force optional. */
export type RowTrainConfig = Omit<PairRunConfig, 'attention' | 'eval_every' | 'quantize_base' | 'force'> & { quantize_base?: string; force?: boolean };

/** What a recipe gives the loop: the model, its rows, and the functions that differ between recipes. */
export interface RowTraining<E extends { ids: number[] }, F extends { step: number; loss: number }> {
  /** The model's config and float32 weights as training starts from them (before any checkpoint is read). */
  config: DecoderConfig;
  base: Map<string, Float32Array>;
  padId: number;
  /** The folder checkpoints copy the tokenizer from. */
  tokenizerFrom?: string;
  /** The rows, in the order the seeded epoch stream shuffles. */
  rows: E[];
  /** Options `--resume` accepts with new values. */
  resumableKeys: readonly string[];
  loss: (config: DecoderConfig, opts: Pick<DecoderLossOptions, 'compute' | 'recompute' | 'weights'>) => LossBuilder;
  /** A micro-batch's inputs (`loss_tokens` and LoRA dropout's key are added by the loop). */
  feeds: (batch: readonly E[], padId: number) => Record<string, HostTensor>;
  /** The batch's loss positions: the loss is their mean. */
  lossTokens: (batch: readonly E[]) => number;
  /** A step's own metrics from its result (the loop adds the timing fields). */
  stepFields: (o: { step: number; result: TrainStepResult; lossTokens: number }) => F;
  /** The rows a non-finite loss names, as "<what> <first>..<last>" reads in its error. */
  describeRows: (first: number, last: number) => string;
  /** Called once the run is set up, with the step it starts from and the trained parameter count. */
  onStart?(info: { startStep: number; totalSteps: number; parameters: number }): void;
  onStep?(m: F & StepTimingFields): void;
  /** After each checkpoint is written (the recipe may add files to its folder). */
  onCheckpoint?(dir: string, step: number): void;
}

const f32 = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });

/** Trains in `run` as configured, closing it however the run ends. `signal` interrupts it after the current step, with a checkpoint. */
export async function trainOnRows<E extends { ids: number[] }, F extends { step: number; loss: number }>(cfg: RowTrainConfig, run: RunDir, t: RowTraining<E, F>, signal?: AbortSignal): Promise<TrainRunResult<never>> {
  const { config } = t;
  let trainer: Trainer | undefined;
  let frozenBase: Record<string, { dispose(): void }> = {};
  try {
    const trained = recipeTensors(config, t.base, cfg);
    const { lora, params } = trained;
    const loss = t.loss(config, { compute: cfg.compute_dtype, recompute: cfg.gradient_checkpointing, ...(trained.weights ? { weights: trained.weights } : {}) });
    const start = run.startFrom(params, cfg, t.resumableKeys, trained.init);
    let { state } = start;
    const device = openDevice(cfg.device);
    const frozen = trained.frozenOn(device);
    frozenBase = frozen;
    const tr = (trainer = Trainer.create({ params, loss, optimizer: { weightDecay: cfg.weight_decay, maxGradNorm: cfg.max_grad_norm } }, { ...start.init, step: state.step }, { device, microBatches: cfg.micro_batches, frozen }));
    const dropoutKeyed = tr.batchInputs.includes(LORA_DROPOUT_KEY);
    run.saveConfig(cfg);
    const checkpoint = () => {
      const snap = tr.snapshot();
      return run.checkpoint(
        { config, model: trained.merged(snap.params), trainable: params, values: snap.params, m: snap.m, v: snap.v, state, lora: Boolean(lora) },
        { keepLast: cfg.keep_last, tokenizerFrom: t.tokenizerFrom, onCheckpoint: t.onCheckpoint },
      );
    };
    t.onStart?.({ startStep: state.step, totalSteps: cfg.steps, parameters: params.reduce((s, p) => s + sizeOf(p.shape), 0) });
    const stream = new EpochStream<E>(t.rows, cfg.seed, state.dataPosition);
    let lastLoss = NaN;
    let interrupted = false;
    while (state.step < cfg.steps) {
      const t0 = performance.now();
      const batchStart = stream.position;
      const batch = stream.take(cfg.batch_size);
      const lossTokens = t.lossTokens(batch);
      const lr = scheduledLr(cfg, state.step);
      const per = cfg.batch_size / cfg.micro_batches;
      const micro = Array.from({ length: cfg.micro_batches }, (_, k) => ({
        ...t.feeds(batch.slice(k * per, (k + 1) * per), t.padId),
        loss_tokens: f32(Math.max(1, lossTokens)),
        ...(dropoutKeyed ? { [LORA_DROPOUT_KEY]: loraDropoutKey(cfg.seed, tr.step, k) } : {}),
      }));
      const prepMs = performance.now() - t0;
      const result = tr.trainStep(micro, lr);
      if (!Number.isFinite(result.loss)) {
        const dir = checkpoint();
        throw new Error(`step ${state.step + 1}: the loss is ${result.loss} on ${t.describeRows(batchStart, batchStart + cfg.batch_size - 1)}; the weights before this step are saved in ${dir}. Lower --lr or check the data.`);
      }
      state = { ...state, step: state.step + 1, dataPosition: stream.position };
      lastLoss = result.loss;
      const tokens = batch.reduce((s, e) => s + e.ids.length, 0);
      const metrics: F & StepTimingFields = { ...t.stepFields({ step: state.step, result, lossTokens }), ...stepTiming(result, { lr, tokens, prepMs }) };
      t.onStep?.(metrics);
      if (state.step % cfg.log_every === 0 || state.step === cfg.steps) run.metrics.log({ ...metrics });
      if (cfg.save_every > 0 && state.step % cfg.save_every === 0 && state.step < cfg.steps) checkpoint();
      if (await stopRequested(signal)) {
        interrupted = true;
        break;
      }
    }
    const last = run.savedAt(state.step) ?? checkpoint();
    return { steps: state.step, finalLoss: lastLoss, evals: [], checkpoint: last, interrupted };
  } finally {
    trainer?.dispose();
    for (const d of Object.values(frozenBase)) d.dispose();
    await run.close();
  }
}

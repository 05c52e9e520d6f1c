/**
 * `lathe critic train`, top to bottom: load the model, tokenizer and trajectory rows → place the
 * grid's distribution tokens past the tokenizer's vocabulary (growing the embedding when the model
 * has too few spare rows) → build and pack the in-context sequences → compile the critic loss on
 * the train step → loop over optimizer steps, logging and checkpointing (each checkpoint with its
 * critic_bins.json). Resumes exactly as `lathe sft` does.
 */
import { seededNormal, type DecoderConfig } from '@lathe/models';
import { readTrajectories } from '@lathe/data';
import { HfTokenizer } from '@lathe/tokenizer';
import { sizeOf, type HostTensor } from '@lathe/runtime';
import { LORA_DROPOUT_KEY, loraDropoutKey, Trainer } from '@lathe/train';
import { criticLoss, defaultRewardValues, gridShape, growRows, logLengthEdges, placeGrid, saveBins, type CriticBins } from '@lathe/critic';
import { additionTokenizer } from './demo-task';
import { recipeTensors } from './quantize-lora';
import { checkComputeDtype, EpochStream, loadRunModel, openDevice, RunDir, scheduledLr, stepTiming, stopRequested, type RunModel, type TrainRunEvents, type TrainRunResult } from './scaffold';
import { CRITIC_TRAIN_RESUMABLE_KEYS, type CriticTrainConfig } from './critic-config';
import { criticLabelCount, criticTrainingExamples, packCriticExamples, padCriticBatch, type CriticRow } from './critic-data';

/** Metrics of one optimizer step (one line of metrics.jsonl). */
export interface CriticStepMetrics {
  step: number;
  /** Mean cross-entropy of the labelled tokens' grid cells. */
  loss: number;
  /** Share of labelled tokens whose most likely cell is the label. */
  cell_accuracy: number;
  grad_norm: number;
  lr: number;
  label_tokens: number;
  tokens: number;
  tokens_per_s: number;
  host_ms: number;
  run_ms: number;
}

/** Callbacks for progress display. */
export interface CriticTrainEvents extends TrainRunEvents<CriticStepMetrics, never> {
  onStart?(info: { startStep: number; totalSteps: number; prompts: number; sequences: number; rows: number; skipped: number; cells: number; firstTokenId: number; addedRows: number; parameters: number }): void;
}

/** The grid a config asks for, its tokens starting at `firstTokenId`. */
export function criticBinsFor(cfg: Pick<CriticTrainConfig, 'reward_bins' | 'length_bins' | 'max_remaining'>, firstTokenId: number): CriticBins {
  return { reward_values: defaultRewardValues(cfg.reward_bins), length_edges: logLengthEdges(cfg.max_remaining, cfg.length_bins), first_token_id: firstTokenId };
}

/** Ids the run's tokenizer has (the grid's tokens go after them). */
async function tokenizerVocab(model: RunModel): Promise<number> {
  return model.tokenizerFrom ? (await HfTokenizer.fromFolder(model.tokenizerFrom)).vocabSize : additionTokenizer().vocabSize;
}

/**
 * The model with `add` more vocabulary rows (embedding, and LM head when untied): each new row the
 * mean of the old ones plus seeded noise of std 0.02, so the grid's tokens start distinct and
 * near an average token.
 */
function growVocabulary(config: DecoderConfig, weights: Map<string, Float32Array>, add: number, seed: number): DecoderConfig {
  if (add === 0) return config;
  const grown: DecoderConfig = { ...config, vocabSize: config.vocabSize + add };
  const next = seededNormal(seed + 0xc817);
  for (const name of ['model.embed_tokens.weight', ...(config.tieWordEmbeddings ? [] : ['lm_head.weight'])]) {
    const w = growRows(weights.get(name)!, config.vocabSize, config.hiddenSize, add);
    for (let i = config.vocabSize * config.hiddenSize; i < w.length; i++) w[i] += 0.02 * next();
    weights.set(name, w);
  }
  return grown;
}

const f32 = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });

/** Runs critic training as configured. `signal` interrupts it after the current step, with a checkpoint. */
export async function runCriticTrain(cfg: CriticTrainConfig, events: CriticTrainEvents = {}, signal?: AbortSignal): Promise<TrainRunResult<never>> {
  checkComputeDtype(cfg);
  if (!cfg.data) throw new Error('--data is required: a trajectory Parquet file (lathe critic data writes one)');
  if (cfg.batch_size % cfg.micro_batches !== 0) throw new Error(`--batch_size ${cfg.batch_size} is not divisible by --micro_batches ${cfg.micro_batches}`);
  if (cfg.attention === 'flash') throw new Error('--attention flash: critic rows are packed, and GroupQueryAttention takes no per-sequence mask; use --attention composed or auto');
  const run = RunDir.open(cfg);
  const model = await loadRunModel({ ...cfg, prompt_format: 'raw', enable_thinking: false });
  const { lm, tokenizer, tokenizerFrom } = model;
  const rows = await readTrajectories(cfg.data);
  const probe = criticBinsFor(cfg, 0);
  const { firstTokenId, addRows } = placeGrid(await tokenizerVocab(model), model.config.vocabSize, gridShape(probe).cells);
  const bins: CriticBins = { ...probe, first_token_id: firstTokenId };
  const base = lm.float32Weights();
  const config = growVocabulary(model.config, base, addRows, cfg.seed);

  const { examples, skipped, prompts } = criticTrainingExamples(rows, { bins, encode: (t) => tokenizer.encode(t), superviseFrom: cfg.supervise_from_trajectory, ablation: cfg.ablation, maxLength: cfg.max_length, where: cfg.data });
  if (examples.length === 0) throw new Error(`--data ${cfg.data}: no training sequence (${skipped} attempts longer than --max_length ${cfg.max_length}, or none at or after --supervise_from_trajectory ${cfg.supervise_from_trajectory})`);
  const packed = packCriticExamples(examples, cfg.max_length);

  const trained = recipeTensors(config, base, cfg);
  const { lora, params } = trained;
  const loss = criticLoss(config, bins, { packing: true, recompute: cfg.gradient_checkpointing, compute: cfg.compute_dtype, ...(trained.weights ? { weights: trained.weights } : {}) });

  const start = run.startFrom(params, cfg, CRITIC_TRAIN_RESUMABLE_KEYS, trained.init);
  let { state } = start;
  const { init } = start;
  const device = openDevice(cfg.device);
  const frozenBase = trained.frozenOn(device);
  const trainer = Trainer.create({ params, loss, optimizer: { weightDecay: cfg.weight_decay, maxGradNorm: cfg.max_grad_norm } }, { ...init, step: state.step }, { device, microBatches: cfg.micro_batches, frozen: frozenBase });
  const dropoutKeyed = trainer.batchInputs.includes(LORA_DROPOUT_KEY);
  try {
    run.saveConfig(cfg);
    const checkpoint = () => {
      const snap = trainer.snapshot();
      const weights = trained.merged(snap.params);
      return run.checkpoint(
        { config, model: weights, trainable: params, values: snap.params, m: snap.m, v: snap.v, state, lora: Boolean(lora) },
        {
          keepLast: cfg.keep_last,
          tokenizerFrom,
          onCheckpoint: (dir, step) => {
            saveBins(dir, bins);
            events.onCheckpoint?.(dir, step);
          },
        },
      );
    };
    events.onStart?.({ startStep: state.step, totalSteps: cfg.steps, prompts, sequences: examples.length, rows: packed.length, skipped, cells: gridShape(bins).cells, firstTokenId, addedRows: addRows, parameters: params.reduce((s, p) => s + sizeOf(p.shape), 0) });
    const stream = new EpochStream<CriticRow>(packed, cfg.seed, state.dataPosition);
    let lastLoss = NaN;
    let interrupted = false;
    while (state.step < cfg.steps) {
      const t0 = performance.now();
      const batchStart = stream.position;
      const batch = stream.take(cfg.batch_size);
      const labelTokens = criticLabelCount(batch);
      const lr = scheduledLr(cfg, state.step);
      const per = cfg.batch_size / cfg.micro_batches;
      const micro = Array.from({ length: cfg.micro_batches }, (_, k) => ({
        ...padCriticBatch(batch.slice(k * per, (k + 1) * per), tokenizer.padId),
        loss_tokens: f32(Math.max(1, labelTokens)),
        ...(dropoutKeyed ? { [LORA_DROPOUT_KEY]: loraDropoutKey(cfg.seed, trainer.step, k) } : {}),
      }));
      const hostMs0 = performance.now() - t0;
      const result = trainer.trainStep(micro, lr);
      if (!Number.isFinite(result.loss)) {
        const dir = checkpoint();
        throw new Error(`step ${state.step + 1}: the loss is ${result.loss} on packed rows ${batchStart}..${batchStart + cfg.batch_size - 1}; the weights before this step are saved in ${dir}. Lower --lr or check the data.`);
      }
      state = { ...state, step: state.step + 1, dataPosition: stream.position };
      lastLoss = result.loss;
      const tokens = batch.reduce((s, r) => s + r.ids.length, 0);
      const metrics: CriticStepMetrics = {
        step: state.step,
        loss: result.loss,
        cell_accuracy: (result.metrics.cell_correct ?? 0) / Math.max(1, labelTokens),
        label_tokens: labelTokens,
        ...stepTiming(result, { lr, tokens, prepMs: hostMs0 }),
      };
      events.onStep?.(metrics);
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
    trainer.dispose();
    for (const t of Object.values(frozenBase)) t.dispose();
    await run.close();
  }
}

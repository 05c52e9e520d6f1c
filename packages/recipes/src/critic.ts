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
import { criticLoss, defaultRewardValues, gridShape, growRows, logLengthEdges, placeGrid, saveBins, type CriticBins } from '@lathe/critic';
import { additionTokenizer } from './demo-task';
import { checkComputeDtype, loadRunModel, RunDir, type RunModel, type TrainRunEvents, type TrainRunResult } from './scaffold';
import { trainOnRows, type StepTimingFields } from './row-train';
import { CRITIC_TRAIN_RESUMABLE_KEYS, type CriticTrainConfig } from './critic-config';
import { criticLabelCount, criticTrainingExamples, packCriticExamples, padCriticBatch, type CriticRow } from './critic-data';

/** Metrics of one optimizer step (one line of metrics.jsonl). */
export type CriticStepMetrics = CriticStepFields & StepTimingFields;

/** A critic step's own metrics (beside the timing fields every step has). */
interface CriticStepFields {
  step: number;
  /** Mean cross-entropy of the labelled tokens' grid cells. */
  loss: number;
  /** Share of labelled tokens whose most likely cell is the label. */
  cell_accuracy: number;
  label_tokens: number;
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

  return trainOnRows<CriticRow, CriticStepFields>(cfg, run, {
    config,
    base,
    padId: tokenizer.padId,
    tokenizerFrom,
    rows: packed,
    resumableKeys: CRITIC_TRAIN_RESUMABLE_KEYS,
    loss: (c, o) => criticLoss(c, bins, { packing: true, ...o }),
    feeds: (batch, padId) => padCriticBatch(batch, padId),
    lossTokens: criticLabelCount,
    stepFields: ({ step, result, lossTokens }) => ({ step, loss: result.loss, cell_accuracy: (result.metrics.cell_correct ?? 0) / Math.max(1, lossTokens), label_tokens: lossTokens }),
    describeRows: (first, last) => `packed rows ${first}..${last}`,
    onStart: (info) => events.onStart?.({ ...info, prompts, sequences: examples.length, rows: packed.length, skipped, cells: gridShape(bins).cells, firstTokenId, addedRows: addRows }),
    onStep: events.onStep,
    onCheckpoint: (dir, step) => {
      saveBins(dir, bins);
      events.onCheckpoint?.(dir, step);
    },
  }, signal);
}

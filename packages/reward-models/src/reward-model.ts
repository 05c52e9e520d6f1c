/**
 * The reward model object: a decoder trunk and a `score` head, held as the weights of a
 * `…ForSequenceClassification` config (one score output, `pad_token_id` set), so it saves as a
 * Hugging Face sequence-classification checkpoint that transformers' `AutoModelForSequenceClassification`
 * loads, and loads back:
 *
 *   const rm = RewardModel.fromCausalLM(await CausalLM.fromPretrained('runs/sft/final'), { padTokenId, seed: 1 });
 *   rm.save('runs/rm/final');
 *   const back = await RewardModel.fromPretrained('runs/rm/final', { device: 'cuda' });
 *   const rewards = await back.score(batch);   // one per row, at its last real token
 */
import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { DType } from '@lathe/onnx';
import { CausalLM, readConfig, SCORE_WEIGHT, seededNormal, type CausalLMOptions, type DecoderConfig, type SaveOptions } from '@lathe/models';
import type { Device, DeviceKind, DeviceTensor } from '@lathe/runtime';
import type { BatchTensor } from '@lathe/train';
import { checkRewardConfig, rewardModelConfig } from './reward-graph';
import { RewardScorer, type RewardOutput, type ScorerOptions, type TokenBatch } from './scorers';

/** Options of {@link RewardModel.fromCausalLM}. */
export interface FromCausalLMOptions extends CausalLMOptions {
  /** The tokenizer's pad token id; default the causal LM's `pad_token_id` (one of the two is required). */
  padTokenId?: number;
  /** Seed of the score head's initial values (models' seeded RNG). Default 0. */
  seed?: number;
  /** Standard deviation of the score head's initial values. Default 0.02 (transformers' initializer_range). */
  std?: number;
}

/**
 * The attention a scorer of `mask`'s rows uses by default: 'gqa' (GroupQueryAttention, flash
 * attention) where it runs — on CUDA, in half precision, with every row right-padded (checked in a
 * host mask; a device mask cannot be read without a copy) — else 'composed'.
 */
export function scoringAttention(device: DeviceKind | undefined, dtype: DType, mask: BatchTensor): 'gqa' | 'composed' {
  if (device !== 'cuda' || dtype === 'float32' || !('data' in mask)) return 'composed';
  const { data, dims } = mask;
  const T = dims[dims.length - 1];
  for (let start = 0; start < data.length; start += T) {
    let padded = false;
    for (let t = 0; t < T; t++) {
      const real = Number(data[start + t]) !== 0;
      if (real && padded) return 'composed'; // a real token after padding: not right-padded
      if (!real) padded = true;
    }
  }
  return 'gqa';
}

/** A reward model: a decoder trunk and a linear score head read at each sequence's last real token. */
export class RewardModel {
  private readonly scorers = new Map<string, RewardScorer>();

  private constructor(
    /** The weights, as a model whose config is the reward model's (`…ForSequenceClassification`, `score.weight`, no LM head). */
    readonly model: CausalLM,
  ) {}

  /**
   * Loads a sequence-classification folder (config.json + safetensors with `score.weight`) onto
   * `opts.device` in `opts.dtype`, or as a view of its files. A causal-LM folder is an error naming
   * it: it has no score head (start from it with {@link fromCausalLM}).
   */
  static async fromPretrained(dir: string, opts: CausalLMOptions = {}): Promise<RewardModel> {
    const { config } = readConfig(dir);
    if (config.scoreLabels === undefined) {
      throw new Error(`${dir}: ${config.architecture} is a causal LM checkpoint with no score head (${SCORE_WEIGHT}); a reward model folder is a …ForSequenceClassification one (start one from a causal LM with RewardModel.fromCausalLM)`);
    }
    checkRewardConfig(config);
    return new RewardModel(await CausalLM.fromPretrained(dir, opts));
  }

  /**
   * A reward model from a causal LM: its decoder weights (the LM head dropped) and a new score head
   * drawn from N(0, std²) with the models RNG. On the LM's device unless `opts` says otherwise.
   */
  static fromCausalLM(lm: CausalLM, opts: FromCausalLMOptions = {}): RewardModel {
    const config = rewardModelConfig(lm.config, opts.padTokenId);
    const weights = new Map<string, Float32Array>();
    for (const [name, w] of lm.float32Weights()) if (name !== 'lm_head.weight') weights.set(name, w);
    const normal = seededNormal(opts.seed ?? 0);
    const std = opts.std ?? 0.02;
    weights.set(SCORE_WEIGHT, Float32Array.from({ length: config.hiddenSize }, () => std * normal()));
    const device = opts.device ?? lm.device;
    return RewardModel.fromWeights(config, weights, device ? { device, dtype: opts.dtype ?? (lm.device ? lm.dtype : undefined) } : {});
  }

  /** A reward model from float32 weights by HF name (a trainer's, merged): every parameter of `config`, a reward model's config. */
  static fromWeights(config: DecoderConfig, weights: ReadonlyMap<string, Float32Array>, opts: CausalLMOptions = {}): RewardModel {
    checkRewardConfig(config);
    return new RewardModel(CausalLM.fromWeights(config, weights, opts));
  }

  /** The reward model's config (`…ForSequenceClassification`, `scoreLabels` 1). */
  get config(): DecoderConfig {
    return this.model.config;
  }

  /** The device holding the weights, or undefined for a host model. */
  get device(): Device | undefined {
    return this.model.device;
  }

  /** dtype of the weights. */
  get dtype(): DType {
    return this.model.dtype;
  }

  /** The weights on the device by HF name (see `CausalLM.weights`). */
  get weights(): ReadonlyMap<string, DeviceTensor> {
    return this.model.weights;
  }

  /** Every weight as float32 by HF name (do not modify them: a host model's are its own arrays). */
  float32Weights(): Map<string, Float32Array> {
    return this.model.float32Weights();
  }

  /** The same reward model on `device` in `dtype` (see `CausalLM.to`). */
  to(device: Device | 'cpu' | 'cuda', dtype?: DType): RewardModel {
    return new RewardModel(this.model.to(device, dtype));
  }

  /**
   * Writes a sequence-classification checkpoint to `dir`: config.json (the architecture
   * `…ForSequenceClassification`, `id2label` of one label and `num_labels: 1`, `pad_token_id`) and
   * model.safetensors (the trunk under its HF names, `score.weight`, no `lm_head`).
   */
  save(dir: string, opts: SaveOptions = {}): void {
    this.model.save(dir, opts);
    // transformers counts labels by id2label; num_labels is written too, for readers of the file.
    const path = join(dir, 'config.json');
    const json = JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>;
    const tmp = join(dir, `.config.json.tmp-${process.pid}`);
    writeFileSync(tmp, JSON.stringify({ ...json, num_labels: 1 }, null, 2));
    renameSync(tmp, path);
  }

  /**
   * Rewards of `batch`'s rows, [B] (a session compiled on first use, kept until {@link dispose}).
   * The model must be on a device: load it with `{ device }` or call {@link to}. Attention is
   * `opts.attention`, else flash attention (GroupQueryAttention) where it runs — CUDA, half
   * precision, every row right-padded in a host mask — and the composed form otherwise.
   */
  async score(batch: TokenBatch, opts: Pick<ScorerOptions, 'attention'> = {}): Promise<Float32Array> {
    return this.scorer('rewards', { attention: opts.attention ?? scoringAttention(this.device?.kind, this.dtype, batch.attentionMask) }).score(batch, this.weights);
  }

  /** Values at every position of `batch`, [B·T] row-major (0 at padding): the model as a PPO value model. Attention as in {@link score}. */
  async values(batch: TokenBatch, opts: Pick<ScorerOptions, 'attention'> = {}): Promise<Float32Array> {
    return this.scorer('values', { attention: opts.attention ?? scoringAttention(this.device?.kind, this.dtype, batch.attentionMask) }).score(batch, this.weights);
  }

  /** Frees the scoring sessions and the device weights; the model is unusable afterwards. */
  dispose(): void {
    for (const s of this.scorers.values()) s.dispose();
    this.scorers.clear();
    this.model.dispose();
  }

  private scorer(output: RewardOutput, opts: Pick<ScorerOptions, 'attention'>): RewardScorer {
    const device = this.device;
    if (!device) throw new Error(`RewardModel: the weights are on the host${this.model.dir ? ` (${this.model.dir})` : ''}; load with { device } or call .to(device) to score`);
    const key = `${output}/${opts.attention ?? 'composed'}`;
    let s = this.scorers.get(key);
    if (!s) {
      s = RewardScorer.create(this.config, device, { output, dtype: this.dtype, attention: opts.attention });
      this.scorers.set(key, s);
    }
    return s;
  }
}

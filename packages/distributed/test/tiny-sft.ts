/**
 * The tiny SFT problem the data-parallel tests train (data-parallel, ZeRO, bfloat16 reductions): a
 * random Qwen3 whose norm and head sizes do not divide by 3 (so ZeRO over 3 ranks pads its shards),
 * its train-step spec, and seeded rows of varying length split over ranks as micro-batches.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM, randomModel, type DecoderConfig } from '@lathe/models';
import type { HostTensor } from '@lathe/runtime';
import { fullTrainableParams, sftLoss, type TrainableParam, type TrainStepSpec } from '@lathe/train';
import { shardOf } from '@lathe/distributed';

const tinyQwen3 = {
  architectures: ['Qwen3ForCausalLM'],
  vocab_size: 40,
  hidden_size: 16,
  intermediate_size: 24,
  num_hidden_layers: 2,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 8,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  max_position_embeddings: 64,
  tie_word_embeddings: false,
};

/** A seeded tiny model and what a Trainer needs to train it with the SFT loss. */
export interface TinySft {
  config: DecoderConfig;
  /** The random model's float32 weights, a trainer's start. */
  weights: Map<string, Float32Array>;
  params: TrainableParam[];
  /** Every parameter trained (matrices and embeddings decayed), AdamW with weight decay 0.1. */
  spec: TrainStepSpec;
}

/** The tiny Qwen3 with random weights (std 0.3) from `seed`, `layers` decoder layers, gradients clipped at `maxGradNorm` (0: off). */
export function tinySftSpec(opts: { seed: number; layers?: number; maxGradNorm?: number }): TinySft {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-distributed-'));
  const config = randomModel(dir, { ...tinyQwen3, num_hidden_layers: opts.layers ?? 2 }, { seed: opts.seed, std: 0.3 });
  const weights = CausalLM.fromPretrainedSync(dir).float32Weights();
  const params = fullTrainableParams(config);
  return { config, weights, params, spec: { params, loss: sftLoss(config), optimizer: { weightDecay: 0.1, maxGradNorm: opts.maxGradNorm ?? 1 } } };
}

/** One SFT row: token ids, the first `prompt` of which are not predicted. */
export interface SftRow {
  ids: number[];
  prompt: number;
}

/**
 * `n` deterministic rows from `seed` (a linear congruential generator): lengths 5 to `maxLength`,
 * so ranks' shards pad to different widths; ids 1 to 39; prompts of 2 to 4 tokens, or `prompt` each.
 */
export function sftRows(seed: number, n: number, opts: { maxLength?: number; prompt?: number } = {}): SftRow[] {
  let s = seed;
  const next = () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0);
  const lengths = (opts.maxLength ?? 13) - 4;
  return Array.from({ length: n }, () => {
    const len = 5 + (next() % lengths);
    return { ids: Array.from({ length: len }, () => 1 + (next() % 39)), prompt: opts.prompt ?? 2 + (next() % 3) };
  });
}

export const i64 = (v: number[], dims: number[]): HostTensor => ({ data: BigInt64Array.from(v.map(BigInt)), dims });

/** The loss tokens of `rows`: every token after its prompt. */
export const lossTokensOf = (rows: SftRow[]) => rows.reduce((s, r) => s + r.ids.length - r.prompt, 0);

/** Right-padded [B, T] inputs of the SFT loss; `lossTokens` is the whole optimizer batch's count, so shards' gradients add up to the batch's. */
export function sftBatch(rows: SftRow[], lossTokens: number): Record<string, HostTensor> {
  const T = Math.max(...rows.map((r) => r.ids.length));
  const ids: number[] = [];
  const mask: number[] = [];
  const loss: number[] = [];
  for (const r of rows) {
    for (let t = 0; t < T; t++) {
      ids.push(r.ids[t] ?? 0);
      mask.push(t < r.ids.length ? 1 : 0);
      loss.push(t < r.ids.length && t >= r.prompt ? 1 : 0);
    }
  }
  return { input_ids: i64(ids, [rows.length, T]), attention_mask: i64(mask, [rows.length, T]), loss_mask: i64(loss, [rows.length, T]), loss_tokens: { data: Float32Array.from([lossTokens]), dims: [] } };
}

/** Rank `rank`'s share of the global batch as `micro` micro-batches, each normalised by the global batch's loss tokens. */
export function rankBatches(global: SftRow[], rank: number, world: number, micro = 1): Record<string, HostTensor>[] {
  const mine = shardOf(global, rank, world);
  const per = mine.length / micro;
  return Array.from({ length: micro }, (_, k) => sftBatch(mine.slice(k * per, (k + 1) * per), lossTokensOf(global)));
}

/** Expects `a` within relative `tol` of `b`. */
export const relClose = (a: number, b: number, tol = 1e-5) => expect(Math.abs(a - b) / Math.max(Math.abs(b), 1e-12)).toBeLessThanOrEqual(tol);

/**
 * How far float32 weights and AdamW moments after a few steps may sit (absolutely) from one process's when the
 * gradients were summed in another order (over ranks, micro-batches or shards): the CPU's GEMM kernels (ONNX Runtime's
 * AVX2 or AVX-512 code) set the order inside each sum, and AdamW turns a rounding in a near-zero gradient into a step
 * of its own. Far below how far the steps move the weights (more than 1e-2).
 */
export const STEPS_TOL = 1e-5;

/** The in-run all-reduce tests' optimizer batch: 6 rows, split over 1, 2 or 3 ranks. */
export const OVERLAP_BATCH = 6;
/** Small buckets, so the tiny model's gradients make several bucket nodes. */
export const OVERLAP_BUCKET_BYTES = 4096;
/** Step `step`'s global batch: `n` rows of varying length (so ranks' shards pad to different widths). */
export const stepRows = (step: number, n: number) => sftRows(1000 + step, n);
/** Step `step`'s learning rate (changes each step, so a stale one shows). */
export const stepLr = (step: number) => 0.02 / (1 + step);

/**
 * The measurements of extract-bench.ts, callable at any shape (the test runs the tiny preset on the
 * CPU): Q-weighted generation against plain generation in one process, and the KL-distillation
 * train step against the SFT step on the same rows.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { DType } from '@lathe/onnx';
import { CausalLM, MODEL_PRESETS, paramSpecs, randomModel, seededRandom, type HfConfig, type ModelPresetName } from '@lathe/models';
import { Device, type DeviceKind } from '@lathe/runtime';
import { KvCacheGenerator } from '@lathe/rollout';
import { sftLoss, Trainer, type LossBuilder } from '@lathe/train';
import { logLengthEdges, type CriticBins } from '@lathe/critic';
import { extractionLoss, qWeightedSample, QWeightedModels } from '@lathe/policy-extraction';

/** What to measure. */
export interface ExtractBenchOptions {
  preset: ModelPresetName;
  /** A shape of its own instead of the preset's (tests: a small vocabulary). */
  config?: HfConfig;
  device: DeviceKind;
  compute: DType;
  /** Generation batches (rows stepped together), e.g. [64, 256]. */
  batches: number[];
  prompt: number;
  newTokens: number;
  minP: number;
  maxCandidates: number;
  tau: number;
  /** Training rows × length, candidates per position, steps timed (after one warm-up). */
  trainRows: number;
  trainLength: number;
  trainCandidates: number;
  steps: number;
  seed: number;
  /** Also time the KV-cache engine (needs head_dim a multiple of 16; on cuda, a half-precision compute). */
  kvCache: boolean;
  /** Also time Q-weighted sampling with the prefix recomputed every step (no KV caches). */
  recompute: boolean;
}

/** Tokens/s of each way of generating at one batch. */
export interface GenerationPoint {
  batch: number;
  new_tokens: number;
  /** The rollout engine's min-p sampling (prefill + KV-cache decode steps): the plain baseline. */
  kv_cache_tokens_per_s: number | null;
  /** π_ref's min-p sampling through the step models (over the reference's KV cache, no critic). */
  step_plain_tokens_per_s: number;
  /** Q-weighted: the step models with the critic scoring every candidate each step, both over KV caches. */
  q_weighted_tokens_per_s: number;
  /** Q-weighted with each step reading the whole prefix again (no caches), when measured. */
  q_weighted_recompute_tokens_per_s: number | null;
  candidates_per_step: number;
  /** Device bytes of both models' KV caches in the Q-weighted run (each allocated once at batch × (prompt + new tokens) positions). */
  q_weighted_cache_bytes: number;
}

/** Everything the bench reports. */
/** A training phase's timing, or why it could not run on this device. */
export type TrainTiming = { step_ms: number; tokens_per_s: number } | { error: string };

export interface ExtractBenchResult {
  preset: string;
  device: DeviceKind;
  compute: DType;
  generation: GenerationPoint[];
  train: {
    rows: number;
    length: number;
    candidates: number;
    /** `lathe extract train`'s loss: the KL and the candidate-mass term (which reads the full vocabulary's log-partition). */
    kl: TrainTiming;
    /** The KL alone (candidate-mass weight 0): only the candidates' rows of the LM head. */
    kl_alone: TrainTiming;
    sft: TrainTiming;
    /** null when either phase failed. */
    kl_vs_sft: number | null;
  };
}

const round = (v: number, d = 1) => Number(v.toFixed(d));

/** Runs the bench; the random model is written to a temporary folder (removed after). */
export async function measureExtract(o: ExtractBenchOptions): Promise<ExtractBenchResult> {
  const preset = MODEL_PRESETS[o.preset];
  if (!preset && !o.config) throw new Error(`--preset: one of ${Object.keys(MODEL_PRESETS).join(', ')}`);
  const dir = mkdtempSync(join(tmpdir(), 'extract-bench-'));
  try {
    const config = randomModel(dir, o.config ?? preset.config, { seed: o.seed, std: 0.02 });
    const host = CausalLM.fromPretrainedSync(dir);
    const weights = host.float32Weights();
    const device = Device.open(o.device);
    const next = seededRandom(o.seed);
    const token = () => 10 + Math.floor(next() * Math.min(150000, config.vocabSize - 300));
    // the critic is the same random model: its grid of 2 × 16 cells sits in the last rows (Qwen3's spare rows from 151669)
    const bins: CriticBins = { reward_values: [0, 1], length_edges: logLengthEdges(4096, 16), first_token_id: config.vocabSize - 267 };

    const generation: GenerationPoint[] = [];
    const open = (kvCache: boolean) => QWeightedModels.open({ device, reference: { name: 'policy', config, weights }, critic: { name: 'critic', config, weights }, bins, minP: o.minP, maxCandidates: o.maxCandidates, compute: o.compute, padId: 0, kvCache });
    const models = open(true);
    const whole = o.recompute ? open(false) : undefined;
    const kvModel = o.kvCache ? CausalLM.fromPretrainedSync(dir, { device, dtype: o.compute }) : undefined;
    try {
      for (const batch of o.batches) {
        const prompts = Array.from({ length: batch }, () => Array.from({ length: o.prompt }, token));
        const requests = prompts.map((prompt, key) => ({ prompt, key }));
        const timed = async (f: () => Promise<unknown>) => {
          const t0 = performance.now();
          await f();
          return (batch * o.newTokens) / ((performance.now() - t0) / 1000);
        };
        let kv: number | null = null;
        if (kvModel) {
          const gen = KvCacheGenerator.create(kvModel, { rows: batch, maxLength: o.prompt + o.newTokens, minP: o.minP, dtype: o.compute, cudaGraph: o.device === 'cuda' });
          try {
            const call = { maxNewTokens: o.newTokens, seed: o.seed, stopIds: [] as number[] };
            await gen.generate(prompts, { ...call, maxNewTokens: 2 }); // warm-up
            kv = await timed(() => gen.generate(prompts, call));
          } finally {
            gen.dispose();
          }
        }
        const sample = (tau: number, maxTokens: number, m = models) => qWeightedSample(requests, m, { tau, score: Number.isFinite(tau), maxTokens, seed: o.seed, stopIds: [], batchSize: batch });
        await sample(o.tau, 2); // warm-up of every session
        if (whole) await sample(o.tau, 2, whole);
        let candidates = 0;
        let cacheBytes = 0;
        const plain = await timed(() => sample(Infinity, o.newTokens));
        const q = await timed(async () => {
          const out = await sample(o.tau, o.newTokens);
          candidates = out.reduce((s, x) => s + x.candidate_ids.reduce((a, c) => a + c.length, 0), 0) / (batch * o.newTokens);
          cacheBytes = models.cacheBytes();
        });
        const recompute = whole ? await timed(() => sample(o.tau, o.newTokens, whole)) : null;
        generation.push({
          batch,
          new_tokens: o.newTokens,
          kv_cache_tokens_per_s: kv === null ? null : Math.round(kv),
          step_plain_tokens_per_s: Math.round(plain),
          q_weighted_tokens_per_s: Math.round(q),
          q_weighted_recompute_tokens_per_s: recompute === null ? null : Math.round(recompute),
          candidates_per_step: round(candidates, 2),
          q_weighted_cache_bytes: cacheBytes,
        });
      }
    } finally {
      models.dispose();
      whole?.dispose();
      kvModel?.dispose();
    }

    // ---- training: the same rows through the KL loss and the SFT loss
    const dims = [o.trainRows, o.trainLength];
    const K = o.trainCandidates;
    const n = o.trainRows * o.trainLength;
    const ids = BigInt64Array.from({ length: n }, () => BigInt(token()));
    const mask = new BigInt64Array(n).fill(1n);
    const promptLen = Math.min(64, Math.floor(o.trainLength / 4));
    const lossMask = BigInt64Array.from({ length: n }, (_, i) => (i % o.trainLength >= promptLen ? 1n : 0n));
    const candIds = new BigInt64Array(n * K);
    const candMask = new BigInt64Array(n * K);
    const ref = new Float32Array(n * K);
    const qv = new Float32Array(n * K);
    for (let i = 0; i < n; i++) {
      const t = i % o.trainLength;
      if (t < promptLen - 1 || t === o.trainLength - 1) continue; // positions that predict an output token
      for (let k = 0; k < K; k++) {
        candIds[i * K + k] = k === 0 ? ids[i + 1] : BigInt(token());
        candMask[i * K + k] = 1n;
        ref[i * K + k] = Math.log((K - k) / ((K * (K + 1)) / 2));
        qv[i * K + k] = next();
      }
    }
    const positions = Number(candMask.reduce((s, m, i) => s + (i % K === 0 ? m : 0n), 0n));
    // a phase that cannot run here reports its error instead of hiding the generation numbers
    const timeSteps = (loss: LossBuilder, feeds: Record<string, { data: BigInt64Array | Float32Array; dims: number[] }>): TrainTiming => {
      try {
        return timeStepsOf(loss, feeds);
      } catch (e) {
        return { error: (e as Error).message };
      }
    };
    const timeStepsOf = (loss: LossBuilder, feeds: Record<string, { data: BigInt64Array | Float32Array; dims: number[] }>) => {
      const params = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
      const trainer = Trainer.create({ params, loss, optimizer: { weightDecay: 0, maxGradNorm: 1 } }, { params: new Map([...weights].map(([k, v]) => [k, Float32Array.from(v)])) }, { device });
      const ms: number[] = [];
      try {
        for (let s = 0; s <= o.steps; s++) {
          const r = trainer.trainStep([feeds], 1e-5);
          if (!Number.isFinite(r.loss)) throw new Error(`train step ${s}: loss ${r.loss}`);
          if (s > 0) ms.push(r.runMs + r.hostMs);
        }
      } finally {
        trainer.dispose();
      }
      const mean = ms.reduce((a, b) => a + b, 0) / ms.length;
      return { step_ms: round(mean), tokens_per_s: Math.round(n / (mean / 1000)) };
    };
    const base = { input_ids: { data: ids, dims }, attention_mask: { data: mask, dims } };
    const klFeeds = {
      ...base,
      candidate_ids: { data: candIds, dims: [...dims, K] },
      candidate_mask: { data: candMask, dims: [...dims, K] },
      candidate_ref_logprobs: { data: ref, dims: [...dims, K] },
      candidate_q_values: { data: qv, dims: [...dims, K] },
      loss_tokens: { data: Float32Array.from([positions]), dims: [] },
    };
    const kl = timeSteps(extractionLoss(config, { tau: o.tau, compute: o.compute, candidateMass: 1 }), klFeeds);
    const klAlone = timeSteps(extractionLoss(config, { tau: o.tau, compute: o.compute }), klFeeds);
    const lossTokens = Number(lossMask.reduce((s, m) => s + m, 0n));
    const sft = timeSteps(sftLoss(config, { compute: o.compute }), { ...base, loss_mask: { data: lossMask, dims }, loss_tokens: { data: Float32Array.from([lossTokens]), dims: [] } });
    return { preset: o.config ? 'custom' : o.preset, device: o.device, compute: o.compute, generation, train: { rows: o.trainRows, length: o.trainLength, candidates: K, kl, kl_alone: klAlone, sft, kl_vs_sft: 'tokens_per_s' in kl && 'tokens_per_s' in sft ? round(kl.tokens_per_s / sft.tokens_per_s, 3) : null } };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

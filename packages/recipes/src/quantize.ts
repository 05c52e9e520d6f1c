/**
 * The runs behind `lathe quantize` (a model folder → a quantized checkpoint) and `lathe quantize
 * eval` (what it changed: KL and perplexity on tokens the original generated for a causal LM;
 * pairwise accuracy and score correlation for a reward model).
 */
import { existsSync, readdirSync } from 'node:fs';
import { resolve } from 'node:path';
import * as L from '@lathe/onnx';
import { readJsonlAll } from '@lathe/data';
import { CausalLM, isProjectionWeight, paramSpecs, readConfig, type DecoderConfig } from '@lathe/models';
import { addDistributionShift, checkScheme, isQuantizedConfig, loadQuantized, pearson, QuantizedModel, saveQuantized, SHIFT_IO, ShiftAccumulator, type DenseDtype, type QuantizationReport, type QuantScheme, type ShiftSummary } from '@lathe/quantization';
import { sequenceRewards } from '@lathe/reward-models';
import { MathGrader } from '@lathe/graders';
import { Generator, type Completion } from '@lathe/rollout';
import { Device, type DeviceTensor, type HostTensor } from '@lathe/runtime';
import { scorePairs } from './preference-batches';
import { preferenceEncoder, readPreferenceData, tokenizePreferences } from './preference-data';
import type { QuantizeConfig, QuantizeEvalConfig } from './quantize-config';
import { loadRunModel } from './scaffold';

/** What `lathe quantize` wrote. */
export interface QuantizeSummary extends QuantizationReport {
  out: string;
  /** Weights left dense by --skip. */
  skipped: string[];
}

/** The scheme a `lathe quantize` config asks for (flags checked against the format). */
export function quantizeScheme(cfg: { format: QuantScheme['format']; block_size: number; zero_points: boolean; double_quant: boolean }): QuantScheme {
  const s: QuantScheme = { format: cfg.format, blockSize: cfg.format === 'int8' ? undefined : cfg.block_size, zeroPoints: cfg.zero_points || undefined, doubleQuant: cfg.double_quant || undefined };
  try {
    checkScheme(s);
  } catch (e) {
    const msg = (e as Error).message;
    const flag = /block size/.test(msg) ? '--block_size' : /double/.test(msg) ? '--double_quant' : /zero points/.test(msg) ? '--zero_points' : '--format';
    throw new Error(`${flag}: ${msg}`);
  }
  return s;
}

/** Quantizes `cfg.model`'s projections and writes the checkpoint to `cfg.out`. */
export function runQuantize(cfg: QuantizeConfig, events: { onProgress?(done: number, total: number, name: string): void } = {}): QuantizeSummary {
  if (cfg.model === '') throw new Error('--model is required (the model folder to quantize)');
  if (cfg.out === '') throw new Error('--out is required (the folder to write the quantized checkpoint to)');
  if (resolve(cfg.out) === resolve(cfg.model)) throw new Error(`--out ${cfg.out} is the model folder: write the quantized checkpoint elsewhere`);
  if (existsSync(cfg.out) && readdirSync(cfg.out).some((f) => f === 'config.json' || f.endsWith('.safetensors')) && !cfg.overwrite) {
    throw new Error(`--out ${cfg.out} already holds a model (pass --overwrite to replace it)`);
  }
  const scheme = quantizeScheme(cfg);
  if (!existsSync(`${cfg.model}/config.json`)) throw new Error(`--model ${cfg.model}: no config.json in that folder (expected a Hugging Face model folder)`);
  const { raw } = readConfig(cfg.model);
  if (isQuantizedConfig(raw)) {
    const method = (raw.quantization_config as { quant_method?: unknown }).quant_method;
    throw new Error(`--model ${cfg.model} is already quantized (config.json quantization_config, quant_method ${JSON.stringify(method)}): quantize the original model`);
  }
  const lm = CausalLM.fromPretrainedSync(cfg.model);
  const skip = cfg.skip.split(',').map((s) => s.trim()).filter(Boolean);
  const skipped = paramSpecs(lm.config).filter((s) => isProjectionWeight(s.name) && skip.some((p) => s.name.includes(p))).map((s) => s.name);
  if (skip.length > 0 && skipped.length === 0) throw new Error(`--skip ${cfg.skip}: no projection weight name contains any of those parts`);
  if (cfg.lm_head !== 'none' && lm.config.scoreLabels !== undefined) throw new Error(`--lm_head ${cfg.lm_head}: ${cfg.model} is a reward model (a score head, no LM head)`);
  const lmHead = cfg.lm_head === 'none' ? undefined : quantizeScheme({ format: cfg.lm_head, block_size: cfg.lm_head === 'int4' ? cfg.block_size : 64, zero_points: false, double_quant: false });
  const q = QuantizedModel.quantize(lm.config, lm.float32Weights(), { ...scheme, lmHead, include: (n) => isProjectionWeight(n) && !skipped.includes(n), onProgress: events.onProgress });
  const denseDtype: DenseDtype = lm.dtype === 'float32' || lm.dtype === 'float16' ? lm.dtype : 'bfloat16';
  saveQuantized(cfg.out, q, { denseDtype, rawConfig: raw, tokenizerFrom: cfg.model });
  return { out: cfg.out, ...q.report(denseDtype === 'float32' ? 32 : 16), skipped };
}

/** `lathe quantize eval` on a causal LM. */
export interface PolicyShiftSummary extends ShiftSummary {
  kind: 'causal_lm';
  prompts: number;
  /**
   * Where rows carry an "answer": each model's greedy continuation judged by the math grader
   * (the quantized model's generated from its dequantized weights).
   */
  task?: { graded: number; accuracyOriginal: number; accuracyQuantized: number };
}

/** `lathe quantize eval` on a reward model. */
export interface RewardShiftSummary {
  kind: 'reward_model';
  pairs: number;
  accuracyOriginal: number;
  accuracyQuantized: number;
  /** Pearson correlation of the two models' rewards over every scored sequence. */
  scoreCorrelation: number;
  /** Mean |r_quantized − r_original|. */
  meanAbsScoreChange: number;
  skipped: { overLength: number; identical: number };
}

/** Compares a quantized checkpoint with its original: see {@link PolicyShiftSummary} and {@link RewardShiftSummary}. */
export async function runQuantizeEval(cfg: QuantizeEvalConfig, events: { onProgress?(done: number, total: number): void } = {}): Promise<PolicyShiftSummary | RewardShiftSummary> {
  if (cfg.model === '') throw new Error('--model is required (the original model folder)');
  if (cfg.quantized === '') throw new Error('--quantized is required (the quantized checkpoint)');
  if (cfg.data === '') throw new Error('--data is required (prompts for a causal LM, preference pairs for a reward model)');
  if (cfg.compute_dtype !== 'float32' && cfg.device !== 'cuda') throw new Error(`--compute_dtype ${cfg.compute_dtype} needs --device cuda`);
  const quantized = loadQuantized(cfg.quantized);
  const model = await loadRunModel({ ...cfg, run_dir: '.', seed: 0 });
  if (isQuantizedConfig(readConfig(cfg.model).raw)) throw new Error(`--model ${cfg.model} is itself quantized: give the original model`);
  if (!sameShape(model.config, quantized.config)) throw new Error(`--quantized ${cfg.quantized}: its config does not match --model ${cfg.model} (another model's checkpoint?)`);
  const original = QuantizedModel.fromParts(model.config, quantized.scheme, model.lm.float32Weights(), new Map());
  const device = Device.open(cfg.device);
  const dtype = cfg.compute_dtype;
  const mode = cfg.kernels === 'dequantize' ? 'dequantize' : 'kernel';
  const tensors = new Map<string, DeviceTensor>([...original.deviceTensors(device, dtype, 'original/'), ...quantized.deviceTensors(device, dtype, 'quantized/')]);
  try {
    const g = new L.Graph(model.config.scoreLabels === undefined ? 'quantize_shift' : 'quantize_rewards');
    const wo = original.graphWeights(g, { dtype, prefix: 'original/' }).weights;
    const wq = quantized.graphWeights(g, { dtype, prefix: 'quantized/', mode });
    if (model.config.scoreLabels !== undefined) {
      const ids = g.input(SHIFT_IO.inputIds, 'int64', ['B', 'T']);
      const mask = g.input(SHIFT_IO.attentionMask, 'int64', ['B', 'T']);
      g.output(L.cast(sequenceRewards(model.config, wo, ids, mask), 'float32'), 'rewards_original');
      g.output(L.cast(sequenceRewards(model.config, wq.weights, ids, mask), 'float32'), 'rewards_quantized');
    } else addDistributionShift(g, model.config, wo, wq.weights);
    const session = device.compile(g, { name: g.name });
    try {
      const run = async (feeds: Record<string, HostTensor>, outputs: string[]) => {
        const out = await session.run({ ...feeds, ...Object.fromEntries(tensors) }, { outputs });
        return outputs.map((o) => out[o].data as Float32Array);
      };
      return model.config.scoreLabels === undefined ? await policyShift(cfg, model, run, events) : await rewardShift(cfg, model, run, events);
    } finally {
      session.dispose();
    }
  } finally {
    for (const t of tensors.values()) t.dispose();
  }
}

type ShiftRun = (feeds: Record<string, HostTensor>, outputs: string[]) => Promise<Float32Array[]>;
type EvalModel = Awaited<ReturnType<typeof loadRunModel>>;

/** Greedy continuations by the original, then KL and log-probs of both models on the generated tokens. */
async function policyShift(cfg: QuantizeEvalConfig, model: EvalModel, run: ShiftRun, events: { onProgress?(done: number, total: number): void }): Promise<PolicyShiftSummary> {
  const rows = await readJsonlAll(cfg.data);
  const limited = cfg.limit > 0 ? rows.slice(0, cfg.limit) : rows;
  const answers = limited.map((r) => (typeof r.value.answer === 'string' || typeof r.value.answer === 'number' ? String(r.value.answer) : undefined));
  const prompts = limited.map((r) => {
    const p = r.value.prompt;
    if (typeof p !== 'string' || p === '') throw new Error(`--data ${cfg.data}: line ${r.line} has no "prompt" text`);
    return model.tokenizer.encodePrompt(p);
  });
  if (prompts.length === 0) throw new Error(`--data ${cfg.data}: no prompts`);
  const completions = await greedyCompletions(model.lm, prompts, cfg, model.tokenizer);
  const acc = new ShiftAccumulator();
  for (let start = 0; start < prompts.length; start += cfg.batch_size) {
    const batch = completions.slice(start, start + cfg.batch_size).map((c) => ({ prompt: prompts[c.promptIndex], tokens: c.tokens }));
    const T = Math.max(...batch.map((b) => b.prompt.length + b.tokens.length));
    const B = batch.length;
    const ids = new BigInt64Array(B * T);
    const mask = new BigInt64Array(B * T);
    const targets = new BigInt64Array(B * T);
    const scored = new Uint8Array(B * T);
    batch.forEach((b, r) => {
      const seq = [...b.prompt, ...b.tokens];
      seq.forEach((t, i) => {
        ids[r * T + i] = BigInt(t);
        mask[r * T + i] = 1n;
        if (i + 1 < seq.length) targets[r * T + i] = BigInt(seq[i + 1]);
        // Position i predicts token i + 1: score the predictions of the generated tokens.
        if (i + 1 >= b.prompt.length && i + 1 < seq.length) scored[r * T + i] = 1;
      });
    });
    const dims = [B, T];
    const [kl, lo, lq] = await run({ [SHIFT_IO.inputIds]: { data: ids, dims }, [SHIFT_IO.attentionMask]: { data: mask, dims }, [SHIFT_IO.targets]: { data: targets, dims } }, [SHIFT_IO.kl, SHIFT_IO.logpOriginal, SHIFT_IO.logpQuantized]);
    acc.add(kl, lo, lq, scored);
    events.onProgress?.(Math.min(prompts.length, start + B), prompts.length);
  }
  const graded = answers.flatMap((a, i) => (a === undefined ? [] : [i]));
  if (graded.length === 0) return { kind: 'causal_lm', prompts: prompts.length, ...acc.summary() };
  const quantizedCompletions = await greedyCompletions(CausalLM.fromPretrainedSync(cfg.quantized), prompts, cfg, model.tokenizer);
  const grader = new MathGrader();
  const accuracy = async (cs: Completion[]) => {
    const text = new Map(cs.map((c) => [c.promptIndex, model.tokenizer.decode(c.tokens.filter((t) => t !== model.tokenizer.eosId))] as const));
    let right = 0;
    for (const i of graded) if ((await grader.grade(text.get(i)!, answers[i]!)).correct) right++;
    return right / graded.length;
  };
  return { kind: 'causal_lm', prompts: prompts.length, ...acc.summary(), task: { graded: graded.length, accuracyOriginal: await accuracy(completions), accuracyQuantized: await accuracy(quantizedCompletions) } };
}

/** Greedy continuations of `prompts` by `lm`, stopping at EOS. */
async function greedyCompletions(lm: CausalLM, prompts: number[][], cfg: QuantizeEvalConfig, tokenizer: EvalModel['tokenizer']): Promise<Completion[]> {
  const gen = await Generator.create(lm, { temperature: 0, device: cfg.device, dtype: cfg.compute_dtype, padTokenId: tokenizer.padId, maxPromptsPerRun: cfg.batch_size });
  try {
    return await gen.generate(prompts, { maxNewTokens: cfg.max_new_tokens, stopIds: tokenizer.eosId === undefined ? [] : [tokenizer.eosId] });
  } finally {
    await gen.dispose();
  }
}

/** Both models' rewards on the pairs: accuracy of each, and how well the rewards agree. */
async function rewardShift(cfg: QuantizeEvalConfig, model: EvalModel, run: ShiftRun, events: { onProgress?(done: number, total: number): void }): Promise<RewardShiftSummary> {
  const data = await readPreferenceData(cfg.data);
  const examples = cfg.limit > 0 ? data.examples.slice(0, cfg.limit) : data.examples;
  const { pairs, skipped } = tokenizePreferences(examples, await preferenceEncoder(model, cfg), { maxLength: cfg.max_length, what: cfg.data });
  if (pairs.length === 0) throw new Error(`--data ${cfg.data}: no pairs to score (${skipped.overLength} over --max_length)`);
  const quantizedRewards: Float32Array[] = [];
  let done = 0;
  const orig = await scorePairs(pairs, cfg.batch_size, model.tokenizer.padId, async (b) => {
    const [ro, rq] = await run({ [SHIFT_IO.inputIds]: b.inputIds as HostTensor, [SHIFT_IO.attentionMask]: b.attentionMask as HostTensor }, ['rewards_original', 'rewards_quantized']);
    quantizedRewards.push(rq.slice(0, 2 * b.pairs));
    events.onProgress?.((done += b.pairs), pairs.length);
    return ro;
  });
  // scorePairs lays each batch out as [chosen…, rejected…]: the same order for the quantized rewards.
  const qc = new Float32Array(pairs.length);
  const qr = new Float32Array(pairs.length);
  let at = 0;
  for (const r of quantizedRewards) {
    const n = r.length / 2;
    qc.set(r.subarray(0, n), at);
    qr.set(r.subarray(n), at);
    at += n;
  }
  const accuracy = (c: Float32Array, r: Float32Array) => c.reduce((s, x, i) => s + (x > r[i] ? 1 : 0), 0) / c.length;
  const all = (c: Float32Array, r: Float32Array) => [...c, ...r];
  const so = all(orig.chosen, orig.rejected);
  const sq = all(qc, qr);
  return {
    kind: 'reward_model',
    pairs: pairs.length,
    accuracyOriginal: accuracy(orig.chosen, orig.rejected),
    accuracyQuantized: accuracy(qc, qr),
    scoreCorrelation: pearson(so, sq),
    meanAbsScoreChange: so.reduce((s, x, i) => s + Math.abs(sq[i] - x), 0) / so.length,
    skipped: { overLength: skipped.overLength, identical: data.identical + skipped.identical },
  };
}

function sameShape(a: DecoderConfig, b: DecoderConfig): boolean {
  return JSON.stringify(paramSpecs(a)) === JSON.stringify(paramSpecs(b));
}

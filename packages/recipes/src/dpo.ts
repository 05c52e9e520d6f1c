/**
 * `lathe dpo`, top to bottom: load the policy, tokenizer and preference pairs → hold pairs out →
 * tokenize (pairs over max_length or identical skipped and counted) → the reference's response
 * log-probs, scored once for every pair by the starting model and cached in the run directory →
 * the DPO (or IPO) loss through the Trainer → loop over optimizer steps, logging metrics, scoring
 * the held-out pairs and checkpointing the policy as a causal-LM folder → a final evaluation and
 * checkpoint. Resumes exactly (the cached reference log-probs are read back) and saves a checkpoint
 * when interrupted.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { CausalLM, paramCount, readSafetensorsHeader, readTensorBytes, writeSafetensors, type DecoderConfig } from '@lathe/models';
import { dpoLoss, dpoMetrics, dpoReduction, dpoSums, ResponseLogprobScorer, type DpoMetrics, type LogprobReduction, type PreferencePair } from '@lathe/reward-models';
import { bytesToFloat32, Device } from '@lathe/runtime';
import type { DpoRunConfig } from './dpo-config';
import { scorePairs } from './preference-batches';
import { loadPreferenceSplit } from './preference-data';
import { checkPairOptions, runPairTraining, startPairTraining, type PairRunStart, type PairStepTiming } from './pair-run';
import { inPairSession } from './pair-session';
import type { RunDir, TrainRunEvents, TrainRunResult } from './scaffold';

/** DPO's pairwise metrics, of a step's pairs or the held-out ones. */
export interface DpoPairMetrics {
  /** Share of the pairs whose chosen response has the higher implicit reward β·(log π − log π_ref). */
  accuracy: number;
  /** Mean implicit-reward margin, chosen minus rejected. */
  margin: number;
  chosen_reward: number;
  rejected_reward: number;
  /** Mean policy log-prob of the chosen (rejected) responses (summed over tokens; averaged with --loss_type ipo). */
  chosen_logp: number;
  rejected_logp: number;
}

/** Metrics of one optimizer step (one line of metrics.jsonl). */
export type DpoStepMetrics = { step: number; loss: number } & DpoPairMetrics & PairStepTiming;

/** The held-out pairs scored at one step. */
export type DpoEvalResult = { step: number; pairs: number } & DpoPairMetrics;

/** Callbacks for progress display. */
export interface DpoEvents extends TrainRunEvents<DpoStepMetrics, DpoEvalResult> {
  onStart?(info: PairRunStart & { parameters: number; referenceCached: boolean }): void;
}

/** What a run returns; its checkpoint is a causal-LM folder. */
export type DpoResult = TrainRunResult<DpoEvalResult>;

/** The reference log-probs' file in the run directory. */
export const REFERENCE_LOGPS_FILE = 'reference_logps.safetensors';

function dpoFields(m: DpoMetrics): DpoPairMetrics {
  return { accuracy: m.accuracy, margin: m.margin, chosen_reward: m.chosenReward, rejected_reward: m.rejectedReward, chosen_logp: m.chosenLogp, rejected_logp: m.rejectedLogp };
}

/** Each pair's reference log-probs [chosen, rejected]. */
type ReferenceLogps = Map<PreferencePair, [number, number]>;

/** What the cached reference log-probs depend on: a cache that differs in any is scored again. */
function referenceKey(cfg: DpoRunConfig, pairs: number, reduction: LogprobReduction): Record<string, string> {
  return { model: cfg.model, data: cfg.data, pairs: String(pairs), max_length: String(cfg.max_length), prompt_format: cfg.prompt_format, enable_thinking: String(cfg.enable_thinking), reduction, compute_dtype: cfg.compute_dtype, seed: String(cfg.seed), eval_examples: String(cfg.eval_examples) };
}

/**
 * The reference's response log-probs of `pairs`: read back from the run directory when a cache of
 * the same pairs is there (a resume), else scored once by the starting model (`master`, uploaded
 * to `device` in the compute dtype for the duration) in batches, and cached.
 */
async function referenceLogps(run: RunDir, cfg: DpoRunConfig, device: Device, config: DecoderConfig, master: ReadonlyMap<string, Float32Array>, pairs: PreferencePair[], o: { reduction: LogprobReduction; padId: number }): Promise<{ logps: ReferenceLogps; cached: boolean }> {
  const file = join(run.dir, REFERENCE_LOGPS_FILE);
  const { reduction, padId } = o;
  const key = referenceKey(cfg, pairs.length, reduction);
  const byPair = (chosen: Float32Array, rejected: Float32Array): ReferenceLogps => new Map(pairs.map((p, i) => [p, [chosen[i], rejected[i]]]));
  if (run.latest && existsSync(file)) {
    const { tensors, metadata } = readSafetensorsHeader(file);
    if (Object.entries(key).every(([k, v]) => metadata[k] === v)) {
      const read = (name: string) => {
        const t = tensors.find((e) => e.name === name);
        if (!t) throw new Error(`${file}: no tensor '${name}'`);
        return bytesToFloat32(readTensorBytes(t), t.dtype, `${file}: '${name}'`);
      };
      return { logps: byPair(read('chosen'), read('rejected')), cached: true };
    }
  }
  const reference = CausalLM.fromWeights(config, master, { device, dtype: cfg.compute_dtype });
  const scorer = ResponseLogprobScorer.forModel(reference, { reduction });
  try {
    const { chosen, rejected } = await scorePairs(pairs, cfg.batch_size, padId, (b) => scorer.score(b));
    const bytes = (a: Float32Array) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
    writeSafetensors(file, [
      { name: 'chosen', dtype: 'float32', shape: [pairs.length], data: bytes(chosen) },
      { name: 'rejected', dtype: 'float32', shape: [pairs.length], data: bytes(rejected) },
    ], key);
    return { logps: byPair(chosen, rejected), cached: false };
  } finally {
    scorer.dispose();
    reference.dispose();
  }
}

/** The `ref_logp` input of `pairs` (chosen rows first, as a pair batch orders them). */
function refFeed(logps: ReferenceLogps, pairs: readonly PreferencePair[]) {
  const data = new Float32Array(2 * pairs.length);
  pairs.forEach((p, i) => {
    const [c, r] = logps.get(p)!;
    data[i] = c;
    data[pairs.length + i] = r;
  });
  return { data, dims: [data.length] };
}

/** Runs DPO as configured. `signal` interrupts the run after the current step, with a checkpoint. */
export async function runDpo(cfg: DpoRunConfig, events: DpoEvents = {}, signal?: AbortSignal): Promise<DpoResult> {
  checkPairOptions(cfg);
  if (!(cfg.beta > 0)) throw new Error(`--beta ${cfg.beta}: β must be > 0`);
  if (cfg.loss_type === 'ipo' && cfg.label_smoothing !== 0) throw new Error(`--label_smoothing ${cfg.label_smoothing} applies to --loss_type sigmoid, not ipo`);
  return inPairSession(cfg, async ({ dp, run, model, hold }) => {
    if (model.config.scoreLabels !== undefined) throw new Error(`--model ${cfg.model} is a reward model (${model.config.architecture}); DPO trains a causal LM`);
    const data = await loadPreferenceSplit(cfg, model);
    const { held } = data;
    const padId = model.tokenizer.padId;
    const config = model.config;
    const dpo = { beta: cfg.beta, loss: cfg.loss_type, labelSmoothing: cfg.label_smoothing };
    const reduction = dpoReduction(dpo);

    const master = model.lm.float32Weights();
    const training = hold(startPairTraining(cfg, run, data, { config, master, tokenizer: { padId, from: model.tokenizerFrom }, loss: (o) => dpoLoss(config, { ...dpo, ...o }) }, dp));
    // the reference is the starting model, never trained: its log-probs are scored once per pair
    const { logps: reference, cached } = await referenceLogps(run, cfg, training.device, config, master, [...data.train.pairs, ...held.pairs], { reduction, padId });
    const heldRef = refFeed(reference, held.pairs).data;
    const policy = hold(ResponseLogprobScorer.create(config, training.device, { reduction }));
    return runPairTraining({
      training,
      evaluate: async (step, weights): Promise<DpoEvalResult> => {
        const r = await scorePairs(held.pairs, cfg.batch_size, padId, (b) => policy.score(b, weights));
        const policyLogps = new Float32Array([...r.chosen, ...r.rejected]);
        const P = held.pairs.length;
        run.writeEval(
          step,
          held.examples.map((e, i) => {
            const chosenReward = cfg.beta * (r.chosen[i] - heldRef[i]);
            const rejectedReward = cfg.beta * (r.rejected[i] - heldRef[P + i]);
            return { where: e.where, prompt: e.prompt, chosen: e.chosen, rejected: e.rejected, chosen_logp: r.chosen[i], rejected_logp: r.rejected[i], chosen_reward: chosenReward, rejected_reward: rejectedReward, correct: chosenReward > rejectedReward };
          }),
        );
        return { step, pairs: P, ...dpoFields(dpoMetrics(dpoSums(policyLogps, heldRef, cfg.beta))) };
      },
      stepFields: (m) => dpoFields(dpoMetrics(m)),
      extraFeeds: (_k, part) => ({ ref_logp: refFeed(reference, part) }),
      start: (info) => events.onStart?.({ ...info, parameters: paramCount(config), referenceCached: cached }),
      events,
      signal,
    });
  });
}

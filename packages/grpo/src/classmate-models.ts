/**
 * In-process classmates: a model in this runtime that continues text. {@link textClassmate} turns
 * any token generator into a {@link ClassmateModel} — texts are encoded with the classmate's own
 * tokenizer and its samples decoded back to text, so it never sees the policy's ids.
 * {@link residentClassmate} is a frozen model of its own (a smaller one, or another family) on the
 * policy's device; `GrpoTrainer.selfPlayClassmate` is the policy itself, read at the weights of the
 * step being rewarded (the self-play variant).
 */
import { paramSpecs, type CausalLM } from '@lathe/models';
import type { SamplingOptions } from '@lathe/rollout';
import type { Device, DeviceTensor, SessionOptions } from '@lathe/runtime';
import { castWeights } from '@lathe/train';
import type { DType } from '@lathe/onnx';
import type { ClassmateModel } from './classmate';
import { ComputeWeights, GenerationRunner, KvGenerationRunner, type BoundWeights, type PolicyWeights, type RolloutGenerator } from './policy-sessions';

/** What a classmate reads and writes text with: its own tokenizer. */
export interface ClassmateTokenizer {
  encode(text: string): number[];
  decode(ids: readonly number[]): string;
  readonly padId: number;
}

/** A generator of token ids: `k` samples of each prompt, row i answering prompts[i]. */
export type TokenSampler = (prompts: readonly (readonly number[])[], k: number, seed: number) => Promise<{ tokens: readonly number[]; stopped: boolean }[][]>;

/** Options of {@link textClassmate}. */
export interface TextClassmateOptions {
  name: string;
  tokenizer: ClassmateTokenizer;
  sample: TokenSampler;
  weight?: number;
  where?: string;
  /** How it reads its input (`ClassmateModel.formatText`), e.g. its own chat template. */
  formatText?: (prompt: string, prefix: string) => string;
}

/**
 * A classmate from a token sampler and its tokenizer: each text is encoded (an empty encoding is
 * refused with the text's start named), sampled, and each sample decoded without its stop token.
 */
export function textClassmate(o: TextClassmateOptions): ClassmateModel {
  return {
    name: o.name,
    weight: o.weight,
    where: o.where ?? 'resident',
    ...(o.formatText ? { formatText: o.formatText } : {}),
    async continueTexts(texts, k, seed) {
      const ids = texts.map((t) => {
        const e = o.tokenizer.encode(t);
        if (e.length === 0) throw new Error(`classmate '${o.name}': the text ${JSON.stringify(t.slice(0, 60))} encodes to no tokens`);
        return e;
      });
      const out = await o.sample(ids, k, seed);
      return out.map((row) => row.map((c) => o.tokenizer.decode(c.stopped ? c.tokens.slice(0, -1) : c.tokens)));
    },
  };
}

/** Options of {@link residentClassmate}. */
export interface ResidentClassmateOptions {
  name: string;
  device: Device;
  /** The classmate's model (frozen: its weights are uploaded once). */
  model: CausalLM;
  tokenizer: ClassmateTokenizer;
  /** Longest continuation in the classmate's tokens. */
  maxNewTokens: number;
  stopIds: readonly number[];
  /** Default temperature 1. */
  sampling?: SamplingOptions;
  /** Compute dtype of its forward. Default float32. */
  compute?: DType;
  /** 'kv-cache' (prefill + decode steps; the device path) or 'graph' (the in-graph loop). Default 'graph'. */
  engine?: 'kv-cache' | 'graph';
  weight?: number;
  session?: SessionOptions;
  /** How it reads its input (`ClassmateModel.formatText`), e.g. its own chat template. */
  formatText?: (prompt: string, prefix: string) => string;
}

/** A resident classmate: its own frozen model on `device`, generating with one runner per K. Dispose it with the run. */
export function residentClassmate(o: ResidentClassmateOptions): ClassmateModel & { dispose(): void } {
  const config = o.model.config;
  const compute = o.compute ?? 'float32';
  const specs = paramSpecs(config);
  const weights = o.model.float32Weights();
  const uploaded: [string, DeviceTensor][] = specs.map((s) => [s.name, o.device.upload({ data: weights.get(s.name)!, dims: s.shape })]);
  const policy: PolicyWeights = { trainable: specs.map((s) => ({ name: s.name, shape: s.shape, decay: false })), weights: (_g, t) => castWeights(t, compute) };
  const computeWeights = o.engine === 'kv-cache' ? new ComputeWeights(o.device, config, policy, compute, o.session) : undefined;
  const runners = new Map<number, RolloutGenerator>();
  const runner = (k: number) => {
    let r = runners.get(k);
    if (!r) {
      const opts = { groupSize: k, sampling: o.sampling ?? { temperature: 1 }, padId: o.tokenizer.padId, session: o.session };
      r = computeWeights ? KvGenerationRunner.create(o.device, config, { ...opts, weights: computeWeights }) : GenerationRunner.create(o.device, config, policy, opts);
      runners.set(k, r);
    }
    return r;
  };
  const bound: BoundWeights[] = [uploaded];
  const sample: TokenSampler = async (prompts, k, seed) => {
    const out = await runner(k).generate(bound, prompts, { maxNewTokens: o.maxNewTokens, stopIds: o.stopIds, seed, keys: prompts.map((_, i) => i), weightsVersion: 0 });
    return prompts.map((_, i) => out.slice(i * k, (i + 1) * k));
  };
  const classmate = textClassmate({ name: o.name, tokenizer: o.tokenizer, sample, weight: o.weight, where: 'resident', formatText: o.formatText });
  return {
    ...classmate,
    dispose() {
      for (const r of runners.values()) r.dispose();
      computeWeights?.dispose();
      for (const [, t] of uploaded) t.dispose();
    },
  };
}

/**
 * Per-token Q labels for trajectories: the reference policy's min-p candidates at every output
 * position (one forward over prompt + output, the top `maxCandidates` log-probs taken in the graph),
 * then the critic's tree pass scoring the realised tokens and every candidate together.
 */
import * as L from '@lathe/onnx';
import type { DType } from '@lathe/onnx';
import { chunkedLogprobsAndEntropy, decoderHidden, lmLogits, weightInputs, type DecoderConfig } from '@lathe/models';
import type { Device } from '@lathe/runtime';
import type { CriticBins, CriticEstimate } from './bins';
import { treeRow } from './label';
import { ReferenceCriticSessions, type ModelWeights } from './sessions';

/** One trajectory to label. */
export interface LabelInput {
  /** The reference policy's input before the output (the rendered prompt). */
  prompt: readonly number[];
  /** What the critic reads before the output: the prompt, and any in-context attempts with their feedback. */
  criticPrefix: readonly number[];
  output: readonly number[];
}

/** A trajectory's labels: per output token, its Q and expected remaining length, and its candidates' ids, Q, reference log-probs and remaining lengths. */
export interface TokenLabels {
  token_q_values: number[];
  token_remaining: number[];
  /** Per output token, the entropy (nats) of the reference policy's next-token distribution that predicts it. */
  token_entropies: number[];
  candidate_ids: number[][];
  candidate_q_values: number[][];
  candidate_ref_logprobs: number[][];
  candidate_remaining: number[][];
}

/**
 * The tokens whose probability is at least `minP` × the most likely one's, from log-probs sorted
 * descending (the graph's top-k): ids and log-probs, most likely first.
 */
export function minPCandidates(ids: ArrayLike<number | bigint>, logprobs: ArrayLike<number>, minP: number): { ids: number[]; logprobs: number[] } {
  const floor = logprobs[0] + Math.log(minP);
  const out = { ids: [] as number[], logprobs: [] as number[] };
  for (let k = 0; k < logprobs.length && logprobs[k] >= floor; k++) {
    out.ids.push(Number(ids[k]));
    out.logprobs.push(logprobs[k]);
  }
  return out;
}

/**
 * The labeller's reference pass: input_ids, attention_mask int64 [B, T] and the weights →
 * top_logprobs, top_ids [B, T, k] (the log-softmax's k best) and entropies [B, T] (of the
 * next-token distribution at each position).
 */
export function referenceCandidatesGraph(config: DecoderConfig, compute: DType, k: number): L.Graph {
  const ref = new L.Graph('critic_reference_candidates');
  const { weights } = weightInputs(ref, config, 'float32', compute);
  const ids = ref.input('input_ids', 'int64', ['B', 'T']);
  const mask = ref.input('attention_mask', 'int64', ['B', 'T']);
  const hidden = decoderHidden(config, weights, ids, mask);
  const logits = L.cast(lmLogits(config, weights, hidden), 'float32');
  const [values, indices] = L.topK(L.logSoftmax(logits, -1), k, -1);
  ref.output(values, 'top_logprobs');
  ref.output(indices, 'top_ids');
  // the entropy as GRPO's re-scoring computes it: per vocabulary chunk, so no second [B, T, V] tensor (its log-probs, of `ids`, go unused)
  ref.output(chunkedLogprobsAndEntropy(config, weights, hidden, ids).entropy, 'entropies');
  return ref;
}

/** Options of {@link CriticLabeller.open}. */
export interface CriticLabellerOptions {
  device: Device;
  critic: ModelWeights;
  reference: ModelWeights;
  bins: CriticBins;
  /** Keep candidates with p ≥ minP · p_max. */
  minP: number;
  /** At most this many candidates per position (the graph's top-k). */
  maxCandidates: number;
  compute?: DType;
  padId: number;
}

/** The compiled reference and critic graphs with their weights on the device. */
export class CriticLabeller {
  private constructor(
    private readonly opts: CriticLabellerOptions,
    private readonly sessions: ReferenceCriticSessions,
  ) {}

  /** Compiles both graphs and uploads both models' weights once. */
  static open(opts: CriticLabellerOptions): CriticLabeller {
    const compute = opts.compute ?? 'float32';
    const referenceGraph = referenceCandidatesGraph(opts.reference.config, compute, opts.maxCandidates);
    return new CriticLabeller(opts, ReferenceCriticSessions.open({ device: opts.device, reference: opts.reference, critic: opts.critic, referenceGraph, bins: opts.bins, compute, padId: opts.padId }));
  }

  /** The reference policy's min-p candidates and their log-probs, and its entropy, at every output position of each input. */
  async candidates(inputs: readonly LabelInput[]): Promise<{ ids: number[][]; logprobs: number[][]; entropies: number[] }[]> {
    const seqs = inputs.map((x) => [...x.prompt, ...x.output]);
    const T = Math.max(...seqs.map((s) => s.length));
    const B = seqs.length;
    const ids = new BigInt64Array(B * T).fill(BigInt(this.opts.padId));
    const mask = new BigInt64Array(B * T);
    seqs.forEach((s, b) => s.forEach((id, t) => ((ids[b * T + t] = BigInt(id)), (mask[b * T + t] = 1n))));
    const out = await this.sessions.reference({ input_ids: { data: ids, dims: [B, T] }, attention_mask: { data: mask, dims: [B, T] } });
    const K = out.top_logprobs.dims[2];
    const values = out.top_logprobs.data as Float32Array;
    const top = out.top_ids.data as BigInt64Array;
    const entropies = out.entropies.data as Float32Array;
    // output token t is predicted at position prompt + t − 1
    return inputs.map((x, b) => {
      const perToken = x.output.map((_, t) => {
        const at = (b * T + x.prompt.length + t - 1) * K;
        return minPCandidates(top.subarray(at, at + K), values.subarray(at, at + K), this.opts.minP);
      });
      const at = b * T + x.prompt.length - 1;
      return { ids: perToken.map((c) => c.ids), logprobs: perToken.map((c) => c.logprobs), entropies: Array.from(entropies.subarray(at, at + x.output.length)) };
    });
  }

  /** The critic's estimates for the realised tokens and the given candidates, one tree pass for the batch. */
  async score(inputs: readonly LabelInput[], candidates: readonly (readonly (readonly number[])[])[]): Promise<{ realised: CriticEstimate[]; candidates: CriticEstimate[][] }[]> {
    return this.sessions.estimates(inputs.map((x, b) => treeRow(x.criticPrefix, x.output, candidates[b])));
  }

  /** Labels of each input: candidates from the reference policy, then one critic pass. */
  async label(inputs: readonly LabelInput[]): Promise<TokenLabels[]> {
    for (const x of inputs) if (x.prompt.length === 0) throw new Error('CriticLabeller: an empty prompt (the first output token needs a position that predicts it)');
    const cands = await this.candidates(inputs);
    const est = await this.score(
      inputs,
      cands.map((c) => c.ids),
    );
    return est.map((e, b) => ({
      token_q_values: e.realised.map((r) => r.q),
      token_remaining: e.realised.map((r) => r.remaining),
      token_entropies: cands[b].entropies,
      candidate_ids: cands[b].ids,
      candidate_q_values: e.candidates.map((cs) => cs.map((c) => c.q)),
      candidate_ref_logprobs: cands[b].logprobs,
      candidate_remaining: e.candidates.map((cs) => cs.map((c) => c.remaining)),
    }));
  }

  /** Releases the sessions and the uploaded weights. */
  dispose(): void {
    this.sessions.dispose();
  }
}

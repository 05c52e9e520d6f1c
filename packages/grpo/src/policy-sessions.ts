/**
 * The sessions an RL step runs besides the train step, each compiled once on the trainer's device
 * and fed the policy's weights *by binding*: the trainer's current parameter buffers (and a LoRA
 * run's frozen base) are bound by name before each run, so a generation or scoring run reads the
 * weights the last update wrote, with no copy.
 *
 * - `GenerationRunner`: the rollout generation graph (`addGeneration`: one prefill per prompt, the
 *   group expanded after it, the decode loop inside the run).
 * - `ScoringRunner`: teacher-forced log-probs of given rows through the *same policy builder as the
 *   loss* (`decoderPolicy`), forward only — the "training engine" log-probs used for re-scored old
 *   log-probs, the reference's log-probs, and the parity check against generation.
 */
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import type { DecoderConfig, Weights } from '@lathe/models';
import { addGeneration, uniformNoise, type SamplingOptions } from '@lathe/rollout';
import type { Binding, Device, DeviceTensor, HostTensor, Session, SessionOptions } from '@lathe/runtime';
import type { TrainableParam } from '@lathe/train';
import { decoderPolicy } from './policies';
import type { SampledCompletion } from './rollout-batch';

/** How graphs read a policy's weights: trainable tensors by name, plus any frozen inputs the weight function declares. */
export interface PolicyWeights {
  trainable: readonly TrainableParam[];
  /** The decoder's weights from the trainable tensors (a LoRA run declares its `base/<name>` inputs here). */
  weights: (g: Graph, trainable: Map<string, Tensor>) => Weights;
}

/** Device tensors to bind by input name. */
export type BoundWeights = Iterable<readonly [string, DeviceTensor]>;

function declareTrainable(g: Graph, pw: PolicyWeights): Map<string, Tensor> {
  return new Map(pw.trainable.map((p) => [p.name, g.input(p.name, 'float32', p.shape)] as const));
}

function bindAll(b: Binding, ...sets: BoundWeights[]): void {
  for (const set of sets) for (const [name, t] of set) b.input(name, t);
}

/** Options of a generation runner. */
export interface GenerationRunnerOptions {
  /** Samples per prompt (1 for greedy evaluation). */
  groupSize: number;
  /** Temperature 0 is greedy (no noise input). */
  sampling: SamplingOptions;
  padId: number;
  /** Rows of prompts per run (0: all prompts of a call in one run). */
  promptsPerRun?: number;
  session?: SessionOptions;
}

/** Generation bound to the policy's weights. */
export class GenerationRunner {
  private readonly binding: Binding;

  private constructor(
    private readonly session: Session,
    private readonly opts: GenerationRunnerOptions,
  ) {
    // allocated host outputs: the runtime binds them afresh each run, so their shapes follow the batch
    this.binding = session.binding();
    for (const o of ['tokens', 'logprobs', 'lengths', 'stopped']) this.binding.output(o, 'host');
  }

  /** Compiles the generation graph for `config` on `device`. */
  static create(device: Device, config: DecoderConfig, pw: PolicyWeights, opts: GenerationRunnerOptions): GenerationRunner {
    const g = new L.Graph((opts.sampling.temperature ?? 1) === 0 ? 'grpo_generate_greedy' : 'grpo_generate');
    addGeneration(g, config, pw.weights(g, declareTrainable(g, pw)), { ...opts.sampling, groupSize: opts.groupSize, padTokenId: opts.padId });
    return new GenerationRunner(device.compile(g, opts.session), opts);
  }

  /**
   * `groupSize` completions of each prompt (row p·G + j is sample j of prompt p), reading the bound
   * weights. Sampling noise is a function of (seed, key·G + j, position), so a sample does not
   * depend on which other prompts share its run.
   */
  async generate(weights: BoundWeights[], prompts: readonly (readonly number[])[], call: { maxNewTokens: number; stopIds: readonly number[]; seed: number; keys: readonly number[] }): Promise<SampledCompletion[]> {
    if (call.keys.length !== prompts.length) throw new Error(`generate: ${call.keys.length} keys for ${prompts.length} prompts`);
    bindAll(this.binding, ...weights);
    const G = this.opts.groupSize;
    const greedy = (this.opts.sampling.temperature ?? 1) === 0;
    const per = this.opts.promptsPerRun || prompts.length;
    const out: SampledCompletion[] = [];
    for (let start = 0; start < prompts.length; start += per) {
      const chunk = prompts.slice(start, start + per);
      const W = Math.max(...chunk.map((p) => p.length));
      const ids = new BigInt64Array(chunk.length * W).fill(BigInt(this.opts.padId));
      const mask = new BigInt64Array(chunk.length * W);
      chunk.forEach((p, r) => {
        if (p.length === 0) throw new Error(`generate: prompt ${start + r} is empty`);
        p.forEach((id, i) => {
          ids[r * W + W - p.length + i] = BigInt(id);
          mask[r * W + W - p.length + i] = 1n;
        });
      });
      this.binding
        .input('input_ids', { data: ids, dims: [chunk.length, W] })
        .input('attention_mask', { data: mask, dims: [chunk.length, W] })
        .input('max_new_tokens', { data: BigInt64Array.from([BigInt(call.maxNewTokens)]), dims: [] })
        .input('stop_ids', { data: BigInt64Array.from((call.stopIds.length ? call.stopIds : [-1]).map(BigInt)), dims: [Math.max(1, call.stopIds.length)] });
      if (!greedy) {
        const keys = call.keys.slice(start, start + per).flatMap((k) => Array.from({ length: G }, (_, j) => k * G + j));
        this.binding.input('noise', { data: uniformNoise(call.seed, keys, call.maxNewTokens), dims: [keys.length, call.maxNewTokens] });
      }
      await this.binding.run();
      const tokens = this.binding.fetch('tokens');
      const logprobs = this.binding.fetch('logprobs');
      const lengths = this.binding.fetch('lengths');
      const stopped = this.binding.fetch('stopped');
      const N = tokens.dims[1];
      for (let r = 0; r < chunk.length * G; r++) {
        const n = Number(lengths.data[r]);
        out.push({
          tokens: Array.from((tokens.data as BigInt64Array).subarray(r * N, r * N + n), Number),
          logprobs: Array.from((logprobs.data as Float32Array).subarray(r * N, r * N + n)),
          stopped: Boolean(stopped.data[r]),
        });
      }
    }
    return out;
  }

  dispose(): void {
    this.binding.dispose();
    this.session.dispose();
  }
}

/** Options of a scoring runner. */
export interface ScoringRunnerOptions {
  /** Temperature of the log-probs (the sampling temperature). */
  temperature: number;
  compute: DType;
  /** Vocabulary chunk of the log-partition. */
  chunk?: number;
  session?: SessionOptions;
}

/** Teacher-forced log-probs through `decoderPolicy`, bound to a set of weights. */
export class ScoringRunner {
  private readonly binding: Binding;

  private constructor(private readonly session: Session) {
    this.binding = session.binding().output('logp', 'host');
  }

  /** Compiles the scoring graph for `config` on `device`. */
  static create(device: Device, config: DecoderConfig, pw: PolicyWeights, opts: ScoringRunnerOptions): ScoringRunner {
    const g = new L.Graph('grpo_score');
    const policy = decoderPolicy(config, { compute: opts.compute, chunk: opts.chunk, temperature: opts.temperature, weights: pw.weights });
    g.output(policy(g, declareTrainable(g, pw)).logp, 'logp');
    return new ScoringRunner(device.compile(g, opts.session));
  }

  /** log π(ids[t+1] | ids ≤ t), [B, T] row-major (meaningful where the response mask is 1). */
  async score(weights: BoundWeights[], batch: { input_ids: HostTensor; attention_mask: HostTensor }): Promise<Float32Array> {
    bindAll(this.binding, ...weights);
    this.binding.input('input_ids', batch.input_ids).input('attention_mask', batch.attention_mask);
    await this.binding.run();
    return this.binding.fetch('logp').data as Float32Array;
  }

  dispose(): void {
    this.binding.dispose();
    this.session.dispose();
  }
}

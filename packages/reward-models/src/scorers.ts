/**
 * Inference sessions over a model's weights, compiled once and run per batch: rewards (or
 * per-token values) of a reward model, and response log-probs of a causal LM (the DPO reference's,
 * computed once and cached by the caller, or a policy's for evaluation). The weights are graph
 * inputs, so any weights of the right config can be scored: a model's device tensors, a Trainer's
 * current parameters (bound by address, no copy), or float32 arrays (LoRA merged on the host).
 */
import * as L from '@lathe/onnx';
import type { DType, Graph } from '@lathe/onnx';
import { paramSpecs, TOTAL_LENGTH_INPUT, totalLengthTensor, weightInputs, type CausalLM, type DecoderConfig } from '@lathe/models';
import { Device, DeviceTensor, type HostTensor, type Session, type SessionOptions } from '@lathe/runtime';
import type { BatchTensor } from '@lathe/train';
import { responseLogprobs, type LogprobReduction } from './dpo';
import { PAIR_INPUTS } from './pairs';
import { sequenceRewards, tokenValues } from './reward-graph';

/** Token rows to score: int64 [B, T] ids and attention mask (a {@link PairBatch} is one). */
export interface TokenBatch {
  inputIds: BatchTensor;
  attentionMask: BatchTensor;
}

/** Token rows with a mask of their response tokens (int64 [B, T], 1 on response tokens). */
export interface ResponseBatch extends TokenBatch {
  responseMask: BatchTensor;
}

/** A model's weights by HF name: device tensors in the scorer's dtype, or float32 host arrays (float32 scorers only). */
export type WeightSource = ReadonlyMap<string, DeviceTensor | Float32Array>;

/** Options shared by the scorers. */
export interface ScorerOptions {
  /** dtype of the weights fed, which is also the compute dtype. Default float32. */
  dtype?: DType;
  /**
   * 'composed' (default; left or right padding) or 'gqa': ONNX Runtime's GroupQueryAttention
   * (flash attention on CUDA, in float16/bfloat16 only), for right-padded rows.
   */
  attention?: 'composed' | 'gqa';
  /** Options of the session. */
  session?: SessionOptions;
}

/** A compiled graph whose inputs are a model's weights and a batch, and whose one output is read back. */
class WeightedSession {
  private readonly specs: Map<string, number[]>;

  constructor(
    private readonly session: Session,
    config: DecoderConfig,
    private readonly dtype: DType,
    private readonly output: string,
  ) {
    this.specs = new Map(paramSpecs(config).map((s) => [s.name, s.shape]));
  }

  async run(batch: Record<string, BatchTensor>, weights: WeightSource): Promise<Float32Array> {
    const feeds: Record<string, DeviceTensor | HostTensor> = { ...batch };
    for (const [name, shape] of this.specs) {
      const w = weights.get(name);
      if (!w) throw new Error(`${this.session.name}: no weight '${name}' among the weights given`);
      if (w instanceof DeviceTensor) {
        if (w.dtype !== this.dtype) throw new Error(`${this.session.name}: weight '${name}' is ${w.dtype}, the scorer was built for ${this.dtype}`);
        feeds[name] = w;
      } else {
        if (this.dtype !== 'float32') throw new Error(`${this.session.name}: weight '${name}' is a float32 array, the scorer was built for ${this.dtype} (upload it in that dtype)`);
        feeds[name] = { data: w, dims: shape };
      }
    }
    if (this.session.inputs.some((i) => i.name === TOTAL_LENGTH_INPUT)) feeds[TOTAL_LENGTH_INPUT] = totalLengthTensor(batch[PAIR_INPUTS.inputIds].dims[1]);
    const out = await this.session.run(feeds, { outputs: [this.output] });
    return out[this.output].data as Float32Array;
  }

  dispose(): void {
    this.session.dispose();
  }
}

/** What a {@link RewardScorer} reads from the score head. */
export type RewardOutput = 'rewards' | 'values';

/**
 * Rewards of a reward model's rows ([B], at each row's last real token) or, with `output:
 * 'values'`, values at every position ([B·T] row-major, 0 at padding).
 */
export class RewardScorer {
  private constructor(
    private readonly runner: WeightedSession,
    /** What {@link score} returns. */
    readonly output: RewardOutput,
  ) {}

  /** Compiles the scoring graph of reward model `config` for `device`. */
  static create(config: DecoderConfig, device: Device, opts: ScorerOptions & { output?: RewardOutput } = {}): RewardScorer {
    const dtype = opts.dtype ?? 'float32';
    const output = opts.output ?? 'rewards';
    const g = new L.Graph(output === 'rewards' ? 'reward_scores' : 'token_values');
    const { ids, mask, w } = scoringInputs(g, config, dtype);
    const read = output === 'rewards' ? sequenceRewards : tokenValues;
    g.output(L.cast(read(config, w, ids, mask, { attention: opts.attention ?? 'composed' }), 'float32'), output);
    return new RewardScorer(new WeightedSession(device.compile(g, { name: g.name, ...opts.session }), config, dtype, output), output);
  }

  /**
   * The rewards (or values) of `batch` under `weights`. A non-finite one is an error naming its
   * rows, since a NaN reward would otherwise flow silently into advantages or metrics.
   */
  async score(batch: TokenBatch, weights: WeightSource): Promise<Float32Array> {
    const out = await this.runner.run({ [PAIR_INPUTS.inputIds]: batch.inputIds, [PAIR_INPUTS.attentionMask]: batch.attentionMask }, weights);
    const width = this.output === 'rewards' ? 1 : batch.inputIds.dims[1];
    const bad = new Set<number>();
    out.forEach((v, i) => {
      if (!Number.isFinite(v)) bad.add(Math.floor(i / width));
    });
    if (bad.size > 0) throw new Error(`reward model: non-finite ${this.output} for row${bad.size > 1 ? 's' : ''} ${[...bad].slice(0, 10).join(', ')}${bad.size > 10 ? ', …' : ''} of ${batch.inputIds.dims[0]} (the weights or the head hold NaN or Inf)`);
    return out;
  }

  /** Frees the session. */
  dispose(): void {
    this.runner.dispose();
  }
}

/**
 * Each row's response log-prob ([B]; see `responseLogprobs`) under a causal LM's weights: the DPO
 * reference's (score once, cache, feed as `ref_logp`) or a policy's.
 */
export class ResponseLogprobScorer {
  private constructor(
    private readonly runner: WeightedSession,
    private readonly defaults: WeightSource | undefined,
  ) {}

  /** Compiles the graph of causal LM `config` for `device`, reducing each response's log-probs by `reduction` (default 'sum'). */
  static create(config: DecoderConfig, device: Device, opts: ScorerOptions & { reduction?: LogprobReduction; chunk?: number } = {}): ResponseLogprobScorer {
    return ResponseLogprobScorer.build(config, device, opts, undefined);
  }

  /** The scorer of a model on a device, reading its own weights unless others are given. */
  static forModel(model: CausalLM, opts: Omit<ScorerOptions, 'dtype'> & { reduction?: LogprobReduction; chunk?: number } = {}): ResponseLogprobScorer {
    const device = model.device;
    if (!device) throw new Error(`ResponseLogprobScorer.forModel: the model is on the host${model.dir ? ` (${model.dir})` : ''}; load it with { device }`);
    return ResponseLogprobScorer.build(model.config, device, { ...opts, dtype: model.dtype }, model.weights);
  }

  private static build(config: DecoderConfig, device: Device, opts: ScorerOptions & { reduction?: LogprobReduction; chunk?: number }, defaults: WeightSource | undefined): ResponseLogprobScorer {
    const dtype = opts.dtype ?? 'float32';
    const g = new L.Graph('response_logprobs');
    const { ids, mask, w } = scoringInputs(g, config, dtype);
    const responseMask = g.input(PAIR_INPUTS.responseMask, 'int64', ['B', 'T']);
    const logp = responseLogprobs(config, w, ids, mask, responseMask, { reduction: opts.reduction, chunk: opts.chunk, attention: opts.attention ?? 'composed' });
    g.output(L.cast(logp, 'float32'), 'response_logp');
    return new ResponseLogprobScorer(new WeightedSession(device.compile(g, { name: g.name, ...opts.session }), config, dtype, 'response_logp'), defaults);
  }

  /** The response log-probs of `batch` under `weights` (default: the model's, for a scorer made by {@link forModel}). */
  score(batch: ResponseBatch, weights: WeightSource | undefined = this.defaults): Promise<Float32Array> {
    if (!weights) throw new Error('ResponseLogprobScorer.score: no weights given (a scorer made by create() scores the weights passed to it)');
    return this.runner.run({ [PAIR_INPUTS.inputIds]: batch.inputIds, [PAIR_INPUTS.attentionMask]: batch.attentionMask, [PAIR_INPUTS.responseMask]: batch.responseMask }, weights);
  }

  /** Frees the session. */
  dispose(): void {
    this.runner.dispose();
  }
}

function scoringInputs(g: Graph, config: DecoderConfig, dtype: DType) {
  const ids = g.input(PAIR_INPUTS.inputIds, 'int64', ['B', 'T']);
  const mask = g.input(PAIR_INPUTS.attentionMask, 'int64', ['B', 'T']);
  return { ids, mask, w: weightInputs(g, config, dtype, dtype).weights };
}

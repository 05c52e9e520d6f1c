/**
 * What a preference run trains: every weight (full fine-tuning), or LoRA adapters over a frozen base
 * fed as `base/<name>` inputs. A reward model's score head always trains in full, since it starts
 * random (PEFT's `modules_to_save` for sequence classification does the same).
 */
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import { paramSpecs, SCORE_WEIGHT, type DecoderConfig, type Weights } from '@lathe/models';
import type { Device, DeviceTensor } from '@lathe/runtime';
import { castWeights, fullTrainableParams, initLora, loraAdapters, loraBaseDtype, loraWeights, mergeLora, uploadLoraBase, type LoraAdapter, type LoraConfig, type TrainableParam } from '@lathe/train';

/** LoRA's default targets for reward models and DPO: the attention projections q, k, v, o. */
export const REWARD_LORA_TARGETS = 'q_proj|k_proj|v_proj|o_proj';

/** Options of {@link trainedWeights}. */
export interface TrainedWeightsOptions {
  /** LoRA adapters over a frozen base; omitted: every weight trains. */
  lora?: LoraConfig;
  /** dtype of the forward/backward compute (master weights stay float32). Default float32. */
  compute?: DType;
  /** Seed of the adapters' initial A matrices. Default 0. */
  seed?: number;
}

/** The trained tensors of a run and how a loss reads the model's weights from them. */
export interface TrainedWeights {
  /** What the optimizer updates: every weight, or the adapters plus (for a reward model) `score.weight`. */
  params: TrainableParam[];
  /** Initial values of `params` by name. */
  init: Map<string, Float32Array>;
  /** Inputs that stay fixed for the run (the LoRA base as `base/<name>`; empty in full fine-tuning), as float32 in host memory. */
  frozen: Map<string, { data: Float32Array; dims: number[] }>;
  /**
   * The Trainer's `frozen`: `frozen` uploaded to `device` once (a host tensor bound to a CUDA
   * session would be copied on every run), each tensor in the dtype `weights` declares it in
   * (`loraBaseDtype`: the compute dtype, bfloat16 halving the base). The caller disposes them after
   * the Trainer.
   */
  frozenOn: (device: Device) => Record<string, DeviceTensor>;
  /** The LoRA adapters (empty in full fine-tuning). */
  adapters: LoraAdapter[];
  /** A loss's `weights` option: the decoder's weights in the compute dtype from the trainable parameters. */
  weights: (g: Graph, params: Map<string, Tensor>) => Weights;
  /** Every model weight by HF name from trained values (LoRA merged into the base), for saving and scoring. */
  merged: (values: ReadonlyMap<string, Float32Array>) => Map<string, Float32Array>;
}

/**
 * The trained tensors for a model whose float32 weights are `master` (a reward model's or a
 * policy's): with `opts.lora`, adapters on the matching matrices (never the score head, which
 * trains in full) over the frozen rest; without, every weight.
 */
export function trainedWeights(config: DecoderConfig, master: ReadonlyMap<string, Float32Array>, opts: TrainedWeightsOptions = {}): TrainedWeights {
  const compute = opts.compute ?? 'float32';
  const specs = paramSpecs(config);
  for (const s of specs) if (!master.has(s.name)) throw new Error(`trainedWeights: no weight '${s.name}' among the master weights`);
  const lora = opts.lora;
  if (!lora) {
    return {
      params: fullTrainableParams(config),
      init: new Map(specs.map((s) => [s.name, master.get(s.name)!])),
      frozen: new Map(),
      frozenOn: () => ({}),
      adapters: [],
      weights: (_g, params) => castWeights(params, compute),
      merged: (values) => new Map(specs.map((s) => [s.name, values.get(s.name)!])),
    };
  }
  const adapters = loraAdapters(config, lora);
  const scoreSpec = scoreHeadBesideLora(config, adapters, lora);
  const head = scoreSpec ? [scoreSpec] : [];
  const baseSpecs = specs.filter((s) => s.name !== SCORE_WEIGHT);
  const init = initLora(adapters, opts.seed ?? 0);
  if (scoreSpec) init.set(SCORE_WEIGHT, master.get(SCORE_WEIGHT)!);
  const frozen = new Map(baseSpecs.map((s) => [`base/${s.name}`, { data: master.get(s.name)!, dims: s.shape }]));
  return {
    params: [...adapters.flatMap((a) => [a.a, a.b]), ...head],
    init,
    frozen,
    frozenOn: (device) => Object.fromEntries(baseSpecs.map((s) => [`base/${s.name}`, uploadLoraBase(device, s.name, frozen.get(`base/${s.name}`)!, adapters, compute)])),
    adapters,
    weights: (g, params) => {
      const base = new Map(baseSpecs.map((s) => [s.name, g.input(`base/${s.name}`, loraBaseDtype(s.name, adapters, compute), s.shape)]));
      const w = loraWeights((name) => base.get(name)!, params, adapters, lora, compute, { training: true });
      return scoreSpec ? withScoreHead(w, params, compute) : w;
    },
    merged: (values) => {
      const base = new Map(baseSpecs.map((s) => [s.name, master.get(s.name)!]));
      const model = mergeLora(base, new Map(values), adapters, lora);
      if (scoreSpec) model.set(SCORE_WEIGHT, values.get(SCORE_WEIGHT)!);
      return model;
    },
  };
}

/**
 * A reward model's score head beside LoRA adapters: it trains in full (it starts random), so
 * adapters targeting it are an error. Undefined for a causal LM, which has none.
 */
export function scoreHeadBesideLora(config: DecoderConfig, adapters: LoraAdapter[], lora: LoraConfig): TrainableParam | undefined {
  if (adapters.some((a) => a.target === SCORE_WEIGHT)) throw new Error(`lora targets '${lora.targets}' match ${SCORE_WEIGHT}, which trains in full in a reward model: leave it out of the targets`);
  const spec = paramSpecs(config).find((s) => s.name === SCORE_WEIGHT);
  return spec && { name: SCORE_WEIGHT, shape: spec.shape, decay: true };
}

/** `w` with the score head read from the trained `params` in the `compute` dtype; `w`'s branch and matmul hooks kept. */
export function withScoreHead(w: Weights, params: Map<string, Tensor>, compute: DType): Weights {
  const score = L.cast(params.get(SCORE_WEIGHT)!, compute);
  const withHead: Weights = (name) => (name === SCORE_WEIGHT ? score : w(name));
  withHead.branch = w.branch;
  withHead.matmul = w.matmul;
  return withHead;
}

/**
 * QLoRA's trained tensors in the shape the training recipes already take (`TrainedWeights`, as
 * `trainedWeights` in @lathe/reward-models gives for LoRA over a dense base): LoRA adapters over a
 * frozen quantized base — its codes and scales bound once as `base/…` inputs, its projections run
 * through the quantized kernels — and, for a reward model, the score head trained in full. A
 * recipe switches to QLoRA by building its weights here from `loadQuantized(dir)` (or
 * `QuantizedModel.quantize`) instead of from the float32 master weights.
 */
import type { DType } from '@lathe/onnx';
import { SCORE_WEIGHT } from '@lathe/models';
import { overQuantizedBase, QuantizedModel, type QuantScheme } from '@lathe/quantization';
import { scoreHeadBesideLora, trainedWeights, withScoreHead, type TrainedWeights } from '@lathe/reward-models';
import type { DecoderConfig } from '@lathe/models';
import type { FrozenBase } from '@lathe/grpo';
import { fullTrainableParams, initLora, loraAdapters, loraFromOptions, loraWeights, mergeLora, type LoraConfig, type LoraOptions, type TrainableParam } from '@lathe/train';

/** Options of {@link qloraTrainedWeights}. */
export interface QloraOptions {
  lora: LoraConfig;
  /** dtype of the compute and of the frozen base's dense weights and scales on the device. Default float32. */
  compute?: DType;
  /** Seed of the adapters' initial A matrices. Default 0. */
  seed?: number;
  /** NF4's backward: 'dequantize' (default, any provider) or 'kernel' (MatMulBnb4 with transB = 0, CUDA). */
  backward?: 'kernel' | 'dequantize';
}

/**
 * The adapters (and a reward model's score head) over `q` frozen. `frozen` is empty — the base is
 * uploaded by `frozenOn` in the compute dtype, codes as uint8 — and `merged` folds the adapters into
 * the dequantized base (float32 weights by HF name: a dense model to save or score).
 */
export function qloraTrainedWeights(q: QuantizedModel, opts: QloraOptions): TrainedWeights {
  const compute = opts.compute ?? 'float32';
  const { config } = q;
  const adapters = loraAdapters(config, opts.lora);
  const scoreSpec = scoreHeadBesideLora(config, adapters, opts.lora);
  const head = scoreSpec ? [scoreSpec] : [];
  const init = initLora(adapters, opts.seed ?? 0);
  if (scoreSpec) init.set(SCORE_WEIGHT, q.dense.get(SCORE_WEIGHT)!);
  return {
    params: [...adapters.flatMap((a) => [a.a, a.b]), ...head],
    init,
    frozen: new Map(),
    frozenOn: (device) => {
      const tensors = q.deviceTensors(device, compute, 'base/');
      // The score head trains: it is a parameter, not a frozen input.
      if (scoreSpec) {
        tensors.get(`base/${SCORE_WEIGHT}`)?.dispose();
        tensors.delete(`base/${SCORE_WEIGHT}`);
      }
      return Object.fromEntries(tensors);
    },
    adapters,
    weights: (g, params) => {
      const base = q.graphWeights(g, { dtype: compute, prefix: 'base/', backward: opts.backward, skip: scoreSpec ? [SCORE_WEIGHT] : [] });
      const w = overQuantizedBase(loraWeights((n) => base.weights(n), params, adapters, opts.lora, compute, { training: true }), base.weights);
      return scoreSpec ? withScoreHead(w, params, compute) : w;
    },
    merged: (values) => {
      const base = q.dequantizedWeights();
      if (scoreSpec) base.delete(SCORE_WEIGHT);
      const model = mergeLora(base, new Map(values), adapters, opts.lora);
      if (scoreSpec) model.set(SCORE_WEIGHT, values.get(SCORE_WEIGHT)!);
      return model;
    },
  };
}

/** The base formats of `--quantize_base` (bitsandbytes' QLoRA default is NF4 with double quantization). */
const QLORA_SCHEMES: Record<string, QuantScheme> = {
  nf4: { format: 'nf4', doubleQuant: true },
  int4: { format: 'int4', blockSize: 64 },
  int8: { format: 'int8' },
};

/**
 * A training run's trained tensors from its options: every weight, LoRA over the float32 base, or
 * (with `quantize_base`) QLoRA over the base quantized here. NF4's backward runs through
 * MatMulBnb4 on CUDA (faster and no dequantized copy; measured in docs/benchmarks.md) and through
 * the dequantized weights elsewhere.
 */
export function runTrainedWeights(
  config: DecoderConfig,
  master: ReadonlyMap<string, Float32Array>,
  cfg: { lora?: LoraConfig; compute: DType; seed: number; quantize_base: string; device: string },
): TrainedWeights {
  if (cfg.quantize_base === 'none') return trainedWeights(config, master, { lora: cfg.lora, compute: cfg.compute, seed: cfg.seed });
  const scheme = QLORA_SCHEMES[cfg.quantize_base];
  if (!scheme) throw new Error(`--quantize_base ${cfg.quantize_base}: not a format (none, ${Object.keys(QLORA_SCHEMES).join(', ')})`);
  if (!cfg.lora) throw new Error(`--quantize_base ${cfg.quantize_base} trains LoRA adapters over a frozen quantized base: set --lora_rank > 0`);
  const q = QuantizedModel.quantize(config, master, scheme);
  return qloraTrainedWeights(q, { lora: cfg.lora, compute: cfg.compute, seed: cfg.seed, backward: cfg.device === 'cuda' ? 'kernel' : 'dequantize' });
}

/**
 * QLoRA's frozen base for `GrpoTrainer` (its `frozenBase` option): `master` quantized here in
 * `--quantize_base`'s format, read by the train step, scoring, the KL reference and generation
 * through the quantized kernels; checkpoints merge the adapters into its dequantized weights.
 */
export function quantizedFrozenBase(config: DecoderConfig, master: ReadonlyMap<string, Float32Array>, quantizeBase: string, device: string): FrozenBase {
  const scheme = QLORA_SCHEMES[quantizeBase];
  if (!scheme) throw new Error(`--quantize_base ${quantizeBase}: not a format (none, ${Object.keys(QLORA_SCHEMES).join(', ')})`);
  const q = QuantizedModel.quantize(config, master, scheme);
  const backward = device === 'cuda' ? 'kernel' : 'dequantize';
  return {
    describe: quantizeBase,
    weights: (g, compute) => q.graphWeights(g, { dtype: compute, prefix: 'base/', backward }).weights,
    upload: (dev, compute) => Object.fromEntries(q.deviceTensors(dev, compute, 'base/')),
    dense: () => q.dequantizedWeights(),
  };
}

/** What a training recipe trains, from its options (see {@link recipeTensors}). */
export interface RecipeTensors {
  /** The LoRA config, or undefined in full fine-tuning. */
  lora: LoraConfig | undefined;
  params: TrainableParam[];
  /** A loss's `weights` option with LoRA (undefined in full fine-tuning: the loss casts the parameters itself). */
  weights: TrainedWeights['weights'] | undefined;
  /** Initial values of `params` (the model's weights, or fresh adapters). */
  init: Map<string, Float32Array>;
  /** The frozen base on the device (nothing in full fine-tuning); the caller disposes it. */
  frozenOn: TrainedWeights['frozenOn'];
  /** Every model weight by HF name from trained values (adapters merged into the base). */
  merged: (values: Map<string, Float32Array>) => Map<string, Float32Array>;
}

/**
 * A training recipe's trained tensors from its LoRA options over `base` (the model's float32
 * weights): every weight with `--lora_rank 0`, else adapters over the frozen base — quantized in
 * memory with `--quantize_base` (QLoRA) where the recipe offers it.
 */
export function recipeTensors(config: DecoderConfig, base: Map<string, Float32Array>, cfg: LoraOptions & { compute_dtype: DType; seed: number; device: string; quantize_base?: string }): RecipeTensors {
  const lora = loraFromOptions(cfg);
  if (!lora) {
    const params = fullTrainableParams(config);
    return { lora, params, weights: undefined, init: base, frozenOn: () => ({}), merged: (values) => values };
  }
  const tw = runTrainedWeights(config, base, { lora, compute: cfg.compute_dtype, seed: cfg.seed, quantize_base: cfg.quantize_base ?? 'none', device: cfg.device });
  return { lora, params: tw.params, weights: tw.weights, init: tw.init, frozenOn: tw.frozenOn, merged: tw.merged };
}

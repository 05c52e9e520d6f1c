/**
 * What dp-check trains: a Qwen3 shape (@lathe/models' presets, or a CPU-sized one), its initial
 * weights, and either every weight (full fine-tuning) or LoRA adapters over a frozen base, the base
 * bound once on the device with no optimizer state, each tensor in its `loraBaseDtype` (the compute
 * dtype; a merged LM-head target float32).
 */
import { MODEL_PRESETS, paramSpecs, randomWeight, seededNormal, type DecoderConfig, type HfConfig, type ParamSpec } from '@lathe/models';
import { toBfloat16Bits, type Device, type DeviceTensor } from '@lathe/runtime';
import { initLora, loraAdapters, loraBaseDtype, loraWeights, type LoraConfig, type SftLossOptions, type TrainableParam } from '@lathe/train';

const preset = (name: keyof typeof MODEL_PRESETS): HfConfig => MODEL_PRESETS[name].config as HfConfig;

/** The shapes `--shape` names: Qwen3-0.6B, -1.7B, -4B and -8B (its own LM head) as published, and `tiny` (2 layers, hidden 64) for the CPU. */
export const DP_SHAPES: Readonly<Record<string, HfConfig>> = {
  '0.6b': preset('qwen3-0.6b'),
  '1.7b': preset('qwen3-1.7b'),
  '4b': preset('qwen3-4b'),
  '8b': preset('qwen3-8b'),
  tiny: { ...preset('qwen3-0.6b'), vocab_size: 512, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16 },
};

/**
 * How initial weights are drawn: `sampled` is randomWeight's seeded normal per element; `tiled`
 * copies each matrix from a window of one pool of 2^24 seeded normals (norms sampled as before),
 * the same distribution per element built at copying speed, since sampling the 4B and 8B shapes
 * takes minutes a rank. Every rank builds the same weights either way.
 */
export type InitKind = 'sampled' | 'tiled';

/** A prime just above 2^24, so the windows of consecutive rows do not line up with any row length. */
const POOL_SIZE = 16_777_259;

/** Options of {@link dpModel}. */
export interface DpModelOptions {
  /** The dtype the step computes in; a LoRA base is bound in it (bfloat16: 2 bytes a weight), a merged LM-head target in float32. */
  compute: 'float32' | 'bfloat16';
  init: InitKind;
  /** LoRA adapters over a frozen base instead of every weight trained. */
  lora?: LoraConfig;
  /** Seed of the weights (default 1; the adapters' A always draws from initLora's seed 0). */
  seed?: number;
}

/** The trained parameters, their initial values, and with LoRA the frozen base and the decoder weights over it. */
export interface DpModel {
  params: TrainableParam[];
  /** The trained parameters' initial float32 values (the Trainer keeps their master copies and AdamW state). */
  init: Map<string, Float32Array>;
  /** sftLoss's `weights` with LoRA: the base declared as `base/<name>` inputs in their `loraBaseDtype`, the adapters as side branches. */
  weights?: SftLossOptions['weights'];
  /** The LoRA base on the device as the Trainer's `frozen` inputs (empty for full fine-tuning); dispose after the trainer. */
  frozen: Record<string, DeviceTensor>;
  /** Elements trained (every weight, or the adapters'). */
  trainableParams: number;
  /** Bytes of the frozen base on the device. */
  frozenBytes: number;
  /** Adapted matrices (0 without LoRA). */
  adapters: number;
}

/**
 * The model dp-check trains on `device`. With LoRA the base never becomes a trained parameter, so
 * it gets no float32 master copy, gradient buffer or AdamW moments: only the adapters do, and only
 * their gradients cross between ranks.
 */
export function dpModel(config: DecoderConfig, device: Device, o: DpModelOptions): DpModel {
  const specs = paramSpecs(config);
  const draw = weightSource(o.init, o.seed ?? 1);
  if (!o.lora) {
    const params = specs.map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
    return { params, init: new Map(specs.map((s) => [s.name, draw.float32(s)])), frozen: {}, trainableParams: count(params), frozenBytes: 0, adapters: 0 };
  }
  const lora = o.lora;
  const adapters = loraAdapters(config, lora);
  const params = adapters.flatMap((a) => [a.a, a.b]);
  const frozen: Record<string, DeviceTensor> = {};
  let frozenBytes = 0;
  try {
    // one tensor on the host at a time: the 8B base is 16.4 GB in bfloat16
    for (const s of specs) {
      const t = loraBaseDtype(s.name, adapters, o.compute) === 'bfloat16' ? device.upload({ data: draw.bfloat16(s), dims: s.shape }, 'bfloat16') : device.upload({ data: draw.float32(s), dims: s.shape }, 'float32');
      frozen[`base/${s.name}`] = t;
      frozenBytes += t.byteLength;
    }
  } catch (e) {
    for (const t of Object.values(frozen)) t.dispose();
    throw e;
  }
  const weights: SftLossOptions['weights'] = (g, trainable) => {
    const base = new Map(specs.map((s) => [s.name, g.input(`base/${s.name}`, loraBaseDtype(s.name, adapters, o.compute), s.shape)]));
    return loraWeights((name) => base.get(name)!, trainable, adapters, lora, o.compute);
  };
  return { params, init: initLora(adapters, 0), weights, frozen, trainableParams: count(params), frozenBytes, adapters: adapters.length };
}

const count = (params: readonly TrainableParam[]) => params.reduce((s, p) => s + p.shape.reduce((a, b) => a * b, 1), 0);

/** Each tensor's initial values in float32 or as bfloat16 bits, drawn as `init` says. */
function weightSource(init: InitKind, seed: number): { float32(s: ParamSpec): Float32Array; bfloat16(s: ParamSpec): Uint16Array } {
  if (init !== 'sampled' && init !== 'tiled') throw new Error(`--init ${String(init)}: sampled or tiled`);
  const sample = randomWeight({ seed, std: 0.02 });
  if (init === 'sampled') return { float32: sample, bfloat16: (s) => toBfloat16Bits(sample(s)) };
  let pool: Float32Array | undefined;
  let poolBits: Uint16Array | undefined;
  const floats = () => (pool ??= (() => {
    const normal = seededNormal(seed ^ 0x7113d);
    return Float32Array.from({ length: POOL_SIZE }, () => 0.02 * normal());
  })());
  const tiled = (s: ParamSpec) => s.kind === 'matrix' || s.kind === 'embedding';
  return {
    float32: (s) => (tiled(s) ? windowOf(floats(), new Float32Array(size(s)), s.name) : sample(s)),
    bfloat16: (s) => (tiled(s) ? windowOf((poolBits ??= toBfloat16Bits(floats())), new Uint16Array(size(s)), s.name) : toBfloat16Bits(sample(s))),
  };
}

const size = (s: ParamSpec) => s.shape.reduce((a, b) => a * b, 1);

/** `out` filled from `pool` from an offset hashed from `name` (FNV-1a), wrapping around. */
function windowOf<T extends Float32Array | Uint16Array>(pool: T, out: T, name: string): T {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  let at = h % pool.length;
  for (let i = 0; i < out.length; ) {
    const n = Math.min(out.length - i, pool.length - at);
    out.set(pool.subarray(at, at + n), i);
    i += n;
    at = 0;
  }
  return out;
}

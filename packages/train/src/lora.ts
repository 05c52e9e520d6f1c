/**
 * LoRA: a targeted projection y = x·Wᵀ gains a trainable low-rank side branch,
 *   y = x·Wᵀ (+ bias) + (alpha / rank) · (drop(x)·Aᵀ)·Bᵀ,
 * with A [rank, in] and B [out, rank] (PEFT's `LoraLayer.forward`; drop is `lora_dropout` on the
 * adapter's input, training only). The base stays frozen (a read-only graph input shared by every
 * step) and only the adapters carry optimizer state. Because W enters the loss only through x·Wᵀ,
 * the backward pass forms dx from it but no [out, in] gradient: the autodiff builds gradients only
 * toward the adapters. A starts uniform in ±1/√in and B at zero, so training starts from the base
 * model exactly. Adapters are named as PEFT names them (`<module>.lora_A.weight`,
 * `<module>.lora_B.weight`); `mergeLora` folds them into the base for export, and
 * `mergedLoraWeights` in the graph for generation, which reads whole weights.
 *
 * Dropout masks come from an in-graph counter-based hash (dropout.ts) keyed by the
 * {@link LORA_DROPOUT_KEY} input — (seed, optimizer step, micro-batch index) — and salted per
 * adapter, so a resumed run draws the same masks bit for bit.
 */
import * as L from '@lathe/onnx';
import type { DType, Tensor } from '@lathe/onnx';
import { isProjectionWeight, linear, paramSpecs, type DecoderConfig, type Weights } from '@lathe/models';
import { droppedElements, streamKey } from './dropout';
import { seededRandom } from '@lathe/models';
import { toBfloat16Bits, toFloat16Bits, type Device, type DeviceTensor } from '@lathe/runtime';
import type { TrainableParam } from './train-step';

/** LoRA settings. */
export interface LoraConfig {
  rank: number;
  alpha: number;
  /** Regular expression matched against HF parameter names of matrices (e.g. `q_proj|v_proj`). */
  targets: string;
  /** Dropout probability on each adapter's input in training (PEFT's `lora_dropout`), in [0, 1). Default 0. */
  dropout?: number;
}

/** One adapted matrix. */
export interface LoraAdapter {
  /** The base weight's HF name. */
  target: string;
  a: TrainableParam;
  b: TrainableParam;
}

/** A command's LoRA options, as `lathe sft` and `lathe grpo` name them. */
export interface LoraOptions {
  lora_rank: number;
  lora_alpha: number;
  lora_targets: string;
  lora_dropout: number;
}

/**
 * The LoRA config a command's options imply: undefined when `lora_rank` is 0 (every weight
 * trains); `lora_dropout` without LoRA is an error naming both flags.
 */
export function loraFromOptions(o: LoraOptions): LoraConfig | undefined {
  if (o.lora_rank === 0) {
    if (o.lora_dropout !== 0) throw new Error(`--lora_dropout ${o.lora_dropout} applies to LoRA adapters, but --lora_rank is 0 (every weight trains)`);
    return undefined;
  }
  return { rank: o.lora_rank, alpha: o.lora_alpha, targets: o.lora_targets, dropout: o.lora_dropout };
}

/** The adapters a config implies; an empty match is an error naming the pattern. */
export function loraAdapters(cfg: DecoderConfig, lora: LoraConfig): LoraAdapter[] {
  if (!Number.isInteger(lora.rank) || lora.rank < 1) throw new Error(`lora rank must be a positive integer, got ${lora.rank}`);
  const dropout = lora.dropout ?? 0;
  if (!(dropout >= 0 && dropout < 1)) throw new Error(`lora_dropout must be in [0, 1), got ${dropout}`);
  let pattern: RegExp;
  try {
    pattern = new RegExp(lora.targets);
  } catch (e) {
    throw new Error(`lora targets '${lora.targets}' is not a valid regular expression: ${(e as Error).message}`);
  }
  const adapters = paramSpecs(cfg)
    .filter((s) => s.kind === 'matrix' && pattern.test(s.name))
    .map((s) => {
      const module = s.name.replace(/\.weight$/, '');
      const [out, inn] = s.shape;
      return {
        target: s.name,
        a: { name: `${module}.lora_A.weight`, shape: [lora.rank, inn], decay: true },
        b: { name: `${module}.lora_B.weight`, shape: [out, lora.rank], decay: true },
      };
    });
  if (adapters.length === 0) throw new Error(`lora targets '${lora.targets}' match no weight matrix of this ${cfg.architecture}`);
  return adapters;
}

/** Initial adapter values: A ~ U(−1/√in, 1/√in), B = 0. */
export function initLora(adapters: LoraAdapter[], seed: number): Map<string, Float32Array> {
  const r = seededRandom(seed ^ 0x10a4);
  const out = new Map<string, Float32Array>();
  for (const ad of adapters) {
    const [rank, inn] = ad.a.shape;
    const bound = 1 / Math.sqrt(inn);
    out.set(ad.a.name, Float32Array.from({ length: rank * inn }, () => (2 * r() - 1) * bound));
    out.set(ad.b.name, new Float32Array(ad.b.shape[0] * rank));
  }
  return out;
}

/** The batch input of a LoRA train step with dropout: int64 [3] = (seed, optimizer step, micro-batch index). */
export const LORA_DROPOUT_KEY = 'lora_dropout_key';

/** The {@link LORA_DROPOUT_KEY} value of one micro-batch: what the masks of that run are a function of. */
export function loraDropoutKey(seed: number, step: number, microBatch: number): { data: BigInt64Array; dims: number[] } {
  return { data: BigInt64Array.of(BigInt(seed), BigInt(step), BigInt(microBatch)), dims: [3] };
}

/** Options of {@link loraWeights}. */
export interface LoraWeightsOptions {
  /**
   * The graph trains: with `dropout` > 0 each adapter's input is dropped out, the masks keyed by
   * the {@link LORA_DROPOUT_KEY} input this declares. Default false (scoring, evaluation: no dropout).
   */
  training?: boolean;
}

/**
 * Weights for the decoder with LoRA as a side branch: every weight is the base cast to `compute`,
 * and `branch` adds scale·(drop(x)·Aᵀ)·Bᵀ to each targeted projection (A and scale·B cast to
 * `compute`; inverted dropout's 1/(1 − p) is folded into the scale). A targeted matrix the decoder
 * does not read through a projection (an LM or score head) is merged instead, as in
 * {@link mergedLoraWeights}, and gets no dropout.
 */
export function loraWeights(base: (name: string) => Tensor, trainable: Map<string, Tensor>, adapters: LoraAdapter[], lora: LoraConfig, compute: DType, opts: LoraWeightsOptions = {}): Weights {
  const byTarget = new Map(adapters.map((a, index) => [a.target, { ...a, index }]));
  const p = opts.training ? (lora.dropout ?? 0) : 0;
  const graph = (trainable.values().next().value as Tensor).graph;
  const key = p > 0 ? graph.input(LORA_DROPOUT_KEY, 'int64', [3]) : undefined;
  const merged = mergedLoraWeights(base, trainable, adapters, lora, compute);
  const scale = lora.alpha / lora.rank / (1 - p);
  // A and scale·B in the compute dtype, once per adapter
  const factors = memo((ad: LoraAdapter) => {
    const b = trainable.get(ad.b.name)!;
    return { a: L.cast(trainable.get(ad.a.name)!, compute), b: L.cast(scale === 1 ? b : L.mul(b, scale), compute) };
  });
  const weights: Weights = memo((name: string) => (byTarget.has(name) && !isProjectionWeight(name) ? merged(name) : L.cast(base(name), compute)));
  // Adapters whose projections read the same input (a layer's q, k and v; its gate and up) share
  // one product x·[A₁; A₂; …]ᵀ when there is no dropout (dropout gives each adapter its own input).
  // The backward pass then forms one dA and one dx product for the group instead of one each, and
  // sums no per-adapter dx: LoRA's step at the 0.6B shape runs ~1,200 matmuls, most of them these
  // small rank-r products.
  const groups = new Map<string, (LoraAdapter & { index: number })[]>();
  if (!key) {
    for (const ad of byTarget.values()) {
      const g = sharedInputGroup(ad.target);
      if (g && isProjectionWeight(ad.target)) groups.set(g, [...(groups.get(g) ?? []), ad]);
    }
  }
  const fusedA = memo((group: string) => L.concat(groups.get(group)!.map((ad) => factors(ad).a), 0));
  const shared = new Map<Tensor, Map<string, Tensor[]>>();
  weights.branch = (name, x) => {
    const ad = byTarget.get(name);
    if (!ad || !isProjectionWeight(name)) return undefined;
    const { a, b } = factors(ad);
    const group = sharedInputGroup(name);
    const members = group ? groups.get(group) : undefined;
    if (group && members && members.length > 1) {
      const perInput = shared.get(x) ?? new Map<string, Tensor[]>();
      shared.set(x, perInput);
      let parts = perInput.get(group);
      if (!parts) {
        parts = L.split(linear(x, fusedA(group)), members.map((m) => m.a.shape[0]), -1);
        perInput.set(group, parts);
      }
      return linear(parts[members.findIndex((m) => m.target === name)], b);
    }
    const input = key ? L.where(droppedElements(x, streamKey(key, ad.index), p), graph.constant(0, x.dtype, []), x) : x;
    return linear(linear(input, a), b);
  };
  return weights;
}

/** The projections that read one input: a layer's q/k/v (`<layer>.self_attn:qkv`) and its gate/up (`<layer>.mlp:gate_up`). */
function sharedInputGroup(hfName: string): string | undefined {
  const attn = /^(.*\.self_attn)\.[qkv]_proj\.weight$/.exec(hfName);
  if (attn) return `${attn[1]}:qkv`;
  const mlp = /^(.*\.mlp)\.(gate|up)_proj\.weight$/.exec(hfName);
  return mlp ? `${mlp[1]}:gate_up` : undefined;
}

/**
 * Weights for the decoder with LoRA merged: targeted matrices become base + scale · B·A (computed
 * in float32, a base bound in a narrower dtype widened first, then cast to `compute`), the rest
 * are the base weights cast to `compute`. For graphs that read whole weights (generation: merged
 * once per run, outside the decode loop); training uses {@link loraWeights}, which never forms an
 * [out, in] gradient.
 */
export function mergedLoraWeights(base: (name: string) => Tensor, trainable: Map<string, Tensor>, adapters: LoraAdapter[], lora: LoraConfig, compute: DType): Weights {
  const byTarget = new Map(adapters.map((a) => [a.target, a]));
  const scale = lora.alpha / lora.rank;
  return memo((name: string) => {
    const ad = byTarget.get(name);
    let w = base(name);
    if (ad) w = L.add(L.cast(w, 'float32'), L.mul(L.matmul(trainable.get(ad.b.name)!, trainable.get(ad.a.name)!), scale));
    return L.cast(w, compute);
  });
}

/**
 * The dtype a LoRA run binds frozen base tensor `name` in: `compute`, since every graph casts the
 * base to it anyway (in bfloat16 half the bytes: an 8B base 16.4 GB instead of 32.8), except with
 * float32 compute or for a target {@link loraWeights} merges as base + B·A (an LM head, not a
 * projection), whose sum is formed in float32.
 */
export function loraBaseDtype<C extends DType>(name: string, adapters: readonly { target: string }[], compute: C): C | 'float32' {
  return compute !== 'float32' && !adapters.some((a) => a.target === name && !isProjectionWeight(name)) ? compute : 'float32';
}

/**
 * Frozen base tensor `name` uploaded to `device` in its {@link loraBaseDtype} from its float32
 * values: a 16-bit dtype is rounded to nearest even on the host, one tensor at a time, since the
 * device takes half-precision data only as bit patterns.
 */
export function uploadLoraBase(device: Device, name: string, base: { data: Float32Array; dims: readonly number[] }, adapters: readonly { target: string }[], compute: DType): DeviceTensor {
  const dtype = loraBaseDtype(name, adapters, compute);
  if (dtype === 'float32') return device.upload(base, 'float32');
  if (dtype === 'bfloat16') return device.upload({ data: toBfloat16Bits(base.data), dims: base.dims }, dtype);
  if (dtype === 'float16') return device.upload({ data: toFloat16Bits(base.data), dims: base.dims }, dtype);
  throw new Error(`uploadLoraBase: compute dtype ${compute} is not a LoRA base dtype (float32, bfloat16, float16)`);
}

/** base + scale · B·A for every adapter, on the host (for export and evaluation). */
export function mergeLora(base: Map<string, Float32Array>, values: Map<string, Float32Array>, adapters: LoraAdapter[], lora: LoraConfig): Map<string, Float32Array> {
  const merged = new Map(base);
  const scale = lora.alpha / lora.rank;
  for (const ad of adapters) {
    const W = Float32Array.from(base.get(ad.target)!);
    const A = values.get(ad.a.name)!;
    const B = values.get(ad.b.name)!;
    const [out, rank] = ad.b.shape;
    const inn = ad.a.shape[1];
    for (let o = 0; o < out; o++) {
      for (let k = 0; k < rank; k++) {
        const bk = B[o * rank + k] * scale;
        if (bk === 0) continue;
        const row = o * inn;
        const arow = k * inn;
        for (let i = 0; i < inn; i++) W[row + i] += bk * A[arow + i];
      }
    }
    merged.set(ad.target, W);
  }
  return merged;
}

/** `fn` computed once per argument. */
function memo<K, V>(fn: (k: K) => V): (k: K) => V {
  const done = new Map<K, V>();
  return (k) => {
    if (!done.has(k)) done.set(k, fn(k));
    return done.get(k)!;
  };
}

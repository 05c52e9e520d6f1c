/**
 * LoRA: a targeted matrix W [out, in] is used as W + (alpha / rank) · B · A with trainable
 * A [rank, in] and B [out, rank]; the base stays frozen (a read-only graph input shared by every
 * step) and only the adapters carry optimizer state. A starts uniform in ±1/√in and B at zero, so
 * training starts from the base model exactly. Adapters are named as PEFT names them
 * (`<module>.lora_A.weight`, `<module>.lora_B.weight`), and `mergeLora` folds them into the base
 * for export.
 */
import * as L from '@lathe/onnx';
import type { DType, Tensor } from '@lathe/onnx';
import { paramSpecs, type DecoderConfig, type Weights } from '@lathe/models';
import { seededRandom } from './sft-data';
import type { TrainableParam } from './train-step';

/** LoRA settings. */
export interface LoraConfig {
  rank: number;
  alpha: number;
  /** Regular expression matched against HF parameter names of matrices (e.g. `q_proj|v_proj`). */
  targets: string;
}

/** One adapted matrix. */
export interface LoraAdapter {
  /** The base weight's HF name. */
  target: string;
  a: TrainableParam;
  b: TrainableParam;
}

/** The adapters a config implies; an empty match is an error naming the pattern. */
export function loraAdapters(cfg: DecoderConfig, lora: LoraConfig): LoraAdapter[] {
  if (!Number.isInteger(lora.rank) || lora.rank < 1) throw new Error(`lora rank must be a positive integer, got ${lora.rank}`);
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

/**
 * Weights for the decoder: targeted matrices become base + scale · B·A (computed in float32, then
 * cast to `compute`), the rest are the base weights cast to `compute`.
 */
export function loraWeights(base: (name: string) => Tensor, trainable: Map<string, Tensor>, adapters: LoraAdapter[], lora: LoraConfig, compute: DType): Weights {
  const byTarget = new Map(adapters.map((a) => [a.target, a]));
  const cache = new Map<string, Tensor>();
  const scale = lora.alpha / lora.rank;
  return (name) => {
    const hit = cache.get(name);
    if (hit) return hit;
    const ad = byTarget.get(name);
    let w = base(name);
    if (ad) w = L.add(w, L.mul(L.matmul(trainable.get(ad.b.name)!, trainable.get(ad.a.name)!), scale));
    const t = w.dtype === compute ? w : L.cast(w, compute);
    cache.set(name, t);
    return t;
  };
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

/**
 * Rotary position embedding, all of it: the inverse frequencies of each rope-scaling variant
 * (computed in JavaScript once per model, float64, rounded to float32 when embedded, following the
 * formulas transformers uses), the cos/sin tables, and their application to queries and keys —
 * composed from primitives or through ONNX Runtime's fused RotaryEmbedding kernel.
 */
import * as L from '@lathe/onnx';
import type { DType, Tensor } from '@lathe/onnx';
import type { DecoderConfig } from './config';
import { accumulationDtype } from './precision';

/** Inverse frequencies (headDim/2 values) and the factor applied to cos/sin. */
export function ropeInverseFrequencies(cfg: DecoderConfig): { inverse: number[]; attentionScale: number } {
  const d = cfg.headDim;
  const base = cfg.ropeTheta;
  const half = d / 2;
  const inv = Array.from({ length: half }, (_, i) => 1 / base ** ((2 * i) / d));
  const rs = cfg.ropeScaling;
  switch (rs.type) {
    case 'default':
      return { inverse: inv, attentionScale: 1 };
    case 'linear':
      return { inverse: inv.map((f) => f / rs.factor), attentionScale: 1 };
    case 'llama3': {
      // Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
      const old = rs.originalMaxPositionEmbeddings;
      const lowWavelen = old / rs.lowFreqFactor;
      const highWavelen = old / rs.highFreqFactor;
      const inverse = inv.map((f) => {
        const wavelen = (2 * Math.PI) / f;
        if (wavelen > lowWavelen) return f / rs.factor;
        if (wavelen < highWavelen) return f;
        const smooth = (old / wavelen - rs.lowFreqFactor) / (rs.highFreqFactor - rs.lowFreqFactor);
        return (1 - smooth) * (f / rs.factor) + smooth * f;
      });
      return { inverse, attentionScale: 1 };
    }
    case 'yarn': {
      // Frequency pair i turns original/(2π·base^(2i/d)) times over the original context; pairs
      // turning more than betaFast times keep their frequency, fewer than betaSlow are slowed by
      // `factor`, and a linear ramp over the pair index blends the band between.
      const maxPos = rs.originalMaxPositionEmbeddings;
      const correctionDim = (rotations: number) => (d * Math.log(maxPos / (rotations * 2 * Math.PI))) / (2 * Math.log(base));
      const truncate = rs.truncate ?? true;
      const low = Math.max(truncate ? Math.floor(correctionDim(rs.betaFast)) : correctionDim(rs.betaFast), 0);
      let high = Math.min(truncate ? Math.ceil(correctionDim(rs.betaSlow)) : correctionDim(rs.betaSlow), d - 1);
      if (low === high) high += 0.001;
      const inverse = inv.map((f, i) => {
        const ramp = Math.min(1, Math.max(0, (i - low) / (high - low)));
        const extrapolation = 1 - ramp;
        return (f / rs.factor) * (1 - extrapolation) + f * extrapolation;
      });
      const mscale = (scale: number, m = 1) => (scale <= 1 ? 1 : 0.1 * m * Math.log(scale) + 1);
      const attentionScale =
        rs.attentionFactor ?? (rs.mscale && rs.mscaleAllDim ? mscale(rs.factor, rs.mscale) / mscale(rs.factor, rs.mscaleAllDim) : mscale(rs.factor));
      return { inverse, attentionScale };
    }
  }
}

/** Applies rotary position embedding to queries or keys [B, heads, T, headDim] (the fused form also [B, T, heads·headDim]). */
export type Rope = (x: Tensor) => Tensor;

/**
 * A rotary-embedding kernel standing in for ONNX Runtime's RotaryEmbedding on [B, T, heads·headDim]:
 * given x, position ids [B, T] and cos/sin caches [maxPositions, headDim/2] in x's dtype, returns
 * the rotated x, differentiable in x (`ropeOps(...).rotate` of @lathe/kernels; the session then needs
 * its custom-op domain).
 */
export type RopeKernel = (x: Tensor, positionIds: Tensor, cosCache: Tensor, sinCache: Tensor) => Tensor;

/**
 * RoPE at the given positions [B, T]: composed from primitives (cos/sin computed per position), or
 * fused (ONNX Runtime's RotaryEmbedding reading cos/sin tables precomputed for every position, or
 * `kernel` reading the same tables in its place; the kernel takes only [B, T, heads·headDim]).
 */
export function rope(cfg: DecoderConfig, positionIds: Tensor, dtype: DType, fused = false, kernel?: RopeKernel): Rope {
  if (kernel) {
    const { cos, sin } = ropeCaches(cfg, positionIds.graph, dtype);
    return (x) => kernel(x, positionIds, cos, sin);
  }
  if (!fused) {
    const { cos, sin } = ropeTables(cfg, positionIds, dtype);
    return (x) => applyRope(x, cos, sin, cfg.headDim);
  }
  const { cos: cosCache, sin: sinCache } = ropeCaches(cfg, positionIds.graph, dtype);
  return (x) => L.rotaryEmbedding(x, positionIds, cosCache, sinCache);
}

/** cos and sin tables [maxPositions, headDim/2] for every position, as the fused kernels read them. */
export function ropeCaches(cfg: DecoderConfig, g: L.Graph, dtype: DType): { cos: Tensor; sin: Tensor } {
  const { inverse, attentionScale } = ropeInverseFrequencies(cfg);
  const P = cfg.maxPositionEmbeddings;
  const half = inverse.length;
  const cos = new Float32Array(P * half);
  const sin = new Float32Array(P * half);
  for (let p = 0; p < P; p++) {
    for (let i = 0; i < half; i++) {
      // Angles in float32 as transformers forms them (position · fp32 inverse frequency).
      const angle = Math.fround(p * Math.fround(inverse[i]));
      cos[p * half + i] = Math.cos(angle) * attentionScale;
      sin[p * half + i] = Math.sin(angle) * attentionScale;
    }
  }
  const table = (v: Float32Array) => L.cast(g.constant(v, 'float32', [P, half]), dtype);
  return { cos: table(cos), sin: table(sin) };
}

/** cos and sin tables [B, 1, T, headDim] for the given positions (float32 math, cast to dtype). */
export function ropeTables(cfg: DecoderConfig, positionIds: Tensor, dtype: DType): { cos: Tensor; sin: Tensor } {
  const { inverse, attentionScale } = ropeInverseFrequencies(cfg);
  const g = positionIds.graph;
  const acc = accumulationDtype(dtype);
  const invFreq = g.constant(inverse.map((f) => Math.fround(f)), acc, [inverse.length]);
  const freqs = L.mul(L.unsqueeze(L.cast(positionIds, acc), [2]), invFreq); // [B, T, hd/2]
  const emb = L.concat([freqs, freqs], 2);
  const scale = (t: Tensor) => (attentionScale === 1 ? t : L.mul(t, attentionScale));
  const cos = L.cast(scale(L.cos(emb)), dtype);
  const sin = L.cast(scale(L.sin(emb)), dtype);
  return { cos: L.unsqueeze(cos, [1]), sin: L.unsqueeze(sin, [1]) };
}

/** q·cos + rotate_half(q)·sin, where rotate_half([a, b]) = [−b, a] over the last axis. */
export function applyRope(x: Tensor, cos: Tensor, sin: Tensor, headDim: number): Tensor {
  const [x1, x2] = L.split(x, [headDim / 2, headDim / 2], -1);
  const rotated = L.concat([L.neg(x2), x1], -1);
  return L.add(L.mul(x, cos), L.mul(rotated, sin));
}

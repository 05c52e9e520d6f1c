/**
 * RoPE inverse frequencies for each rope-scaling variant, computed in JavaScript once per model
 * (float64, rounded to float32 when embedded), following the formulas transformers uses.
 */
import type { DecoderConfig } from './config';

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

/**
 * The host rule of the decode-attention ops: e4m3 encoding (`__nv_cvt_float_to_fp8`'s round to
 * nearest even with saturation) against hand-worked values, per-vector quantization within half an
 * e4m3 step, and the unsupported shapes named (groups past 8 among them).
 */
import { decodeAttentionUnsupported, e4m3Decode, e4m3Encode, quantizeE4m3Reference } from '@lathe/kernels';

test('e4m3: exact values, ties to even, subnormals, saturation at ±448', () => {
  expect(e4m3Encode(1)).toBe(0x38); // 2^0: exponent 7 (bias 7)
  expect(e4m3Encode(1.125)).toBe(0x39);
  expect(e4m3Encode(1.0625)).toBe(0x38); // halfway 1 ↔ 1.125: the even mantissa (0)
  expect(e4m3Encode(1.1875)).toBe(0x3a); // halfway 1.125 ↔ 1.25: the even mantissa (2)
  expect(e4m3Encode(240)).toBe(0x77); // 1.875 · 2^7
  expect(e4m3Encode(448)).toBe(0x7e);
  expect(e4m3Encode(464)).toBe(0x7e); // past the largest finite: saturates (0x7f is NaN)
  expect(e4m3Encode(1e6)).toBe(0x7e);
  expect(e4m3Encode(-448)).toBe(0xfe);
  expect(e4m3Encode(2 ** -6)).toBe(0x08); // the smallest normal
  expect(e4m3Encode(2 ** -9)).toBe(0x01); // the smallest subnormal
  expect(e4m3Encode(2 ** -10)).toBe(0x00); // halfway 0 ↔ 2^-9: even
  expect(e4m3Encode(3 * 2 ** -10)).toBe(0x02); // halfway 1 ↔ 2 (× 2^-9): even
  expect(e4m3Encode(-0.5)).toBe(0x80 | 0x30);
  expect(e4m3Decode(0x7e)).toBe(448);
  expect(e4m3Decode(0x08)).toBe(2 ** -6);
  expect(e4m3Decode(0x07)).toBe(7 * 2 ** -9);
  expect(e4m3Decode(0xb9)).toBe(-1.125);
  // every finite byte survives the round trip
  for (let b = 0; b < 256; b++) if ((b & 0x7f) !== 0x7f && b !== 0x80) expect(e4m3Encode(e4m3Decode(b))).toBe(b);
});

test('per-vector quantization: the amax maps to 448, every element within half a step (≤ amax/16)', () => {
  const D = 16;
  const x = Float32Array.from({ length: 3 * D }, (_, i) => Math.sin(i * 1.7) * (i < D ? 3 : i < 2 * D ? 0.01 : 0));
  const { data, scale } = quantizeE4m3Reference(x, D);
  for (let r = 0; r < 3; r++) {
    const row = x.subarray(r * D, (r + 1) * D);
    const amax = Math.max(...Array.from(row, Math.abs));
    expect(scale[r]).toBeCloseTo(amax / 448, 9);
    for (let d = 0; d < D; d++) {
      const back = e4m3Decode(data[r * D + d]) * scale[r];
      expect(Math.abs(back - row[d])).toBeLessThanOrEqual(amax / 16 + 1e-12);
      if (Math.abs(row[d]) === amax && amax > 0) expect(Math.abs(e4m3Decode(data[r * D + d]))).toBe(448);
    }
  }
  expect(Array.from(data.subarray(2 * D), e4m3Decode).every((v) => v === 0)).toBe(true); // a zero vector: ±0 bytes, scale 0
  expect(scale[2]).toBe(0);
});

test('shapes the kernels do not take are named', () => {
  const base = { dtype: 'bfloat16' as const, headDim: 128, numHeads: 16, numKvHeads: 8, cache: 'native' as const };
  expect(decodeAttentionUnsupported(base)).toBeUndefined();
  expect(decodeAttentionUnsupported({ ...base, headDim: 96 })).toMatch(/head size 96/);
  // every group 1..8 has a build (Qwen3-14B's 40/8, Qwen2.5-7B's 28/4); past 8 it is named
  for (const [H, KV] of [[8, 8], [24, 8], [40, 8], [48, 8], [28, 4], [64, 8]]) expect(decodeAttentionUnsupported({ ...base, numHeads: H, numKvHeads: KV })).toBeUndefined();
  expect(decodeAttentionUnsupported({ ...base, numHeads: 72 })).toBe('9 query heads per KV head (72/8; the kernels take 1 to 8)');
  expect(decodeAttentionUnsupported({ ...base, numHeads: 128, cache: 'float8e4m3' })).toMatch(/16 query heads per KV head/);
  expect(decodeAttentionUnsupported({ ...base, numHeads: 12 })).toMatch(/must divide/);
  expect(decodeAttentionUnsupported({ ...base, dtype: 'float32' })).toMatch(/bfloat16 or float16/);
  expect(decodeAttentionUnsupported({ ...base, dtype: 'float32', headDim: 16, numHeads: 4, numKvHeads: 2 }, 'cpu')).toBeUndefined();
});

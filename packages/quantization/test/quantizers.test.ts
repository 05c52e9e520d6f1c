/**
 * The quantizers against references written here from each format's published definition (no
 * code shared with the package): same codes and scales bit for bit, round-trip error within the
 * bound the definition implies, on Gaussian and heavy-tailed weights, and stored bits per weight.
 */
import { bitsPerWeight, dequantize, DYNAMIC_CODE, NF4_CODE, nestedAbsmax, quantizeInt4, quantizeInt8, quantizeNf4, type Int4Matrix, type QuantizedMatrix } from '@lathe/quantization';
import { gaussian, heavyTailed } from './data';

/** Round half to even, written differently from the package's. */
function rint(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}
const f32 = Math.fround;

function refInt8(w: Float32Array, N: number, K: number): { q: number[]; s: number[] } {
  const q: number[] = [];
  const s: number[] = [];
  for (let n = 0; n < N; n++) {
    const row = Array.from(w.subarray(n * K, (n + 1) * K));
    const sc = f32(Math.max(...row.map(Math.abs)) / 127);
    s.push(sc);
    for (const x of row) q.push(sc === 0 ? 0 : Math.min(127, Math.max(-127, rint(x / sc))));
  }
  return { q, s };
}

/** Unpacked INT4 codes [N, K] and per-block scale/zero point by the definitions (Q4_0 / min-max). */
function refInt4(w: Float32Array, N: number, K: number, bs: number, zp: boolean): { q: number[][]; s: number[][]; z: number[][] } {
  const q: number[][] = [];
  const s: number[][] = [];
  const z: number[][] = [];
  for (let n = 0; n < N; n++) {
    q.push([]);
    s.push([]);
    z.push([]);
    for (let k0 = 0; k0 < K; k0 += bs) {
      const blk = Array.from(w.subarray(n * K + k0, n * K + Math.min(K, k0 + bs)));
      let sc: number;
      let zero: number;
      if (zp) {
        const lo = Math.min(0, ...blk);
        const hi = Math.max(0, ...blk);
        sc = f32((hi - lo) / 15);
        zero = sc === 0 ? 8 : Math.min(15, Math.max(0, rint(-lo / sc)));
      } else {
        const m = blk.reduce((a, b) => (Math.abs(b) > Math.abs(a) ? b : a), 0);
        sc = f32(m / -8);
        zero = 8;
      }
      s[n].push(sc);
      z[n].push(zero);
      for (const x of blk) q[n].push(sc === 0 ? zero : Math.min(15, Math.max(0, rint(x / sc) + zero)));
    }
  }
  return { q, s, z };
}

/** NF4 codes of the flattened weights: the nearest table value to w·(1/absmax), ties to the lower. */
function refNf4(w: Float32Array, bs: number): { q: number[]; absmax: number[] } {
  const q: number[] = [];
  const absmax: number[] = [];
  for (let i0 = 0; i0 < w.length; i0 += bs) {
    const blk = Array.from(w.subarray(i0, i0 + bs));
    const a = Math.max(...blk.map(Math.abs));
    absmax.push(a);
    for (const x of blk) {
      const v = f32(x * f32(1 / a));
      let best = 0;
      for (let c = 1; c < 16; c++) if (Math.abs(v - NF4_CODE[c]) < Math.abs(v - NF4_CODE[best])) best = c;
      q.push(best);
    }
  }
  return { q, absmax };
}

function unpackInt4(m: Int4Matrix): number[][] {
  const nb = Math.ceil(m.cols / m.blockSize);
  return Array.from({ length: m.rows }, (_, n) => Array.from({ length: m.cols }, (_, k) => (m.packed[n * nb * (m.blockSize / 2) + (k >> 1)] >> (k & 1 ? 4 : 0)) & 15));
}

function relRmsError(w: Float32Array, m: QuantizedMatrix): number {
  const d = dequantize(m);
  let e = 0;
  let s = 0;
  for (let i = 0; i < w.length; i++) {
    e += (w[i] - d[i]) ** 2;
    s += w[i] ** 2;
  }
  return Math.sqrt(e / s);
}

const shapes: [number, number][] = [
  [16, 128],
  [7, 200], // K not a multiple of any block: padded
];

describe.each([
  ['gaussian', gaussian],
  ['heavy-tailed', heavyTailed],
])('%s weights', (_name, sample) => {
  test.each(shapes)('INT8 [%i, %i]: codes and scales as defined; error ≤ s/2', (N, K) => {
    const w = sample(N * K, 11);
    const m = quantizeInt8(w, N, K);
    const ref = refInt8(w, N, K);
    expect(Array.from(m.q)).toEqual(ref.q);
    expect(Array.from(m.scales)).toEqual(ref.s);
    const d = dequantize(m);
    for (let n = 0; n < N; n++) for (let k = 0; k < K; k++) expect(Math.abs(d[n * K + k] - w[n * K + k])).toBeLessThanOrEqual(m.scales[n] * 0.5 * (1 + 1e-6));
  });

  test.each(
    shapes.flatMap(([N, K]) =>
      [32, 64, 128].flatMap((bs) => [
        [N, K, bs, false],
        [N, K, bs, true],
      ]),
    ) as [number, number, number, boolean][],
  )('INT4 [%i, %i] block %i zero points %s: codes, scales and zero points as defined; error bound', (N, K, bs, zp) => {
    const w = sample(N * K, 12);
    const m = quantizeInt4(w, N, K, { blockSize: bs, zeroPoints: zp });
    const ref = refInt4(w, N, K, bs, zp);
    expect(unpackInt4(m)).toEqual(ref.q);
    const nb = Math.ceil(K / bs);
    expect(Array.from(m.scales)).toEqual(ref.s.flat());
    expect(m.packed.length).toBe((N * nb * bs) / 2);
    if (zp) {
      const zps = Array.from({ length: N }, (_, n) => Array.from({ length: nb }, (_, b) => (m.zeroPoints![n * Math.ceil(nb / 2) + (b >> 1)] >> (b & 1 ? 4 : 0)) & 15));
      expect(zps).toEqual(ref.z);
    }
    // Padding past K holds the zero point (a zero weight).
    if (K % bs) {
      const lastCol = nb * bs - 1;
      expect((m.packed[nb * (bs / 2) - 1] >> (lastCol & 1 ? 4 : 0)) & 15).toBe(ref.z[0][nb - 1]);
    }
    const d = dequantize(m);
    for (let n = 0; n < N; n++) {
      for (let k = 0; k < K; k++) {
        const s = Math.abs(m.scales[n * nb + Math.floor(k / bs)]);
        // Symmetric: the one value at −m clips to 7·s (error |s|); everything else within s/2.
        expect(Math.abs(d[n * K + k] - w[n * K + k])).toBeLessThanOrEqual(s * (zp ? 0.5 : 1) * (1 + 1e-6));
      }
    }
  });

  test.each([...shapes, [3, 21] as [number, number]])('NF4 [%i, %i]: codes (high nibble first) and absmax as defined; error ≤ absmax · half the widest gap', (N, K) => {
    const w = sample(N * K, 13);
    const m = quantizeNf4(w, N, K);
    const ref = refNf4(w, 64);
    const codes = Array.from({ length: N * K }, (_, i) => (i & 1 ? m.packed[i >> 1] & 15 : m.packed[i >> 1] >> 4));
    expect(codes).toEqual(ref.q);
    expect(Array.from(m.absmax)).toEqual(ref.absmax);
    expect(m.packed.length).toBe(Math.ceil((N * K) / 2));
    const halfGap = (1 - 0.6961928009986877) / 2; // the widest gap of the NF4 table, between its two lowest values
    const d = dequantize(m);
    for (let i = 0; i < N * K; i++) expect(Math.abs(d[i] - w[i])).toBeLessThanOrEqual(m.absmax[Math.floor(i / 64)] * halfGap * (1 + 1e-6));
  });

  test('relative RMS error per format (seeded, [64, 256])', () => {
    const w = sample(64 * 256, 14);
    const err = {
      int8: relRmsError(w, quantizeInt8(w, 64, 256)),
      int4: relRmsError(w, quantizeInt4(w, 64, 256, { blockSize: 32 })),
      int4zp: relRmsError(w, quantizeInt4(w, 64, 256, { blockSize: 32, zeroPoints: true })),
      int4b128: relRmsError(w, quantizeInt4(w, 64, 256, { blockSize: 128 })),
      nf4: relRmsError(w, quantizeNf4(w, 64, 256)),
      nf4dq: relRmsError(w, quantizeNf4(w, 64, 256, { doubleQuant: true })),
    };
    expect(err.int8).toBeLessThan(_name === 'gaussian' ? 0.01 : 0.03);
    expect(err.int8 * 5).toBeLessThan(err.int4);
    expect(err.int4).toBeLessThan(err.int4b128);
    expect(err.int4).toBeLessThan(_name === 'gaussian' ? 0.12 : 0.2);
    expect(err.nf4).toBeLessThan(_name === 'gaussian' ? 0.12 : 0.2);
    // Double quantization changes the scales by under 1%, so the error barely moves.
    expect(Math.abs(err.nf4dq - err.nf4)).toBeLessThan(0.01 * err.nf4 + 1e-4);
  });
});

describe('double quantization', () => {
  test('the dynamic code as create_dynamic_map(signed=True) defines it: 256 sorted values, 0 and 1, extremes by hand', () => {
    expect(DYNAMIC_CODE.length).toBe(256);
    for (let i = 1; i < 256; i++) expect(DYNAMIC_CODE[i]).toBeGreaterThan(DYNAMIC_CODE[i - 1]);
    expect(DYNAMIC_CODE[255]).toBe(1);
    expect(DYNAMIC_CODE.filter((v) => v === 0).length).toBe(1);
    // Largest below 1: the mean of the last two of 65 points in [0.1, 1] = (0.9859375 + 1) / 2.
    expect(DYNAMIC_CODE[254]).toBeCloseTo(0.99296875, 6);
    expect(DYNAMIC_CODE[0]).toBeCloseTo(-0.99296875, 6);
    // Smallest magnitude: 10⁻⁶ · (0.1 + 1) / 2.
    const positives = Array.from(DYNAMIC_CODE).filter((v) => v > 0);
    expect(positives.length).toBe(128);
    expect(positives[0]).toBeCloseTo(5.5e-7, 12);
  });

  test('scales: offset = mean, nested absmax per 256 blocks, recovered within half a code step; 0.37 bit saved per weight', () => {
    const N = 128;
    const K = 512; // 1024 NF4 blocks → 4 nested blocks
    const w = heavyTailed(N * K, 21);
    const plain = quantizeNf4(w, N, K);
    const dq = quantizeNf4(w, N, K, { doubleQuant: true });
    const n = dq.nested!;
    const mean = plain.absmax.reduce((a, b) => a + b, 0) / plain.absmax.length;
    expect(n.offset).toBeCloseTo(mean, 7);
    expect(n.absmax.length).toBe(4);
    expect(Array.from(dq.packed)).toEqual(Array.from(plain.packed)); // the 4-bit codes do not change
    expect(Array.from(dq.absmax)).toEqual(Array.from(nestedAbsmax(n)));
    for (let b = 0; b < plain.absmax.length; b++) {
      const a2 = n.absmax[Math.floor(b / 256)];
      const c = (plain.absmax[b] - n.offset) / a2; // in [−1, 1]
      // The nearest code value: the error is at most half the local gap of the code.
      const i = n.codes[b];
      const gap = Math.max(i > 0 ? DYNAMIC_CODE[i] - DYNAMIC_CODE[i - 1] : 0, i < 255 ? DYNAMIC_CODE[i + 1] - DYNAMIC_CODE[i] : 0);
      expect(Math.abs(c - DYNAMIC_CODE[i])).toBeLessThanOrEqual(gap / 2 + 1e-7);
      expect(Math.abs(dq.absmax[b] - plain.absmax[b])).toBeLessThanOrEqual(a2 * gap * 0.5 + 1e-7);
    }
    // 4 + 32/64 bits plain; 4 + 8/64 + 32/(64·256) (+ the 32-bit offset) doubled.
    expect(bitsPerWeight(plain)).toBeCloseTo(4.5, 10);
    expect(bitsPerWeight(dq)).toBeCloseTo(4 + 8 / 64 + (32 * 4 + 32) / (N * K), 10);
    expect(bitsPerWeight(plain) - bitsPerWeight(dq)).toBeGreaterThan(0.37);
  });

  test('bits per weight: int8 8 + 32/K, int4 block 64 4 + 32/64 (+ 4/64 with zero points)', () => {
    const w = gaussian(32 * 256, 3);
    expect(bitsPerWeight(quantizeInt8(w, 32, 256))).toBeCloseTo(8 + 32 / 256, 10);
    expect(bitsPerWeight(quantizeInt4(w, 32, 256, { blockSize: 64 }))).toBeCloseTo(4.5, 10);
    expect(bitsPerWeight(quantizeInt4(w, 32, 256, { blockSize: 64, zeroPoints: true }))).toBeCloseTo(4.5 + 4 / 64, 10);
  });

  test('bad input is named', () => {
    expect(() => quantizeInt4(new Float32Array(8), 2, 4, { blockSize: 48 })).toThrow(/block size 48 is not one of 32, 64, 128/);
    expect(() => quantizeInt8(new Float32Array(7), 2, 4)).toThrow(/quantizeInt8: 7 values for a \[2, 4\] matrix/);
  });
});

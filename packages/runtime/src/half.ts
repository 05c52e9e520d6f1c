/**
 * Exact float32 ↔ float16 / bfloat16 conversions on the host. Narrowing rounds to nearest, ties to
 * even (as IEEE 754 and the GPU's cast kernels do); NaN stays NaN (quiet), overflow becomes ±inf,
 * values below half the smallest subnormal become ±0. Widening is exact (table lookup for fp16).
 */
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float32 bit pattern → float16 bit pattern, round to nearest even. */
function f16BitsOf(u: number): number {
  const sign = (u >>> 16) & 0x8000;
  const exp = (u >>> 23) & 0xff;
  let mant = u & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 | (mant >>> 13) : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    const half = 1 << (shift - 1);
    let r = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    if (rem > half || (rem === half && r & 1)) r++;
    return sign | r;
  }
  let r = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  // a carry out of the mantissa correctly bumps the exponent (up to inf)
  if (rem > 0x1000 || (rem === 0x1000 && r & 1)) r++;
  return sign | r;
}

let f16Table: Float32Array | undefined;
/** All 65,536 float16 values as float32 (built once, 256 KB). */
function float16Table(): Float32Array {
  if (f16Table) return f16Table;
  const t = new Float32Array(65536);
  const bits = new Uint32Array(t.buffer);
  for (let h = 0; h < 65536; h++) {
    const sign = (h & 0x8000) << 16;
    const exp = (h >>> 10) & 0x1f;
    const mant = h & 0x3ff;
    if (exp === 0) t[h] = (sign ? -1 : 1) * mant * 2 ** -24;
    else if (exp === 0x1f) bits[h] = sign | 0x7f800000 | (mant << 13);
    else bits[h] = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  return (f16Table = t);
}

/** float32 values → float16 bit patterns. */
export function toFloat16Bits(src: ArrayLike<number>, out = new Uint16Array(src.length)): Uint16Array {
  if (src instanceof Float32Array) {
    const bits = new Uint32Array(src.buffer, src.byteOffset, src.length);
    for (let i = 0; i < bits.length; i++) out[i] = f16BitsOf(bits[i]);
  } else {
    for (let i = 0; i < src.length; i++) {
      f32[0] = src[i];
      out[i] = f16BitsOf(u32[0]);
    }
  }
  return out;
}

/** float16 bit patterns → float32 values (exact). */
export function fromFloat16Bits(src: Uint16Array, out = new Float32Array(src.length)): Float32Array {
  const t = float16Table();
  for (let i = 0; i < src.length; i++) out[i] = t[src[i]];
  return out;
}

/** float32 values → bfloat16 bit patterns (the upper half of the float32, rounded to nearest even). */
export function toBfloat16Bits(src: ArrayLike<number>, out = new Uint16Array(src.length)): Uint16Array {
  const bits = src instanceof Float32Array ? new Uint32Array(src.buffer, src.byteOffset, src.length) : undefined;
  for (let i = 0; i < src.length; i++) {
    let u: number;
    if (bits) u = bits[i];
    else {
      f32[0] = src[i];
      u = u32[0];
    }
    if ((u & 0x7f800000) === 0x7f800000 && u & 0x7fffff) out[i] = (u >>> 16) | 0x40;
    else out[i] = (u + 0x7fff + ((u >>> 16) & 1)) >>> 16;
  }
  return out;
}

/** bfloat16 bit patterns → float32 values (exact). */
export function fromBfloat16Bits(src: Uint16Array, out = new Float32Array(src.length)): Float32Array {
  const bits = new Uint32Array(out.buffer, out.byteOffset, out.length);
  for (let i = 0; i < src.length; i++) bits[i] = src[i] << 16;
  return out;
}

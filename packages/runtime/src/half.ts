/**
 * Exact float32 ↔ float16 / bfloat16 conversions on the host. Narrowing rounds to nearest, ties to
 * even (as IEEE 754 and the GPU's cast kernels do); NaN stays NaN (quiet), overflow becomes ±inf,
 * values below half the smallest subnormal become ±0. Widening is exact (table lookup for fp16).
 */
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

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
  const f = src instanceof Float32Array ? src : Float32Array.from(src);
  const bits = new Uint32Array(f.buffer, f.byteOffset, f.length);
  // F. Giesen's round-to-nearest-even conversion: integer rounding for normals, a float add that
  // lets the FPU round subnormals; branch-light, so the JIT keeps the loop tight.
  const magic = new Float32Array(1);
  const magicBits = new Uint32Array(magic.buffer);
  const DENORM_MAGIC = ((127 - 15) + (23 - 10) + 1) << 23;
  for (let i = 0; i < bits.length; i++) {
    let u = bits[i];
    const sign = (u >>> 16) & 0x8000;
    u &= 0x7fffffff;
    let o: number;
    if (u >= 0x47800000) o = u > 0x7f800000 ? 0x7e00 | ((u >>> 13) & 0x3ff) : 0x7c00; // overflow, inf, NaN
    else if (u < 0x38800000) {
      // subnormal or zero: add the magic number so the FPU shifts and rounds the mantissa
      magicBits[0] = u;
      magic[0] += f16DenormMagic;
      o = magicBits[0] - DENORM_MAGIC;
    } else {
      const odd = (u >>> 13) & 1;
      o = (u + ((15 - 127) << 23) + 0xfff + odd) >>> 13;
    }
    out[i] = o | sign;
  }
  return out;
}

const f16DenormMagic = new Float32Array(new Uint32Array([((127 - 15) + (23 - 10) + 1) << 23]).buffer)[0];

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

/**
 * Raw little-endian tensor bytes (e.g. a safetensors entry) of a float dtype as float32 values: a
 * copy for float32, an exact widening for bfloat16 and float16. Other dtypes are an error that
 * names `where`.
 */
export function bytesToFloat32(bytes: Uint8Array, dtype: string, where: string): Float32Array {
  const copy = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
  if (dtype === 'float32') return new Float32Array(copy);
  if (dtype === 'bfloat16') return fromBfloat16Bits(new Uint16Array(copy));
  if (dtype === 'float16') return fromFloat16Bits(new Uint16Array(copy));
  throw new Error(`${where}: dtype ${dtype} cannot be read as floats (float32, bfloat16 and float16 can)`);
}

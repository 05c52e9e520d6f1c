/**
 * The fixed code tables of the 4-bit and 8-bit formats, as bitsandbytes defines them
 * (bitsandbytes/functional.py and csrc/kernels.cu): NF4's sixteen values, the decision thresholds
 * its quantization kernel compares against, and the signed 8-bit "dynamic" code that double
 * quantization stores the NF4 block scales in.
 */

/** NF4 (QLoRA, Dettmers et al. 2023): the quantiles of N(0, 1) scaled to [−1, 1], code 7 = 0. */
export const NF4_CODE: Float32Array = Float32Array.from([
  -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
  0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]);

/**
 * The midpoints between neighbouring NF4 values that bitsandbytes' `dQuantizeNF4` compares a
 * normalized weight against (x > threshold[i] ⇒ code > i): nearest value, ties to the lower code.
 */
export const NF4_THRESHOLDS: Float32Array = Float32Array.from([
  -0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544, -0.23460740596055984, -0.13791173323988914, -0.045525018125772476,
  0.03979014977812767, 0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683, 0.5016634166240692, 0.6427869200706482, 0.8614784181118011,
]);

/** `torch.linspace(start, end, steps)` in float32: the first half counted from start, the rest from end. */
function linspaceF32(start: number, end: number, steps: number): Float32Array {
  const out = new Float32Array(steps);
  const step = Math.fround((end - start) / (steps - 1));
  const half = Math.floor(steps / 2);
  for (let i = 0; i < steps; i++) out[i] = i < half ? Math.fround(start + step * i) : Math.fround(end - step * (steps - 1 - i));
  return out;
}

/**
 * bitsandbytes' `create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)`: for each
 * decade 10^(i−6), i = 0..6, the midpoints of 2^i + 1 evenly spaced points in [0.1, 1], with both
 * signs, plus 0 and 1 — 256 values, sorted. Dense near zero, so small block scales keep precision.
 */
export function dynamicCode(): Float32Array {
  const values: number[] = [];
  for (let i = 0; i < 7; i++) {
    const b = linspaceF32(0.1, 1, 2 ** i + 1);
    const decade = Math.fround(10 ** (i - 6));
    for (let j = 0; j + 1 < b.length; j++) {
      const mean = Math.fround(Math.fround(b[j] + b[j + 1]) / 2);
      const v = Math.fround(decade * mean);
      values.push(v, -v);
    }
  }
  values.push(0, 1);
  if (values.length !== 256) throw new Error(`dynamic code: ${values.length} values, expected 256`);
  return Float32Array.from(values.sort((a, b) => a - b));
}

/** The signed 8-bit dynamic code, made once. */
export const DYNAMIC_CODE: Float32Array = dynamicCode();

import * as L from '@lathe/onnx';
import { bytesToFloat32, Device, fromBfloat16Bits, fromFloat16Bits, toBfloat16Bits, toFloat16Bits } from '@lathe/runtime';

/** float32 values that exercise every rounding path: ties, subnormals, overflow, specials. */
function probes(): Float32Array {
  const v: number[] = [0, -0, 1, -1, 65504, 65519, 65520, -65520, 1e9, 1e-9, 2 ** -24, 2 ** -25, 2 ** -25 * 1.5, 2 ** -26, 6.1e-5, 5.96e-8, Infinity, -Infinity, NaN, 3.4e38, 1.17549435e-38, 1e-45];
  // exact ties halfway between neighbouring float16 / bfloat16 values, both parities
  for (const base of [1, 1 + 2 ** -10, 1024, 3.5, 2 ** -14, 2 ** -20]) {
    v.push(base + base * 2 ** -11, base + base * 2 ** -11 * 3, base + base * 2 ** -8, base + base * 2 ** -8 * 3);
  }
  let s = 12345;
  const rand = () => ((s = (Math.imul(s, 1103515245) + 12345) >>> 0) / 2 ** 32);
  for (let i = 0; i < 20000; i++) v.push((rand() - 0.5) * 2 ** Math.floor(rand() * 60 - 30));
  const bits = new Uint32Array(5000);
  for (let i = 0; i < bits.length; i++) bits[i] = Math.floor(rand() * 2 ** 32);
  v.push(...new Float32Array(bits.buffer));
  return Float32Array.from(v);
}

/** ORT's own Cast kernels on the CPU: the independent reference. */
async function ortCast(x: Float32Array, to: 'float16' | 'bfloat16'): Promise<{ narrow: Uint16Array; wide: Float32Array }> {
  const g = new L.Graph(`cast_${to}`);
  const input = g.input('x', 'float32', ['N']);
  const narrow = L.cast(input, to);
  g.output(narrow, 'narrow');
  g.output(L.cast(narrow, 'float32'), 'wide');
  const s = Device.cpu().compile(g);
  const out = await s.run({ x: { data: x, dims: [x.length] } });
  s.dispose();
  return { narrow: out.narrow.data as Uint16Array, wide: out.wide.data as Float32Array };
}

const isNaN16 = (h: number) => (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0;
const isNaNb16 = (h: number) => (h & 0x7f80) === 0x7f80 && (h & 0x7f) !== 0;

test('float32 → float16 rounds exactly as ORT Cast does (nearest, ties to even); widening is exact', async () => {
  const x = probes();
  const ref = await ortCast(x, 'float16');
  const mine = toFloat16Bits(x);
  for (let i = 0; i < x.length; i++) {
    if (isNaN16(ref.narrow[i])) {
      if (!isNaN16(mine[i])) throw new Error(`float16 of NaN: ${mine[i].toString(16)}`);
    } else if (mine[i] !== ref.narrow[i]) throw new Error(`float16 of ${x[i]}: ${mine[i].toString(16)} vs ORT ${ref.narrow[i].toString(16)}`);
  }
  const wide = fromFloat16Bits(ref.narrow);
  expect(Array.from(wide).filter((w, i) => !Object.is(w, ref.wide[i]) && !Number.isNaN(w))).toEqual([]);
});

test('float32 → bfloat16 rounds exactly as ORT Cast does; widening is exact', async () => {
  const x = probes();
  const ref = await ortCast(x, 'bfloat16');
  const mine = toBfloat16Bits(x);
  for (let i = 0; i < x.length; i++) {
    if (isNaNb16(ref.narrow[i])) {
      if (!isNaNb16(mine[i])) throw new Error(`bfloat16 of NaN: ${mine[i].toString(16)}`);
    } else if (mine[i] !== ref.narrow[i]) throw new Error(`bfloat16 of ${x[i]}: ${mine[i].toString(16)} vs ORT ${ref.narrow[i].toString(16)}`);
  }
  const wide = fromBfloat16Bits(ref.narrow);
  expect(Array.from(wide).filter((w, i) => !Object.is(w, ref.wide[i]) && !Number.isNaN(w))).toEqual([]);
});

test('every float16 and bfloat16 value survives widening and narrowing unchanged', () => {
  const all = new Uint16Array(65536).map((_, i) => i);
  const h = toFloat16Bits(fromFloat16Bits(all));
  const b = toBfloat16Bits(fromBfloat16Bits(all));
  const bad: string[] = [];
  for (let i = 0; i < 65536; i++) {
    if (isNaN16(i) ? !isNaN16(h[i]) : h[i] !== i) bad.push(`f16 ${i.toString(16)} → ${h[i].toString(16)}`);
    if (isNaNb16(i) ? !isNaNb16(b[i]) : b[i] !== i) bad.push(`bf16 ${i.toString(16)} → ${b[i].toString(16)}`);
  }
  expect(bad).toEqual([]);
});

test('plain number arrays convert like Float32Arrays', () => {
  const v = [0.1, -2.5, 1e-6, 70000];
  expect(Array.from(toFloat16Bits(v))).toEqual(Array.from(toFloat16Bits(Float32Array.from(v))));
  expect(Array.from(toBfloat16Bits(v))).toEqual(Array.from(toBfloat16Bits(Float32Array.from(v))));
});

test('bytesToFloat32: float32 copied, bfloat16 and float16 widened exactly, other dtypes named in the error', () => {
  const values = Float32Array.from([0, 1.5, -2.25, 65504, 1e-3]);
  const bytes = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  expect(Array.from(bytesToFloat32(bytes(values), 'float32', 'x'))).toEqual(Array.from(values));
  const bf = toBfloat16Bits(values);
  expect(Array.from(bytesToFloat32(bytes(bf), 'bfloat16', 'x'))).toEqual(Array.from(fromBfloat16Bits(bf)));
  const h = toFloat16Bits(values);
  expect(Array.from(bytesToFloat32(bytes(h), 'float16', 'x'))).toEqual(Array.from(fromFloat16Bits(h)));
  // an unaligned view (safetensors offsets need not be 4-byte aligned) reads the same values
  const shifted = new Uint8Array(values.byteLength + 1);
  shifted.set(bytes(values), 1);
  expect(Array.from(bytesToFloat32(shifted.subarray(1), 'float32', 'x'))).toEqual(Array.from(values));
  expect(() => bytesToFloat32(new Uint8Array(4), 'int32', 'model.safetensors: w')).toThrow(/model\.safetensors: w: dtype int32/);
});

/**
 * Host half-precision conversion throughput: float32 → float16 / bfloat16 bits and back, MB/s of
 * float32 data (median of 7 passes over 64 MB of values spanning normal, subnormal and large
 * magnitudes).  usage: npx tsx --conditions=lathe-source tools/bench/runtime/half.ts
 */
import { fromBfloat16Bits, fromFloat16Bits, toBfloat16Bits, toFloat16Bits } from '@lathe/runtime';

const n = 16 * 1024 * 1024;
const src = new Float32Array(n);
let s = 1;
for (let i = 0; i < n; i++) {
  s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
  src[i] = ((s / 2 ** 32) * 2 - 1) * 2 ** ((i % 40) - 20);
}
const bits = new Uint16Array(n);
const back = new Float32Array(n);
const cases: [string, () => void][] = [
  ['float32 → float16', () => toFloat16Bits(src, bits)],
  ['float16 → float32', () => fromFloat16Bits(bits, back)],
  ['float32 → bfloat16', () => toBfloat16Bits(src, bits)],
  ['bfloat16 → float32', () => fromBfloat16Bits(bits, back)],
];
const rows: Record<string, number> = {};
for (const [name, f] of cases) {
  const times: number[] = [];
  for (let r = 0; r < 7; r++) {
    const t0 = performance.now();
    f();
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  rows[name] = Math.round((n * 4) / 1e6 / (times[3] / 1000));
}
console.log(JSON.stringify({ mb_per_s_of_float32: rows, node: process.version }));

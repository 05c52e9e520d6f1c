/**
 * Gradients reduced in bfloat16 (`gradReduceDtype: 'bfloat16'`, --grad_reduce_dtype) on the CPU
 * over the in-process group. The reference is computed here, independently of the runtime's
 * conversions: bfloat16 rounding as round-to-nearest-even to 8 significant bits in float64. NCCL
 * adds two bfloat16 values and stores a bfloat16 at each step (NVIDIA/nccl#1026), so over 2 ranks
 * the sum is bf16(bf16(g0) + bf16(g1)) exactly; the host backends do that in rank order.
 */
import { Device, toBfloat16Bits, type DeviceTensor, type HostTensor } from '@lathe/runtime';
import { Trainer } from '@lathe/train';
import { gradientAllReduce, LocalGroup } from '@lathe/distributed';
import { rankBatches, sftRows, tinySftSpec } from './tiny-sft';

/** Round-to-nearest-even to bfloat16's 8 significant bits (normal range; 0 stays 0). */
function bf16(x: number): number {
  if (x === 0 || !Number.isFinite(x)) return x;
  const e = Math.floor(Math.log2(Math.abs(x)));
  const ulp = 2 ** (e - 7);
  const q = x / ulp;
  const f = Math.floor(q);
  const r = q - f;
  const n = r > 0.5 || (r === 0.5 && f % 2 !== 0) ? f + 1 : f;
  return n * ulp;
}

/** Seeded values spread over several binades, some exactly halfway between two bfloat16s. */
function values(seed: number, n: number): Float32Array {
  let s = seed;
  const next = () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32;
  return Float32Array.from({ length: n }, (_, i) => (i % 7 === 0 ? (1 + (2 * Math.floor(next() * 64) + 1) / 256) * 2 ** -3 : (next() - 0.5) * 2 ** Math.floor(next() * 12 - 6)));
}

const cpu = Device.open('cpu');
/** A bfloat16 tensor of values that are already bfloat16 (so the runtime's narrowing is exact). */
const bf16Tensor = (v: ArrayLike<number>): DeviceTensor => cpu.upload({ data: toBfloat16Bits(Float32Array.from(v)), dims: [v.length] }, 'bfloat16');
const floats = (t: DeviceTensor): Float32Array => {
  const u = t.download().data as Uint16Array;
  return Float32Array.from(u, (b) => new Float32Array(new Uint32Array([b << 16]).buffer)[0]);
};

test('a bfloat16 all-reduce and reduce-scatter over 2 ranks give bf16(a + b) of the bfloat16 inputs, exactly; over 3, each partial sum rounded', async () => {
  for (const world of [2, 3]) {
    const n = 96;
    const inputs = Array.from({ length: world }, (_, r) => Array.from(values(11 + r, n), bf16));
    const expected = inputs[0].map((_, i) => inputs.reduce((acc, v, r) => (r === 0 ? v[i] : bf16(acc + v[i])), 0));
    // the reference rounds: it differs from the exact sum on some elements, and the test can tell
    expect(expected.some((x, i) => x !== inputs.reduce((s, v) => s + v[i], 0))).toBe(true);
    const group = LocalGroup.create(world);
    const tensors = inputs.map((v) => [bf16Tensor(v.slice(0, 40)), bf16Tensor(v.slice(40))]);
    await Promise.all(group.map((c, r) => c.allReduce(tensors[r], 'sum')));
    for (const [a, b] of tensors) expect([...floats(a), ...floats(b)]).toEqual(expected);
    const ins = inputs.map(bf16Tensor);
    const outs = group.map(() => cpu.empty('bfloat16', [n / world]));
    await Promise.all(group.map((c, r) => c.reduceScatter(ins[r], outs[r], 'sum')));
    outs.forEach((o, r) => expect([...floats(o)]).toEqual(expected.slice((r * n) / world, ((r + 1) * n) / world)));
    for (const t of [...tensors.flat(), ...ins, ...outs]) t.dispose();
  }
});

test('the host backends refuse a bfloat16 average and a bucket of mixed dtypes, naming them', async () => {
  const [c] = LocalGroup.create(1);
  const [a, b, f] = [bf16Tensor([1, 2]), bf16Tensor([1]), cpu.zeros('float32', [1])];
  await expect(c.allReduce([a], 'avg')).rejects.toThrow(/bfloat16 tensors with 'sum' only/);
  await expect(c.allReduce([b, f])).rejects.toThrow(/not a mix/);
  for (const t of [a, b, f]) t.dispose();
});

const { weights, spec } = tinySftSpec({ seed: 9, layers: 1, maxGradNorm: 0 });
/** Step `step`'s global batch of 12 rows: rank `rank`'s share as `micro` micro-batches, normalised by the whole batch's loss tokens. */
const batchFor = (step: number, rank: number, world: number, micro = 1) => rankBatches(sftRows(500 + step, 12, { maxLength: 10, prompt: 2 }), rank, world, micro);

/** Host copies of a hook's gradient tensors, concatenated by parameter order (bfloat16 widened). */
const hostOf = (grads: Map<string, DeviceTensor>): number[] => [...grads.values()].flatMap((t) => [...(t.dtype === 'bfloat16' ? floats(t) : (t.download().data as Float32Array))]);

test("data-parallel training with gradReduceDtype 'bfloat16': each rank sends its gradient rounded to bfloat16, the update reads bf16(g0 + g1) widened, within bfloat16 rounding of the float32 reduction", async () => {
  const run = async (dtype: 'float32' | 'bfloat16') => {
    const group = LocalGroup.create(2);
    const seen = group.map(() => ({ before: [] as number[], after: [] as number[], dtypes: new Set<string>() }));
    const trainers = group.map((c, r) => {
      const reduce = gradientAllReduce(c);
      return Trainer.create(spec, { params: weights }, {
        gradReduceDtype: dtype,
        onGradients: async (grads, sums) => {
          seen[r].before = hostOf(grads);
          for (const t of grads.values()) seen[r].dtypes.add(t.dtype);
          await reduce(grads, sums);
          seen[r].after = hostOf(grads);
        },
      });
    });
    const results = await Promise.all(trainers.map((t, r) => t.trainStepAsync(batchFor(0, r, 2), 0.01)));
    const state = trainers[0].snapshot();
    for (const t of trainers) t.dispose();
    return { seen, results, state };
  };
  const f32 = await run('float32');
  const low = await run('bfloat16');
  expect([...f32.seen[0].dtypes]).toEqual(['float32']);
  expect([...low.seen[0].dtypes]).toEqual(['bfloat16']);
  for (let r = 0; r < 2; r++) expect(low.seen[r].before).toEqual(f32.seen[r].before.map(bf16));
  const [g0, g1] = [f32.seen[0].before, f32.seen[1].before];
  const expected = g0.map((x, i) => bf16(bf16(x) + bf16(g1[i])));
  expect(low.seen[0].after).toEqual(expected);
  expect(low.seen[1].after).toEqual(expected);
  // within bfloat16 rounding of the float32 sum: two input roundings and one of the sum, each within 2^-8 relative
  let rounded = 0;
  f32.seen[0].after.forEach((s, i) => {
    expect(Math.abs(expected[i] - s)).toBeLessThanOrEqual(2 ** -8 * (Math.abs(g0[i]) + Math.abs(g1[i]) + Math.abs(s)) * 1.01);
    if (expected[i] !== s) rounded++;
  });
  expect(rounded).toBeGreaterThan(g0.length / 2);
  // the update read the widened sum: its norm is that of `expected` (in float32), not of the float32 sum
  const norm = Math.sqrt(expected.reduce((a, x) => a + x * x, 0));
  expect(Math.abs(low.results[0].gradNorm - norm) / norm).toBeLessThan(1e-6);
  expect(low.results[0].gradNorm).not.toBe(f32.results[0].gradNorm);
  expect(low.results[0].loss).toBe(f32.results[0].loss);
  expect(low.results[1].gradNorm).toBe(low.results[0].gradNorm);
});

test("gradReduceDtype 'bfloat16' without a data-parallel reduction, or an unknown dtype, is refused", () => {
  expect(() => Trainer.create(spec, { params: weights }, { gradReduceDtype: 'bfloat16' })).toThrow(/give onGradients or zero/);
  expect(() => Trainer.create(spec, { params: weights }, { gradReduceDtype: 'float16' as 'float32', onGradients: async () => undefined })).toThrow(/'float32' or 'bfloat16'/);
});

/** One micro-batch's float32 gradient at the initial weights, by parameter order (a world-1 hook reads it). */
async function gradientOf(batch: Record<string, HostTensor>): Promise<number[]> {
  let out: number[] = [];
  const t = Trainer.create(spec, { params: weights }, { onGradients: async (grads) => void (out = hostOf(grads)) });
  await t.trainStepAsync([batch], 0.01);
  t.dispose();
  return out;
}

test.each([
  [2, 2],
  [3, 1],
])("ZeRO over %i ranks, %i micro-batches, gradReduceDtype 'bfloat16': the shards the update reads are the sum over micro-batches of each one's bfloat16 reduction", async (world, micro) => {
  // the reference: every rank's float32 gradient of every micro-batch, rounded and summed as NCCL does (rank order), widened and added in float32
  const summed: number[] = [];
  for (let k = 0; k < micro; k++) {
    const g = await Promise.all(Array.from({ length: world }, (_, r) => gradientOf(batchFor(0, r, world, micro)[k])));
    g[0].forEach((_, i) => {
      const reduced = g.reduce((acc, v, r) => (r === 0 ? bf16(v[i]) : bf16(acc + bf16(v[i]))), 0);
      summed[i] = k === 0 ? reduced : Math.fround(summed[i] + reduced);
    });
  }
  const norm = Math.sqrt(summed.reduce((a, x) => a + x * x, 0));
  const run = async (dtype: 'float32' | 'bfloat16') => {
    const group = LocalGroup.create(world);
    const trainers = group.map((c) => Trainer.create(spec, { params: weights }, { zero: c, gradReduceDtype: dtype, microBatches: micro }));
    const results = await Promise.all(trainers.map((t, r) => t.trainStepAsync(batchFor(0, r, world, micro), 0.01)));
    const state = await Promise.all(trainers.map((t) => t.snapshotAsync()));
    for (const t of trainers) t.dispose();
    return { results, state: state[0] };
  };
  const low = await run('bfloat16');
  const f32 = await run('float32');
  for (const r of low.results) {
    expect(Math.abs(r.gradNorm - norm) / norm).toBeLessThan(1e-6);
    expect(r.loss).toBe(f32.results[0].loss);
  }
  // the float32 reduction's norm differs, by about bfloat16's rounding
  const rel = Math.abs(low.results[0].gradNorm - f32.results[0].gradNorm) / f32.results[0].gradNorm;
  expect(rel).toBeGreaterThan(0);
  expect(rel).toBeLessThan(2 ** -7);
  // Adam's first step is lr · g/|g| per element: the weights agree except where a gradient's sign or size near zero changed
  let moved = 0;
  for (const [name, v] of f32.state.params) {
    const w = low.state.params.get(name)!;
    v.forEach((x, i) => (moved = Math.max(moved, Math.abs(x - w[i]))));
  }
  expect(moved).toBeLessThanOrEqual(2 * 0.01 + 1e-6);
});

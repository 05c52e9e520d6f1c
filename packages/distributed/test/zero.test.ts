/**
 * ZeRO-1 on the CPU over the in-process group: N ranks, each keeping 1/N of the AdamW moments and
 * master weights, take the steps of one unsharded process on the whole batch (the SFT loss of a
 * tiny decoder whose norm and head sizes do not divide by 3, so the padded path runs), keep 1/N
 * of the moment bytes, and resume from a state gathered on 2 ranks on 3 ranks.
 */
import * as L from '@lathe/onnx';
import { shardLayout, Trainer, type OptimizerState, type TrainStepResult } from '@lathe/train';
import { gradientAllReduce, LocalGroup } from '@lathe/distributed';
import { rankBatches, relClose, sftRows, stepLr as lr, STEPS_TOL, tinySftSpec } from './tiny-sft';

const { weights, params, spec } = tinySftSpec({ seed: 5 });
/** Rank `rank`'s share of step `step`'s global batch (rows of varying length), as `micro` micro-batches. */
const batchFor = (step: number, rank: number, world: number, micro = 1, rowsPerStep = BATCH) => rankBatches(sftRows(77 + step, rowsPerStep), rank, world, micro);

const STEPS = 5;
/** Bytes of the float32 parameters: unsharded data parallelism keeps 2 sets of (weights, m, v) and 2 gradient buffers, 8 × P. */
const P = params.reduce((s, p) => s + 4 * p.shape.reduce((a, b) => a * b, 1), 0);
const BATCH = 6;

const reference = (() => {
  const trainer = Trainer.create(spec, { params: weights });
  const results: TrainStepResult[] = [];
  for (let step = 0; step < STEPS; step++) results.push(trainer.trainStep(batchFor(step, 0, 1), lr(step)));
  const out = { results, final: trainer.snapshot(), momentBytes: trainer.momentBytes };
  trainer.dispose();
  return out;
})();

/** ZeRO-1 over `world` in-process ranks from `init`, steps [from, to); every rank's results and its gathered state. */
async function zero(world: number, init: { params: Map<string, Float32Array>; m?: Map<string, Float32Array>; v?: Map<string, Float32Array>; step?: number }, from: number, to: number, fusedAdamW = false, micro = 1, rowsPerStep = BATCH) {
  const group = LocalGroup.create(world);
  const trainers = group.map((c) => Trainer.create(spec, init, { zero: c, fusedAdamW, microBatches: micro }));
  const results: TrainStepResult[][] = group.map(() => []);
  for (let step = from; step < to; step++) {
    const out = await Promise.all(trainers.map((t, r) => t.trainStepAsync(batchFor(step, r, world, micro, rowsPerStep), lr(step))));
    out.forEach((o, r) => results[r].push(o));
  }
  const states = await Promise.all(trainers.map((t) => t.snapshotAsync()));
  const momentBytes = trainers.map((t) => t.momentBytes);
  const stateBytes = trainers.map((t) => t.stateBytes);
  for (const t of trainers) t.dispose();
  return { results, states, momentBytes, stateBytes };
}

/** The largest absolute difference between two states' parameters and moments. */
function worst(a: OptimizerState, b: OptimizerState): { params: number; m: number; v: number } {
  const diff = (x: Map<string, Float32Array>, y: Map<string, Float32Array>) => {
    let w = 0;
    for (const [name, v] of y) {
      const mine = x.get(name)!;
      expect(mine.length).toBe(v.length);
      for (let i = 0; i < v.length; i++) w = Math.max(w, Math.abs(mine[i] - v[i]));
    }
    return w;
  };
  return { params: diff(a.params, b.params), m: diff(a.m, b.m), v: diff(a.v, b.v) };
}

test.each([2, 3])('ZeRO-1 over %i ranks takes the steps of one unsharded process (5 steps: loss and grad norm within 1e-5, weights and moments within the rounding of the sums order) with 1/N of the moment bytes', async (world) => {
  expect(shardLayout(params, world).some((s) => s.padded)).toBe(world === 3);
  const { results, states, momentBytes } = await zero(world, { params: weights }, 0, STEPS);
  for (let r = 0; r < world; r++) {
    results[r].forEach((res, step) => {
      relClose(res.loss, reference.results[step].loss);
      relClose(res.gradNorm, reference.results[step].gradNorm);
      expect(res.loss).toBe(results[0][step].loss);
    });
    const w = worst(states[r], reference.final);
    expect(w.params).toBeLessThanOrEqual(STEPS_TOL);
    expect(w.m).toBeLessThanOrEqual(STEPS_TOL);
    expect(w.v).toBeLessThanOrEqual(STEPS_TOL);
    expect(states[r].step).toBe(STEPS);
    // each rank's moments: Σ ⌈size/N⌉ of the Σ size one process keeps (padding only above 1/N)
    const ideal = reference.momentBytes / world;
    expect(momentBytes[r]).toBeGreaterThanOrEqual(ideal);
    expect(momentBytes[r]).toBeLessThanOrEqual(ideal + 2 * 2 * 4 * params.length);
  }
  // clipping was active (max norm 1) and the weights moved far beyond the tolerance
  expect(reference.results[0].gradNorm).toBeGreaterThan(1);
  expect(worst(states[0], { params: weights, m: reference.final.m, v: reference.final.v }).params).toBeGreaterThan(1e-2);
  process.stdout.write(`ZeRO-1 over ${world}: moment bytes per rank ${momentBytes.join(', ')} vs ${reference.momentBytes} unsharded\n`);
});

test('micro-batches: each one reduce-scattered and summed on the shards, as unsharded data parallelism sums them (within the rounding of the sums order); the state a rank holds is below its', async () => {
  const { results, states, stateBytes } = await zero(2, { params: weights }, 0, 3, false, 3);
  results[0].forEach((res, step) => relClose(res.loss, reference.results[step].loss));
  const group = LocalGroup.create(2);
  const dps = group.map((c) => Trainer.create(spec, { params: weights }, { microBatches: 3, onGradients: gradientAllReduce(c) }));
  for (let step = 0; step < 3; step++) await Promise.all(dps.map((t, r) => t.trainStepAsync(batchFor(step, r, 2, 3), lr(step))));
  expect(worst(states[1], dps[1].snapshot()).params).toBeLessThanOrEqual(STEPS_TOL);
  // against one process on whole batches, both carry the micro-batch sums' rounding
  const ref = Trainer.create(spec, { params: weights });
  for (let step = 0; step < 3; step++) ref.trainStep(batchFor(step, 0, 1), lr(step));
  expect(worst(states[1], ref.snapshot()).params).toBeLessThanOrEqual(STEPS_TOL);
  ref.dispose();
  expect(dps[0].stateBytes).toBe(8 * P);
  for (const t of dps) t.dispose();
  // ZeRO-1 over 2: weights and one gradient buffer (2P), 6 shard sets and 3 gradient-shard buffers of P/2, padding none
  expect(stateBytes[0]).toBe(2 * P + (9 * P) / 2);
  process.stdout.write(`state bytes per rank: ZeRO-1 over 2 with 3 micro-batches ${stateBytes[0]}, unsharded data parallelism ${8 * P}\n`);
});

test.each([2, 4])('ZeRO-2 (gradients reduce-scattered into shard sums each micro-batch) with %i micro-batches a rank: 3 steps equal to one process over the same micro-batches (losses within 1e-6, weights within the rounding of the sums order), and the state resumes on 4 ranks on its trajectory', async (k) => {
  const rowsPerStep = 4 * k;
  const sharded = await zero(2, { params: weights }, 0, 3, false, k, rowsPerStep);
  // one process over the same 2k micro-batches: rank r's micro-batch j is its (r·k + j)-th
  const single = Trainer.create(spec, { params: weights }, { microBatches: 2 * k });
  const singleResults: TrainStepResult[] = [];
  for (let step = 0; step < 4; step++) singleResults.push(single.trainStep(batchFor(step, 0, 1, 2 * k, rowsPerStep), lr(step)));
  const afterFour = single.snapshot();
  single.dispose();
  const three = Trainer.create(spec, { params: weights }, { microBatches: 2 * k });
  for (let step = 0; step < 3; step++) three.trainStep(batchFor(step, 0, 1, 2 * k, rowsPerStep), lr(step));
  const afterThree = three.snapshot();
  three.dispose();
  for (let r = 0; r < 2; r++) {
    sharded.results[r].forEach((res, step) => {
      relClose(res.loss, singleResults[step].loss, 1e-6);
      relClose(res.gradNorm, singleResults[step].gradNorm, 1e-6);
    });
    const w = worst(sharded.states[r], afterThree);
    expect(w.params).toBeLessThanOrEqual(STEPS_TOL);
    expect(w.m).toBeLessThanOrEqual(STEPS_TOL);
    expect(w.v).toBeLessThanOrEqual(STEPS_TOL);
  }
  // whatever k, one full-size gradient buffer (a micro-batch's) beside the weights, and shard-sized sums
  expect(sharded.stateBytes[0]).toBe(2 * P + (9 * P) / 2);
  // the gathered state resumes on 4 ranks (one micro-batch each) for the 4th step, on the one-process trajectory
  const saved = sharded.states[0];
  const resumed = await zero(4, { params: saved.params, m: saved.m, v: saved.v, step: saved.step }, 3, 4, false, 1, rowsPerStep);
  relClose(resumed.results[0][0].loss, singleResults[3].loss, 1e-6);
  expect(worst(resumed.states[0], afterFour).params).toBeLessThanOrEqual(STEPS_TOL);
  expect(resumed.states[0].step).toBe(4);
});

test('a state gathered from 2 ZeRO ranks resumes on 3 (the moments resharded) and on 1 unsharded process, on the reference trajectory', async () => {
  const first = await zero(2, { params: weights }, 0, 3);
  const saved = first.states[0];
  const resumed = await zero(3, { params: saved.params, m: saved.m, v: saved.v, step: saved.step }, 3, STEPS);
  const w = worst(resumed.states[0], reference.final);
  expect(w.params).toBeLessThanOrEqual(STEPS_TOL);
  expect(w.m).toBeLessThanOrEqual(STEPS_TOL);
  resumed.results[0].forEach((res, k) => relClose(res.loss, reference.results[3 + k].loss));
  const single = Trainer.create(spec, { params: saved.params, m: saved.m, v: saved.v, step: saved.step });
  for (let step = 3; step < STEPS; step++) single.trainStep(batchFor(step, 0, 1), lr(step));
  expect(worst(single.snapshot(), reference.final).params).toBeLessThanOrEqual(STEPS_TOL);
  single.dispose();
});

test('the fused AdamW node updates a shard (the CPU reference of the kernel) on the reference trajectory', async () => {
  const { states } = await zero(3, { params: weights }, 0, 2, true);
  const ref = Trainer.create(spec, { params: weights });
  for (let step = 0; step < 2; step++) ref.trainStep(batchFor(step, 0, 1), lr(step));
  expect(worst(states[1], ref.snapshot()).params).toBeLessThanOrEqual(1e-6);
  ref.dispose();
});

test('with bfloat16-widened gradients the ZeRO step graph keeps the composed update float32 (halfGradients is the fused step node\'s only)', async () => {
  // w is read through bfloat16, so its gradient is a bfloat16 value widened by a Cast
  const half = {
    params: [{ name: 'w', shape: [5, 3], decay: true }],
    loss: (g: L.Graph, ps: Map<string, L.Tensor>) => {
      const x = g.input('x', 'float32', ['R', 5]);
      const y = L.matmul(x, L.cast(L.cast(ps.get('w')!, 'bfloat16'), 'float32'));
      return { loss: L.reduceSum(L.mul(y, y), [0, 1], false) };
    },
  };
  const w = Float32Array.from({ length: 15 }, (_, i) => Math.sin(i + 1));
  const batch = (r: number) => [{ x: { data: Float32Array.from({ length: 10 }, (_, i) => Math.cos(i + 7 * r)), dims: [2, 5] } }];
  const group = LocalGroup.create(2);
  const trainers = group.map((c) => Trainer.create(half, { params: new Map([['w', w]]) }, { zero: c, fusedAdamW: true }));
  await Promise.all(trainers.map((t, r) => t.trainStepAsync(batch(r), 0.01)));
  const sharded = (await Promise.all(trainers.map((t) => t.snapshotAsync())))[0].params.get('w')!;
  for (const t of trainers) t.dispose();
  const one = Trainer.create(half, { params: new Map([['w', w]]) }, { fusedAdamW: true });
  one.trainStep([{ x: { data: Float32Array.from([...batch(0)[0].x.data, ...batch(1)[0].x.data]), dims: [4, 5] } }], 0.01);
  const whole = one.snapshot().params.get('w')!;
  one.dispose();
  sharded.forEach((v, i) => expect(Math.abs(v - whole[i])).toBeLessThanOrEqual(1e-6));
  expect(sharded.some((v, i) => v !== w[i])).toBe(true);
});

test('a ZeRO trainer refuses the synchronous step and snapshot, and an onGradients hook beside it', () => {
  const [c] = LocalGroup.create(1);
  const t = Trainer.create(spec, { params: weights }, { zero: c });
  expect(() => t.trainStep(batchFor(0, 0, 1), 0.01)).toThrow(/ZeRO-1.*trainStepAsync/);
  expect(() => t.snapshot()).toThrow(/snapshotAsync/);
  t.dispose();
  expect(() => Trainer.create(spec, { params: weights }, { zero: c, onGradients: async () => undefined })).toThrow(/instead of onGradients/);
});

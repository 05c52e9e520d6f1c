/**
 * The update in the all-reduce's run (`TrainerOptions.inGraphUpdate`), on the CPU: ranks as worker
 * threads whose bucket nodes sum in place through shared memory (`ThreadGroup`) and whose join
 * orders the update after them, one run a step. Its steps are the split path's (accumulate run with
 * the in-place bucket nodes, `finish`, apply run) bit for bit — the same rank-order float32 sums go
 * into the same update ops — and one process's on the whole batch within float32 rounding; a
 * non-finite loss on one rank leaves every rank where it was; the bucket nodes still run while
 * backward work remains; alone (`soloInRunReducer`: nothing to sum) it is the
 * split path's step; a failing bucket node stops the step with the parameters as they were; the
 * option refuses what it does not cover, by name.
 */
import * as L from '@lathe/onnx';
import { Device, type DeviceTensor } from '@lathe/runtime';
import { Trainer, type TrainStepResult } from '@lathe/train';
import { gradientAllReduceInGraph, gradientReduceScatterInGraph, LocalGroup, soloInRunReducer, ThreadGroup } from '@lathe/distributed';
import type { RankJob, RankResult } from './overlap-rank';
import { rankThreads } from './rank-threads';
import { OVERLAP_BATCH as BATCH, OVERLAP_BUCKET_BYTES as BUCKET_BYTES, stepLr as lr, stepRows as rows, rankBatches, sftRows, STEPS_TOL, tinySftSpec } from './tiny-sft';

const STEPS = 4;
const { weights, spec } = tinySftSpec({ seed: 3 });

/** `world` ranks as worker threads (overlap-rank.ts through tsx), one micro-batch, float32 sums in the run. */
function threads(world: number, opts: Pick<RankJob, 'inGraphUpdate' | 'fusedAdamW' | 'nonFinite'> & Partial<Pick<RankJob, 'gradReduceDtype'>>): Promise<RankResult[]> {
  return rankThreads(world, { steps: STEPS, batch: BATCH, micro: 1, gradReduceDtype: 'float32', zero: false, bucketBytes: BUCKET_BYTES, ...opts });
}

/** One process on the whole batch, the plain one-run step. */
async function singleProcess(): Promise<{ results: TrainStepResult[]; final: Map<string, Float32Array> }> {
  const trainer = Trainer.create(spec, { params: weights });
  const results: TrainStepResult[] = [];
  for (let step = 0; step < STEPS; step++) results.push(await trainer.trainStepAsync(rankBatches(rows(step, BATCH), 0, 1, 1), lr(step)));
  const final = trainer.downloadParams();
  trainer.dispose();
  return { results, final };
}

const rel = (a: number, b: number) => Math.abs(a - b) / Math.max(Math.abs(b), 1e-12);
const sameBits = (a: Float32Array, b: Float32Array) => a.length === b.length && a.every((x, i) => Object.is(x, b[i]));

let reference: Awaited<ReturnType<typeof singleProcess>>;
beforeAll(async () => {
  reference = await singleProcess();
});

test.each<[number, boolean]>([
  [2, false],
  [3, false],
  [2, true], // the fused AdamW node (its host compute on the CPU) with the join as its extra input
])('%i ranks (fusedAdamW: %s): the update in the all-reduce\'s run takes the split path\'s steps bit for bit, one process\'s within float32 rounding, and keeps the buckets\' overlap', async (world, fusedAdamW) => {
  const fused = await threads(world, { inGraphUpdate: true, fusedAdamW });
  const split = await threads(world, { inGraphUpdate: false, fusedAdamW });
  for (const [r, res] of fused.entries()) {
    for (let step = 0; step < STEPS; step++) {
      // bitwise: the same rank-order float32 sums reach the same update ops (the join's where(t, g, g) copies g exactly)
      expect({ rank: r, step, loss: res.losses[step], gradNorm: res.gradNorms[step] }).toEqual({ rank: r, step, loss: split[r].losses[step], gradNorm: split[r].gradNorms[step] });
      // one process: the loss and norm of the whole batch, within float32 rounding of the sums' order
      expect(rel(res.losses[step], reference.results[step].loss)).toBeLessThanOrEqual(1e-6);
      expect(rel(res.gradNorms[step], reference.results[step].gradNorm)).toBeLessThanOrEqual(1e-6);
      // every bucket's node ran once a step, in the backward's order
      expect(res.order[step]).toEqual(split[r].order[step]);
    }
    let worst = 0;
    for (const [name, v] of reference.final) {
      const mine = res.finals[name];
      expect({ name, rank: r, same: sameBits(mine, split[r].finals[name]) }).toEqual({ name, rank: r, same: true });
      for (let i = 0; i < v.length; i++) worst = Math.max(worst, Math.abs(mine[i] - v[i]));
    }
    // absolutely, as overlap.test's check of the split path against one process
    expect(worst).toBeLessThanOrEqual(STEPS_TOL);
  }
  // the trajectory moved, through several buckets
  expect(reference.results[STEPS - 1].loss).toBeLessThan(reference.results[0].loss);
  const buckets = fused[0].order[0].length;
  expect(buckets).toBeGreaterThan(3);

  // ORT's order in the one run: each bucket's node while backward nodes remain, bucket 0 before most of
  // them; the join after every bucket, and the update's readers of the sums after the join
  const profile = fused[0].profile!;
  const at = (op: string) => profile.findIndex((n) => n.op === op);
  const positions = Array.from({ length: buckets }, (_, k) => at(`GradAllReduce_${k}`));
  const backward = profile.map((n, i) => (n.name.startsWith('grad/') ? i : -1)).filter((i) => i >= 0);
  expect(positions.every((p, k) => p >= 0 && (k === 0 || p > positions[k - 1]))).toBe(true);
  for (let k = 0; k < buckets - 1; k++) expect(backward.filter((i) => i > positions[k]).length).toBeGreaterThan(0);
  expect(backward.filter((i) => i > positions[0]).length / backward.length).toBeGreaterThan(0.5);
  const joinAt = at('GradAllReduceJoin');
  expect(joinAt).toBeGreaterThan(positions[buckets - 1]);
  const update = fusedAdamW ? [at('FusedAdamWAfter')] : profile.map((n, i) => (n.op === 'Where' && n.name.startsWith('optimizer/') ? i : -1)).filter((i) => i >= 0);
  expect(update.length).toBeGreaterThan(0);
  expect(update.every((i) => i > joinAt)).toBe(true);
}, 180_000);

test('bfloat16 sums with the fused node: the update in the run reads the bfloat16 sums and takes the split path\'s steps bit for bit (there they are widened after the run)', async () => {
  const inRun = await threads(2, { inGraphUpdate: true, fusedAdamW: true, gradReduceDtype: 'bfloat16' });
  const split = await threads(2, { inGraphUpdate: false, fusedAdamW: true, gradReduceDtype: 'bfloat16' });
  const float32 = await threads(2, { inGraphUpdate: true, fusedAdamW: true });
  for (const [r, res] of inRun.entries()) {
    for (let step = 0; step < STEPS; step++) {
      // the same bfloat16 sums (cast in the run, summed as NCCL sums them), widened exactly by the node or by the cast after the split path's run
      expect({ rank: r, step, loss: res.losses[step], gradNorm: res.gradNorms[step] }).toEqual({ rank: r, step, loss: split[r].losses[step], gradNorm: split[r].gradNorms[step] });
      // and within bfloat16 rounding of the float32 sums' norm
      expect(rel(res.gradNorms[step], float32[r].gradNorms[step])).toBeLessThan(2 ** -7);
    }
    for (const [name, v] of Object.entries(res.finals)) expect({ name, rank: r, same: sameBits(v, split[r].finals[name]) }).toEqual({ name, rank: r, same: true });
  }
  // the node read bfloat16 gradients, after the join
  const profile = inRun[0].profile!;
  const update = profile.findIndex((n) => n.op.startsWith('FusedAdamWAfter_'));
  expect(update).toBeGreaterThan(profile.findIndex((n) => n.op === 'GradAllReduceJoin'));
  // and the bfloat16 sums moved the weights off the float32 path's
  expect(Object.entries(inRun[0].finals).some(([n, v]) => !sameBits(v, float32[0].finals[n]))).toBe(true);
}, 180_000);

test('bfloat16 sums in the run take a gradient the backward made in bfloat16 as it is (no cast around it), and train as the split path does', async () => {
  const device = Device.cpu();
  // w is read through bfloat16 (widened again, so the CPU provider computes in float32): its gradient is a bfloat16 value a Cast widens
  const half = {
    params: [{ name: 'w', shape: [6, 4], decay: true }, { name: 'b', shape: [4], decay: false }],
    loss: (g: L.Graph, ps: Map<string, L.Tensor>) => {
      const x = g.input('x', 'float32', ['R', 6]);
      const y = g.input('y', 'float32', ['R', 4]);
      const err = L.sub(L.add(L.matmul(x, L.cast(L.cast(ps.get('w')!, 'bfloat16'), 'float32')), ps.get('b')!), y);
      return { loss: L.div(L.reduceSum(L.mul(err, err), [0, 1], false), 8) };
    },
  };
  const init = new Map([['w', Float32Array.from({ length: 24 }, (_, i) => Math.sin(i + 1))], ['b', Float32Array.from({ length: 4 }, (_, i) => Math.cos(i))]]);
  const batch = [{ x: { data: Float32Array.from({ length: 48 }, (_, i) => Math.sin(3 * i)), dims: [8, 6] }, y: { data: Float32Array.from({ length: 32 }, (_, i) => Math.cos(5 * i)), dims: [8, 4] } }];
  const train = async (inGraphUpdate: boolean) => {
    const hook = gradientAllReduceInGraph(ThreadGroup.join(ThreadGroup.create(1), 0), device, { bucketBytes: BUCKET_BYTES });
    const t = Trainer.create(half, { params: init }, { device, fusedAdamW: true, gradReduceDtype: 'bfloat16', inGraphGradients: hook, ...(inGraphUpdate ? { inGraphUpdate: true } : {}) });
    if (inGraphUpdate) {
      const bound = (p: string) => t.graphs.step.outputs.find((o) => o.name === `next/grad/${p}`)!;
      // w's: the bfloat16 tensor the widening Cast reads; b's: a cast of its float32 gradient
      expect(t.graphs.step.nodes.some((n) => n.op.name === 'Cast' && n.inputs[0] === bound('w') && n.outputs[0].dtype === 'float32')).toBe(true);
      expect([bound('w').dtype, bound('b').dtype, bound('b').node?.op.name, bound('b').node?.inputs[0]?.dtype]).toEqual(['bfloat16', 'bfloat16', 'Cast', 'float32']);
    }
    for (let step = 0; step < 3; step++) await t.trainStepAsync(batch, 0.05);
    const out = t.downloadParams();
    t.dispose();
    return out;
  };
  const [inRun, split] = [await train(true), await train(false)];
  for (const [n, v] of split) expect({ n, same: sameBits(inRun.get(n)!, v) }).toEqual({ n, same: true });
  expect(sameBits(inRun.get('w')!, init.get('w')!)).toBe(false);
});

test('a non-finite loss on one rank leaves every rank\'s parameters and step count as they were; the steps after it are the split path\'s', async () => {
  const nonFinite = { step: 1, rank: 1 };
  const fused = await threads(2, { inGraphUpdate: true, nonFinite });
  const split = await threads(2, { inGraphUpdate: false, nonFinite });
  for (const [r, res] of fused.entries()) {
    // the loss is summed over the ranks before the trainer decides: every rank skips
    expect(Number.isFinite(res.losses[nonFinite.step])).toBe(false);
    expect(res.nonFiniteKept).toBe(true);
    expect(split[r].nonFiniteKept).toBe(true);
    expect(res.losses.filter((_, s) => s !== nonFinite.step).every(Number.isFinite)).toBe(true);
    for (const [name, v] of Object.entries(split[r].finals)) expect({ name, rank: r, same: sameBits(res.finals[name], v) }).toEqual({ name, rank: r, same: true });
  }
}, 120_000);

test('alone (soloInRunReducer: nothing to sum), the one-run step with the nodes is the split path\'s bit for bit and the plain step\'s within float32 rounding', async () => {
  const device = Device.cpu();
  const computed: number[] = [];
  const solo = (onCompute?: (k: number) => void) => gradientAllReduceInGraph(soloInRunReducer(), device, { bucketBytes: BUCKET_BYTES, onCompute });
  const withNodes = Trainer.create(spec, { params: weights }, { device, inGraphGradients: solo((k) => computed.push(k)), inGraphUpdate: true });
  const split = Trainer.create(spec, { params: weights }, { device, inGraphGradients: solo() });
  // the plain step graph keeps its gradients inside the run, where ORT may round them otherwise than as outputs (by an ulp here)
  const plain = Trainer.create(spec, { params: weights }, { device });
  for (let step = 0; step < 3; step++) {
    const batch = rankBatches(sftRows(2000 + step, 4), 0, 1);
    const [a, b, c] = [await withNodes.trainStepAsync(batch, lr(step)), await split.trainStepAsync(batch, lr(step)), await plain.trainStepAsync(batch, lr(step))];
    expect([a.loss, a.gradNorm, a.metrics]).toEqual([b.loss, b.gradNorm, b.metrics]);
    expect(rel(a.loss, c.loss)).toBeLessThanOrEqual(1e-6);
    expect(rel(a.gradNorm, c.gradNorm)).toBeLessThanOrEqual(1e-6);
    expect(a.reduceMs).toBeGreaterThanOrEqual(0);
  }
  const [fa, fb, fc] = [withNodes.downloadParams(), split.downloadParams(), plain.downloadParams()];
  let worst = 0;
  for (const [name, v] of fb) {
    expect({ name, same: sameBits(fa.get(name)!, v) }).toEqual({ name, same: true });
    fc.get(name)!.forEach((x, i) => (worst = Math.max(worst, Math.abs(x - v[i]))));
  }
  expect(worst).toBeLessThanOrEqual(STEPS_TOL);
  const buckets = computed.length / 3;
  expect(buckets).toBeGreaterThan(3);
  expect(computed).toEqual([0, 1, 2].flatMap(() => Array.from({ length: buckets }, (_, k) => k)));
  // one run a step, from the step graph (no running-sum input); its gradient buffers are all it keeps beyond the plain trainer's state
  expect(withNodes.batchGraph).toBe(withNodes.graphs.step);
  expect(withNodes.batchGraph.inputs.filter((t) => t.name.startsWith('grad/'))).toEqual([]);
  expect(withNodes.stateBytes - plain.stateBytes).toBe([...fb.values()].reduce((n, v) => n + v.byteLength, 0));
  for (const t of [withNodes, split, plain]) t.dispose();
});

test('a bucket node that fails (its gradient not the bound buffer) stops the one-run step, naming the bucket, and leaves the parameters as they were', async () => {
  const device = Device.cpu();
  const hook = gradientAllReduceInGraph(ThreadGroup.join(ThreadGroup.create(1), 0), device, { bucketBytes: BUCKET_BYTES });
  const elsewhere: DeviceTensor[] = [];
  // the trainer's buffers swapped for others of the same shapes: what an ORT temporary would look like
  const wrong = { ...hook, attach: (b: ReadonlyMap<string, DeviceTensor>) => hook.attach(new Map([...b].map(([n, t]) => [n, (elsewhere.push(device.zeros('float32', t.dims)), elsewhere.at(-1)!)]))) };
  const t = Trainer.create(spec, { params: weights }, { inGraphGradients: wrong, inGraphUpdate: true });
  const before = t.downloadParams();
  // the update ran in the same run on gradients never summed: the other buffer set, which is not adopted
  await expect(t.trainStepAsync(rankBatches(rows(0, 2), 0, 1, 1), 0.01)).rejects.toThrow(/GradAllReduce: bucket 0's gradient 'lm_head.weight' is not the bound output buffer .*cannot be reduced in place/);
  const after = t.downloadParams();
  for (const [name, v] of before) expect({ name, same: sameBits(after.get(name)!, v) }).toEqual({ name, same: true });
  expect(t.step).toBe(0);
  t.dispose();
  for (const x of elsewhere) x.dispose();
});

test('inGraphUpdate refuses what it does not cover, naming the option', () => {
  const device = Device.cpu();
  const hook = () => gradientAllReduceInGraph(ThreadGroup.join(ThreadGroup.create(1), 0), device, { bucketBytes: BUCKET_BYTES });
  const create = (opts: Parameters<typeof Trainer.create>[2]) => () => Trainer.create(spec, { params: weights }, opts);
  expect(create({ inGraphUpdate: true })).toThrow(/inGraphUpdate .*needs inGraphGradients/);
  expect(create({ inGraphUpdate: true, inGraphGradients: hook(), microBatches: 2 })).toThrow(/inGraphUpdate .*needs microBatches = 1 .*got 2/);
  expect(create({ inGraphUpdate: true, inGraphGradients: hook(), microBatches: 0 })).toThrow(/microBatches must be a positive integer, got 0/);
  expect(create({ inGraphUpdate: true, zero: LocalGroup.create(1)[0], inGraphShards: gradientReduceScatterInGraph(ThreadGroup.join(ThreadGroup.create(1), 0), device) })).toThrow(/inGraphUpdate .*does not combine with zero/);
  expect(create({ inGraphUpdate: true, inGraphGradients: hook(), gradReduceDtype: 'bfloat16' })).toThrow(/inGraphUpdate .*reduces float32 gradients, or bfloat16 ones with fusedAdamW .*got gradReduceDtype 'bfloat16' without fusedAdamW/);
  expect(create({ inGraphUpdate: 1 as unknown as boolean, inGraphGradients: hook() })).toThrow(/inGraphUpdate must be true or false, got 1/);
  // a hook without the join (an older or hand-written one)
  const { buildReduced: _, ...inPlaceOnly } = hook();
  expect(create({ inGraphUpdate: true, inGraphGradients: inPlaceOnly })).toThrow(/inGraphUpdate .*needs a hook with buildReduced/);
  // a gradient summed in place that the backward reads again, or that two parameters share, would race with that read
  const passthrough = (shared: boolean) => () =>
    Trainer.create(
      {
        params: [{ name: 'a', shape: [4, 3], decay: false }, { name: 'b', shape: [4, 3], decay: false }, { name: 'u', shape: [4, 2], decay: false }, { name: 'v', shape: [2, 3], decay: false }],
        loss: (g, ps) => {
          const x = g.input('x', 'float32', ['R', 4]);
          // Add hands its output's gradient to both inputs as it is: a's gradient is the one u's and v's are
          // computed from, or (shared) b's as well
          const [a, b, uv] = [ps.get('a')!, ps.get('b')!, L.matmul(ps.get('u')!, ps.get('v')!)];
          const y = shared ? L.add(L.matmul(x, L.add(a, b)), L.matmul(x, uv)) : L.matmul(x, L.add(L.add(a, uv), L.mul(b, 2)));
          return { loss: L.reduceSum(L.mul(y, y), [0, 1], false) };
        },
      },
      { params: new Map([['a', new Float32Array(12).fill(0.1)], ['b', new Float32Array(12).fill(0.1)], ['u', new Float32Array(8).fill(0.2)], ['v', new Float32Array(6).fill(0.3)]]) },
      { inGraphUpdate: true, inGraphGradients: hook() },
    );
  expect(passthrough(false)).toThrow(/inGraphUpdate: the gradient of 'a' is a tensor the backward reads again.*reduce after the backward instead/);
  expect(passthrough(true)).toThrow(/inGraphUpdate: the gradient of 'b' is also the gradient of 'a'/);
  // the synchronous step is refused, as for inGraphGradients alone
  const t = Trainer.create(spec, { params: weights }, { inGraphUpdate: true, inGraphGradients: hook() });
  expect(() => t.trainStep(rankBatches(rows(0, 2), 0, 1, 1), 0.01)).toThrow(/inGraphGradients.*trainStepAsync/);
  t.dispose();
});

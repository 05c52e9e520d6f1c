/**
 * The gradient all-reduce inside the backward's run (`gradientAllReduceInGraph`), on the CPU: ranks
 * as worker threads, whose bucket nodes block inside ONNX Runtime's compute on a shared-memory sum
 * (`ThreadGroup`), take the steps of one process on the whole batch — losses, grad norms, the
 * summed gradients the update reads and the final weights — and their nodes run while the backward
 * still has work left (ORT's profile of the accumulate run).
 */
import type { DeviceTensor } from '@lathe/runtime';
import { Trainer, type GradReduceDtype, type TrainStepResult } from '@lathe/train';
import { gradientAllReduce, gradientAllReduceInGraph, gradientReduceScatterInGraph, LocalGroup, ThreadGroup } from '@lathe/distributed';
import { Device } from '@lathe/runtime';
import type { RankResult } from './overlap-rank';
import { rankThreads } from './rank-threads';
import { OVERLAP_BATCH as BATCH, OVERLAP_BUCKET_BYTES as BUCKET_BYTES, stepLr as lr, stepRows as rows, rankBatches, STEPS_TOL, tinySftSpec } from './tiny-sft';

const STEPS = 3;
const { weights, spec } = tinySftSpec({ seed: 3 });

/** One process on the whole batch, its summed gradients read through an onGradients hook that changes nothing. */
async function singleProcess(): Promise<{ results: TrainStepResult[]; grads: Map<string, Float32Array>[]; final: Map<string, Float32Array> }> {
  const grads: Map<string, Float32Array>[] = [];
  const read = async (g: Map<string, DeviceTensor>) => void grads.push(new Map([...g].map(([n, t]) => [n.replace(/^grad\//, ''), t.download().data as Float32Array])));
  const trainer = Trainer.create(spec, { params: weights }, { onGradients: read });
  const results: TrainStepResult[] = [];
  for (let step = 0; step < STEPS; step++) results.push(await trainer.trainStepAsync(rankBatches(rows(step, BATCH), 0, 1, 1), lr(step)));
  const final = trainer.downloadParams();
  trainer.dispose();
  return { results, grads, final };
}

/** The post-run path (`gradientAllReduce` after the run, in-process ranks): each rank's summed gradients and results. */
async function postRun(world: number, micro: number, gradReduceDtype: GradReduceDtype, zero: boolean): Promise<{ grads: Map<string, Float32Array>[][]; results: TrainStepResult[][]; finals: Map<string, Float32Array>[] }> {
  const group = LocalGroup.create(world);
  const grads: Map<string, Float32Array>[][] = group.map(() => []);
  const trainers = group.map((c, r) => {
    const reduce = gradientAllReduce(c, { bucketBytes: BUCKET_BYTES });
    const hook = async (g: Map<string, DeviceTensor>, sums: Float64Array) => {
      await reduce(g, sums);
      grads[r].push(new Map([...g].map(([n, t]) => [n, t.download().data as Float32Array])));
    };
    return Trainer.create(spec, { params: weights }, zero ? { zero: c, microBatches: micro, gradReduceDtype } : { onGradients: hook, microBatches: micro, gradReduceDtype });
  });
  const results: TrainStepResult[][] = group.map(() => []);
  for (let step = 0; step < STEPS; step++) {
    const out = await Promise.all(trainers.map((t, r) => t.trainStepAsync(rankBatches(rows(step, BATCH), r, world, micro), lr(step))));
    out.forEach((o, r) => results[r].push(o));
  }
  const finals = trainers.map((t) => t.downloadParams());
  for (const t of trainers) t.dispose();
  return { grads, results, finals };
}

/** `world` ranks as worker threads, each with this micro-batch count, reduction dtype and ZeRO choice. */
function threads(world: number, micro: number, gradReduceDtype: GradReduceDtype, zero: boolean): Promise<RankResult[]> {
  return rankThreads(world, { steps: STEPS, batch: BATCH, micro, gradReduceDtype, zero, bucketBytes: gradReduceDtype === 'bfloat16' ? BUCKET_BYTES / 2 : BUCKET_BYTES });
}

/** max |a − b| over max |b|: a gradient's error relative to its scale (elements near zero make per-element ratios meaningless). */
function relError(a: Float32Array, b: Float32Array): number {
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < b.length; i++) {
    diff = Math.max(diff, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(b[i]));
  }
  return diff / Math.max(scale, 1e-30);
}

const rel = (a: number, b: number) => Math.abs(a - b) / Math.max(Math.abs(b), 1e-12);

let reference: Awaited<ReturnType<typeof singleProcess>>;
beforeAll(async () => {
  reference = await singleProcess();
});

test.each<[number, number, GradReduceDtype, boolean]>([
  [2, 1, 'float32', false],
  [3, 2, 'float32', false], // micro-batches: only the last one's run reduces (into the other gradient buffer than with one)
  [2, 1, 'bfloat16', false], // bfloat16 copies reduced in the run, widened after it
  [3, 2, 'float32', true], // ZeRO: every micro-batch's run reduce-scatters (padded shards over 3 ranks, both targets)
  [3, 1, 'bfloat16', true], // ZeRO with bfloat16 copies padded and cast in the run
])('%i ranks × %i micro-batches reducing %s gradients inside the run (ZeRO: %s) take the steps of one process (float32: loss, grad norm and step-0 gradients within 1e-6 relative of one process; gradients and weights bitwise those of the post-run path)', async (world, micro, dtype, zero) => {
  const ranks = await threads(world, micro, dtype, zero);
  const post = await postRun(world, micro, dtype, zero);
  // bfloat16 sums are rounded: one process is matched within bf16 rounding, the post-run path bitwise
  const tol = dtype === 'float32' ? 1e-6 : 1e-2;
  for (const [r, res] of ranks.entries()) {
    for (let step = 0; step < STEPS; step++) {
      const ref = reference.results[step];
      expect(rel(res.losses[step], ref.loss)).toBeLessThanOrEqual(tol);
      expect(res.losses[step]).toBe(post.results[r][step].loss);
      expect(res.gradNorms[step]).toBe(post.results[r][step].gradNorm);
      expect(rel(res.gradNorms[step], ref.gradNorm)).toBeLessThanOrEqual(tol);
      expect(rel(res.nll[step], ref.metrics.token_nll_sum)).toBeLessThanOrEqual(tol);
      for (const [name, g] of zero ? [] : reference.grads[step]) {
        // one process's gradients where the weights are still the same; later steps' weights carry AdamW's rounding (below)
        if (step === 0 && dtype === 'float32') expect({ name, rank: r, err: relError(res.grads[step][name], g) <= 1e-6 }).toEqual({ name, rank: r, err: true });
        // bitwise the sums of the post-run all-reduce (same rank-order additions), on every rank, every step
        expect({ name, step, rank: r, same: res.grads[step][name].every((x, i) => Object.is(x, post.grads[r][step].get(name)![i])) }).toEqual({ name, step, rank: r, same: true });
      }
      // every bucket's node ran once a step (ZeRO: once a micro-batch), in the backward's order
      const buckets = ranks[0].order[0].length / (zero ? micro : 1);
      expect(res.order[step]).toEqual(Array.from({ length: zero ? micro : 1 }, () => Array.from({ length: buckets }, (_, k) => k)).flat());
    }
    let worst = 0;
    for (const [name, v] of reference.final) {
      const mine = res.finals[name];
      for (let i = 0; i < v.length; i++) worst = Math.max(worst, Math.abs(mine[i] - v[i]));
      expect({ name, rank: r, same: mine.every((x, i) => Object.is(x, post.finals[r].get(name)![i])) }).toEqual({ name, rank: r, same: true });
    }
    // absolutely, as data-parallel.test's check (bfloat16 gradients move AdamW's near-zero elements by up to lr:
    // there the post-run path's weights are the truth)
    if (dtype === 'float32') expect(worst).toBeLessThanOrEqual(STEPS_TOL);
  }
  // several buckets (else nothing could overlap), and the trajectory moved
  expect(ranks[0].order[0].length / (zero ? micro : 1)).toBeGreaterThan(3);
  expect(reference.results[STEPS - 1].loss).toBeLessThan(reference.results[0].loss);

  // ORT's order: each bucket's node runs while backward nodes remain, bucket 0 (the head and the last layer) before most of them
  const profile = ranks[0].profile!;
  const at = (k: number) => profile.findIndex((n) => n.op === `GradAllReduce_${k}`);
  const backward = profile.map((n, i) => (n.name.startsWith('grad/') ? i : -1)).filter((i) => i >= 0);
  const buckets = ranks[0].order[0].length / (zero ? micro : 1);
  const positions = Array.from({ length: buckets }, (_, k) => at(k));
  expect(positions.every((p, k) => p >= 0 && (k === 0 || p > positions[k - 1]))).toBe(true);
  for (let k = 0; k < buckets - 1; k++) expect(backward.filter((i) => i > positions[k]).length).toBeGreaterThan(0);
  expect(backward.filter((i) => i > positions[0]).length / backward.length).toBeGreaterThan(0.5);
  // the embedding's gradient is the last to complete: its producer (the Gather's gradient) runs after every other bucket's node
  const embedding = profile.findLastIndex((n) => n.name.startsWith('grad/') && n.op === 'ScatterND');
  expect(positions.slice(0, -1).every((p) => p < embedding)).toBe(true);
}, 120_000);

test('the in-run reduction refuses what it does not cover, by option name', () => {
  const device = Device.cpu();
  const make = () => gradientAllReduceInGraph(ThreadGroup.join(ThreadGroup.create(1), 0), device);
  const t = Trainer.create(spec, { params: weights }, { inGraphGradients: make() });
  expect(() => t.trainStep(rankBatches(rows(0, 2), 0, 1, 1), 0.01)).toThrow(/inGraphGradients.*trainStepAsync/);
  t.dispose();
  expect(() => Trainer.create(spec, { params: weights }, { inGraphGradients: make(), onGradients: async () => undefined })).toThrow(/inGraphGradients .*replaces onGradients/);
  expect(() => Trainer.create(spec, { params: weights }, { inGraphGradients: make(), staticInputs: true })).toThrow(/inGraphGradients .*cudaGraph \/ staticInputs/);
  expect(() => Trainer.create(spec, { params: weights }, { inGraphGradients: make(), zero: LocalGroup.create(1)[0] })).toThrow(/inGraphGradients .*with zero give inGraphShards/);
  const shards = () => gradientReduceScatterInGraph(ThreadGroup.join(ThreadGroup.create(1), 0), device);
  expect(() => Trainer.create(spec, { params: weights }, { inGraphShards: shards() })).toThrow(/inGraphShards .*give zero with it/);
});

test('a ThreadGroup rank left alone fails after its timeout, naming itself; the peer then fails naming it', async () => {
  const shared = ThreadGroup.create(2, 16);
  const r0 = ThreadGroup.join(shared, 0, { timeoutMs: 200 });
  const t0 = Date.now();
  await expect(r0.allReduceHost(Float64Array.of(1))).rejects.toThrow(/rank 0 waited 200 ms in allReduceHost/);
  expect(Date.now() - t0).toBeLessThan(5000);
  const r1 = ThreadGroup.join(shared, 1, { timeoutMs: 10_000 });
  await expect(r1.allReduceHost(Float64Array.of(1))).rejects.toThrow(/rank 0 aborted/);
});

test('a node whose gradient is not the bound output buffer stops the step, naming the bucket and the gradient', async () => {
  const device = Device.cpu();
  const hook = gradientAllReduceInGraph(ThreadGroup.join(ThreadGroup.create(1), 0), device, { bucketBytes: BUCKET_BYTES });
  const elsewhere: DeviceTensor[] = [];
  // the trainer's buffers swapped for others of the same shapes: what an ORT temporary copied out later would look like
  const wrong = { ...hook, attach: (b: ReadonlyMap<string, DeviceTensor>) => hook.attach(new Map([...b].map(([n, t]) => [n, (elsewhere.push(device.zeros('float32', t.dims)), elsewhere.at(-1)!)]))) };
  const t = Trainer.create(spec, { params: weights }, { inGraphGradients: wrong });
  const before = t.downloadParams();
  await expect(t.trainStepAsync(rankBatches(rows(0, 2), 0, 1, 1), 0.01)).rejects.toThrow(/GradAllReduce: bucket 0's gradient 'lm_head.weight' is not the bound output buffer/);
  // no update was applied
  expect(t.downloadParams().get('lm_head.weight')).toEqual(before.get('lm_head.weight'));
  t.dispose();
  for (const x of elsewhere) x.dispose();
});

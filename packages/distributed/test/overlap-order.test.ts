/**
 * Where the in-run all-reduce's work happens. The order: with Lathe's kernels in the loss graph
 * (flash attention, fused log-prob, RoPE as custom-op nodes, their float32 host computes on the
 * CPU) each bucket's node still runs right after its gradients, while the backward of the layers
 * below remains, as with the composed graph (ORT's profile of the accumulate run, one rank). The
 * device's bucket times: `overlapSummary` on hand-made timelines, hidden and serialized. The nodes
 * alone (`soloInRunReducer`, a world of one) change nothing in the step.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TOTAL_LENGTH_INPUT, totalLengthTensor } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { sftLoss, Trainer, type SftLossOptions } from '@lathe/train';
import { crossEntropyOps, flashAttentionOps, ropeOps } from '@lathe/kernels';
import { bucketNodeOrderOfProfile, gradientAllReduceInGraph, overlapSummary, profiledNodes, soloInRunReducer, ThreadGroup, type BucketNodeOrder } from '@lathe/distributed';
import { rankBatches, sftBatch, sftRows, tinySftSpec } from './tiny-sft';

/** Small buckets, so the tiny model's gradients make several nodes. */
const BUCKET_BYTES = 4096;

/** One step of the tiny model with the in-run all-reduce (one rank), its loss attending through `loss`: the buckets' compute order and their places in the profile. */
async function orderWith(loss: SftLossOptions, customOpDomains: bigint[]): Promise<{ computed: number[]; order: BucketNodeOrder; ops: string[] }> {
  const { weights, config, spec } = tinySftSpec({ seed: 3 });
  const device = Device.cpu();
  const computed: number[] = [];
  const hook = gradientAllReduceInGraph(ThreadGroup.join(ThreadGroup.create(1), 0), device, { bucketBytes: BUCKET_BYTES, onCompute: (k) => computed.push(k) });
  const prefix = join(mkdtempSync(join(tmpdir(), 'lathe-overlap-kernels-')), 'acc');
  const trainer = Trainer.create(
    { ...spec, loss: sftLoss(config, { flashAttention: true, ...loss }) },
    { params: weights },
    { device, inGraphGradients: hook, session: { intraOpThreads: 1, profilePrefix: prefix, customOpDomains } },
  );
  // equal lengths: the flash paths take right-padded rows, here none padded
  const rows = sftRows(1000, 4, { maxLength: 5 }).map((r) => ({ ...r, ids: [...r.ids, 1, 2, 3, 4, 5, 6, 7].slice(0, 10) }));
  const batch = { ...sftBatch(rows, 24), [TOTAL_LENGTH_INPUT]: totalLengthTensor(10) };
  await trainer.trainStepAsync([batch], 0.01);
  trainer.dispose();
  hook.dispose();
  const order = bucketNodeOrderOfProfile(prefix);
  if (!order) throw new Error(`no profile with the bucket nodes at ${prefix}`);
  return { computed, order, ops: [...new Set(profiledNodes(order.file).map((n) => n.op))] };
}

test('with the kernels as custom ops in the loss graph, each bucket node runs before the backward of the layers below, as with the composed graph', async () => {
  const attention = flashAttentionOps('cpu');
  const ce = crossEntropyOps('cpu');
  const rope = ropeOps('cpu');
  const kernels = await orderWith({ attentionKernel: (x, heads) => attention.attend(x, heads, 'kernels'), logprobKernel: ce, ropeKernel: rope.rotate }, [attention.domain.handle, ce.domain.handle, rope.domain.handle]);
  attention.check();
  ce.check();
  rope.check();
  for (const d of [attention, ce, rope]) d.dispose();
  const composed = await orderWith({}, []);
  // the kernels' nodes ran in the accumulate run
  for (const op of ['FlashAttention', 'FlashAttentionGrad', 'FusedCrossEntropy', 'Rope']) expect({ op, ran: kernels.ops.some((o) => o.startsWith(op)) }).toEqual({ op, ran: true });
  for (const { computed, order } of [kernels, composed]) {
    const n = order.backwardAfter.length;
    expect(n).toBeGreaterThan(3);
    expect(computed).toEqual(Array.from({ length: n }, (_, k) => k));
    // each bucket but the embedding's (the last gradient completed) leaves backward work after it, fewer bucket by bucket
    for (let k = 0; k < n - 1; k++) expect(order.backwardAfter[k]).toBeGreaterThan(order.backwardAfter[k + 1]);
    // bucket 0 (the head and the last layer) before most of the backward
    expect(order.backwardAfter[0] / order.backward).toBeGreaterThan(0.5);
  }
}, 120_000);

test('overlapSummary: sums started at their ready are hidden but the last; sums started after the backward are all tail', () => {
  // three buckets ready 10 ms apart, each sum 5 ms
  const hidden = overlapSummary({ buckets: [0, 10, 20].map((r) => ({ ready: r, start: r, done: r + 5 })) });
  expect(hidden).toEqual({ backwardMs: 20, collectiveMs: 15, hiddenMs: 10, tailMs: 5, meanQueueMs: 0 });
  // the same sums, the first starting only when the last bucket is ready
  const serialized = overlapSummary({ buckets: [[0, 20], [10, 25], [20, 30]].map(([r, s]) => ({ ready: r, start: s, done: s + 5 })) });
  expect(serialized).toEqual({ backwardMs: 20, collectiveMs: 15, hiddenMs: 0, tailMs: 15, meanQueueMs: 15 });
  expect(overlapSummary({ buckets: [] })).toEqual({ backwardMs: 0, collectiveMs: 0, hiddenMs: 0, tailMs: 0, meanQueueMs: 0 });
});

test('soloInRunReducer: the bucket nodes without peers run every step and leave the steps those of the same two runs without them, bitwise', async () => {
  const { weights, spec } = tinySftSpec({ seed: 5 });
  const device = Device.cpu();
  const computed: number[] = [];
  const solo = gradientAllReduceInGraph(soloInRunReducer(), device, { bucketBytes: BUCKET_BYTES, onCompute: (k) => computed.push(k) });
  const withNodes = Trainer.create(spec, { params: weights }, { device, inGraphGradients: solo });
  // the reference is the split path (a no-op gradients hook: the same accumulate and apply runs without the nodes), since the
  // plain trainer's single step graph may order float32 reductions differently (its gradient norm 1 ulp apart for some seeds)
  const split = Trainer.create(spec, { params: weights }, { device, onGradients: () => Promise.resolve() });
  const plain = Trainer.create(spec, { params: weights }, { device });
  for (let step = 0; step < 2; step++) {
    const batch = rankBatches(sftRows(2000 + step, 4), 0, 1);
    const [a, b] = [await withNodes.trainStepAsync(batch, 0.01), await split.trainStepAsync(batch, 0.01)];
    expect([a.loss, a.gradNorm]).toEqual([b.loss, b.gradNorm]);
  }
  const [fa, fb] = [withNodes.downloadParams(), split.downloadParams()];
  for (const [name, v] of fb) expect({ name, same: fa.get(name)!.every((x, i) => Object.is(x, v[i])) }).toEqual({ name, same: true });
  expect(computed.length / 2).toBeGreaterThan(3);
  // one micro-batch: the run writes the gradients (no running-sum input) into one set of buffers, all the in-run path keeps beyond the plain trainer's state
  expect(withNodes.batchGraph.inputs.filter((t) => t.name.startsWith('grad/'))).toEqual([]);
  expect(withNodes.stateBytes - plain.stateBytes).toBe([...fb.values()].reduce((n, v) => n + v.byteLength, 0));
  withNodes.dispose();
  split.dispose();
  plain.dispose();
  solo.dispose();
});

/**
 * One rank of test/overlap.test.ts (and in-graph-update.test.ts), in a worker thread: the tiny SFT
 * model trained with its gradients all-reduced inside the accumulate run (`gradientAllReduceInGraph`
 * over a `ThreadGroup`), or inside the step's one run with the update (`inGraphUpdate`), reporting
 * each step's loss, grad norm and summed gradients, the buckets' compute order, the final weights
 * and (rank 0) the ORT profile of the run with the bucket nodes.
 */
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parentPort, workerData } from 'node:worker_threads';
import { Device, type DeviceTensor } from '@lathe/runtime';
import { Trainer, type GradReduceDtype } from '@lathe/train';
import { gradientAllReduceInGraph, gradientReduceScatterInGraph, ThreadGroup, type ThreadGroupShared } from '@lathe/distributed';
import { stepLr as lr, stepRows as rows, rankBatches, tinySftSpec } from './tiny-sft';

/** What the test sends each rank. */
export interface RankJob {
  shared: ThreadGroupShared;
  rank: number;
  steps: number;
  batch: number;
  micro: number;
  gradReduceDtype: GradReduceDtype;
  /** ZeRO with the reduce-scatter in the run (gradients are not reported). */
  zero: boolean;
  bucketBytes: number;
  /** TrainerOptions.inGraphUpdate (gradients are not reported: the bound buffers hold this rank's own). */
  inGraphUpdate?: boolean;
  /** TrainerOptions.fusedAdamW (on the CPU the fused node's host compute). */
  fusedAdamW?: boolean;
  /** At step `step`, rank `rank` feeds a batch whose loss-token count is 0: its loss and gradients are not finite. */
  nonFinite?: { step: number; rank: number };
}

/** One executed node of the profile: its op and name. */
export interface ProfiledNode {
  op: string;
  name: string;
}

/** What a rank sends back. */
export interface RankResult {
  losses: number[];
  gradNorms: number[];
  nll: number[];
  /** grads[step]: the summed gradients (bfloat16: their bits) the update read, by parameter. */
  grads: Record<string, Float32Array>[];
  /** order[step]: the buckets in the order their nodes computed. */
  order: number[][];
  finals: Record<string, Float32Array>;
  /** Rank 0: the accumulate session's nodes in the order ORT ran them (first run). */
  profile?: ProfiledNode[];
  /** With `nonFinite`: whether that step left this rank's parameters and step count as they were. */
  nonFiniteKept?: boolean;
}

async function main(job: RankJob): Promise<RankResult> {
  const { weights, spec } = tinySftSpec({ seed: 3 });
  const world = job.shared.worldSize;
  const device = Device.cpu();
  const order: number[][] = [];
  const group = ThreadGroup.join(job.shared, job.rank, { timeoutMs: 30_000 });
  const onCompute = (k: number) => order.at(-1)!.push(k);
  const hook = gradientAllReduceInGraph(group, device, { bucketBytes: job.bucketBytes, onCompute });
  // read the reduced gradients the update is about to use
  let buffers: ReadonlyMap<string, DeviceTensor> | undefined;
  const grads: Record<string, Float32Array>[] = [];
  const spy = {
    ...hook,
    attach: (b: ReadonlyMap<string, DeviceTensor>) => {
      buffers = b;
      hook.attach(b);
    },
    finish: async (sums: Float64Array) => {
      await hook.finish(sums);
      if (!job.inGraphUpdate) grads.push(Object.fromEntries([...buffers!].map(([n, t]) => [n, t.download().data as Float32Array])));
    },
  };
  const dir = mkdtempSync(join(tmpdir(), 'lathe-overlap-'));
  const session = { intraOpThreads: 1, ...(job.rank === 0 ? { profilePrefix: join(dir, 'rank0') } : {}) };
  const reduction = job.zero
    ? { zero: group, gradReduceDtype: job.gradReduceDtype, inGraphShards: gradientReduceScatterInGraph(group, device, { bucketBytes: job.bucketBytes, onCompute }) }
    : { gradReduceDtype: job.gradReduceDtype, inGraphGradients: spy };
  const trainer = Trainer.create(spec, { params: weights }, { device, microBatches: job.micro, session, ...reduction, ...(job.inGraphUpdate ? { inGraphUpdate: true } : {}), ...(job.fusedAdamW ? { fusedAdamW: true } : {}) });
  if (job.zero) hook.dispose();
  const out: RankResult = { losses: [], gradNorms: [], nll: [], grads, order, finals: {} };
  for (let step = 0; step < job.steps; step++) {
    order.push([]);
    const batches = rankBatches(rows(step, job.batch), job.rank, world, job.micro);
    const poisoned = job.nonFinite?.step === step;
    if (poisoned && job.nonFinite!.rank === job.rank) for (const b of batches) b.loss_tokens = { data: Float32Array.of(0), dims: [] };
    const before = poisoned ? { params: trainer.downloadParams(), step: trainer.step } : undefined;
    const r = await trainer.trainStepAsync(batches, lr(step));
    if (before) {
      const after = trainer.downloadParams();
      out.nonFiniteKept = trainer.step === before.step && [...before.params].every(([n, v]) => after.get(n)!.every((x, i) => Object.is(x, v[i])));
    }
    out.losses.push(r.loss);
    out.gradNorms.push(r.gradNorm);
    out.nll.push(r.metrics.token_nll_sum);
  }
  out.finals = Object.fromEntries(trainer.downloadParams());
  trainer.dispose();
  if (job.rank === 0) {
    // each session writes its own profile when disposed: the accumulate run's is the one with the buckets' nodes
    for (const f of readdirSync(dir)) {
      const events = JSON.parse(readFileSync(join(dir, f), 'utf8')) as { cat: string; name: string; args?: { op_name?: string } }[];
      const nodes = events.filter((e) => e.cat === 'Node' && e.name.endsWith('_kernel_time')).map((e) => ({ op: e.args?.op_name ?? '', name: e.name.replace(/_kernel_time$/, '') }));
      if (nodes.some((n) => n.op.startsWith('GradAllReduce'))) {
        // the first run's nodes only: every run lists the same sequence
        const first = nodes.findIndex((n, i) => i > 0 && n.name === nodes[0].name);
        out.profile = first > 0 ? nodes.slice(0, first) : nodes;
      }
    }
  }
  return out;
}

main(workerData as RankJob).then(
  (r) => parentPort!.postMessage({ ok: r }),
  (e: Error) => parentPort!.postMessage({ error: `${e.message}\n${e.stack ?? ''}` }),
);

/**
 * The gradient reduction a data-parallel rank gets (launch-dp.ts): the decision over device ×
 * world × ZeRO × --grad_overlap × compute stream, the trainer options each reduction builds (the
 * in-run ones over a one-rank ThreadGroup on the cpu, where the nodes can be built without NCCL),
 * and two ranks joined over TCP on the cpu, where the default means the post-backward reduction.
 */
import { Device } from '@lathe/runtime';
import { LocalGroup, ThreadGroup } from '@lathe/distributed';
import { gradientReduction, joinDataParallel, reductionTrainerOptions, type GradientReduction, type GradientReductionFacts } from '../src/launch-dp';
import { gradBucketMbOption, gradOverlapOption } from '../src/common-options';
import { DEFAULT_BUCKET_BYTES, type Collectives } from '@lathe/distributed';

const cpu = Device.cpu();

test('gradientReduction: in the run on cuda with the compute stream and --grad_overlap, else after the backward; ZeRO reduce-scatters', () => {
  const cases: [Partial<GradientReductionFacts>, GradientReduction][] = [
    [{ worldSize: 1 }, 'none'],
    [{ worldSize: 1, device: 'cpu' }, 'none'],
    [{}, 'in-run-all-reduce'],
    [{ zeroStage: 1 }, 'in-run-reduce-scatter'],
    [{ zeroStage: 2 }, 'in-run-reduce-scatter'],
    [{ gradOverlap: false }, 'all-reduce'],
    [{ gradOverlap: false, zeroStage: 1 }, 'reduce-scatter'],
    // ONNX Runtime's own stream (no NVRTC, or a device opened without Lathe's kernels)
    [{ computeStream: false }, 'all-reduce'],
    [{ computeStream: false, zeroStage: 2 }, 'reduce-scatter'],
    // the cpu's ranks are processes over TCP: the default means post-backward there
    [{ device: 'cpu', computeStream: false }, 'all-reduce'],
    [{ device: 'cpu', computeStream: false, zeroStage: 1 }, 'reduce-scatter'],
    [{ device: 'cpu', computeStream: false, gradOverlap: false }, 'all-reduce'],
    [{ worldSize: 8 }, 'in-run-all-reduce'],
  ];
  for (const [facts, want] of cases) {
    const f: GradientReductionFacts = { device: 'cuda', worldSize: 2, zeroStage: 0, gradOverlap: true, computeStream: true, ...facts };
    expect([f, gradientReduction(f)]).toEqual([f, want]);
  }
});

test('--grad_overlap: a boolean on by default, its help naming what it needs and its fallback', () => {
  expect(gradOverlapOption.type).toBe('boolean');
  expect(gradOverlapOption.default).toBe(true);
  expect(gradOverlapOption.describe).toMatch(/--device cuda \(NCCL\)/);
  expect(gradOverlapOption.describe).toMatch(/false sums them after the backward/);
  expect(gradOverlapOption.describe).toMatch(/on the cpu/);
});

test('reductionTrainerOptions: each reduction gives the trainer exactly its own options', () => {
  const [collectives] = LocalGroup.create(1);
  let reducers = 0;
  const inRun = () => {
    reducers++;
    return ThreadGroup.join(ThreadGroup.create(1), 0);
  };
  const parts = { collectives, device: cpu, gradReduceDtype: 'bfloat16' as const, inRun, microBatches: 1 };
  expect(reductionTrainerOptions('none', parts)).toEqual({});
  const post = reductionTrainerOptions('all-reduce', parts);
  expect(Object.keys(post).sort()).toEqual(['gradReduceDtype', 'onGradients']);
  expect(typeof post.onGradients).toBe('function');
  expect(post.gradReduceDtype).toBe('bfloat16');
  expect(reductionTrainerOptions('reduce-scatter', parts)).toEqual({ zero: collectives, gradReduceDtype: 'bfloat16' });
  expect(reducers).toBe(0);

  const inRunAll = reductionTrainerOptions('in-run-all-reduce', parts);
  expect(Object.keys(inRunAll).sort()).toEqual(['gradReduceDtype', 'inGraphGradients']);
  expect(inRunAll.inGraphGradients!.customOpDomains).toHaveLength(1);
  const inRunShards = reductionTrainerOptions('in-run-reduce-scatter', parts);
  expect(Object.keys(inRunShards).sort()).toEqual(['gradReduceDtype', 'inGraphShards', 'zero']);
  expect(inRunShards.zero).toBe(collectives);
  expect(reducers).toBe(2);
  inRunAll.inGraphGradients!.dispose?.();
  inRunShards.inGraphShards!.dispose?.();

  // float32 sums with one micro-batch a step: the update joins the all-reduce's run; otherwise it stays a run of its own
  const oneRun = reductionTrainerOptions('in-run-all-reduce', { ...parts, gradReduceDtype: 'float32' });
  expect(Object.keys(oneRun).sort()).toEqual(['gradReduceDtype', 'inGraphGradients', 'inGraphUpdate']);
  expect(oneRun.inGraphUpdate).toBe(true);
  const twoMicro = reductionTrainerOptions('in-run-all-reduce', { ...parts, gradReduceDtype: 'float32', microBatches: 2 });
  expect(twoMicro.inGraphUpdate).toBeUndefined();
  const shards = reductionTrainerOptions('in-run-reduce-scatter', { ...parts, gradReduceDtype: 'float32' });
  expect(shards.inGraphUpdate).toBeUndefined();
  for (const o of [oneRun, twoMicro]) o.inGraphGradients!.dispose?.();
  shards.inGraphShards!.dispose?.();
});

test('reductionTrainerOptions: bfloat16 sums join the update run where the fused AdamW is the default (CUDA on Lathe stream), not with LATHE_FUSED_ADAMW=0 or two micro-batches', () => {
  const [collectives] = LocalGroup.create(1);
  const inRun = () => ThreadGroup.join(ThreadGroup.create(1), 0);
  // the decision reads the device's kind and stream only (no GPU is touched building the hook's nodes)
  const cuda = { kind: 'cuda', name: 'cuda:0', computeStream: 1n } as unknown as Device;
  const parts = { collectives, device: cuda, gradReduceDtype: 'bfloat16' as const, inRun, microBatches: 1 };
  const fused = reductionTrainerOptions('in-run-all-reduce', parts);
  expect(fused.inGraphUpdate).toBe(true);
  const twoMicro = reductionTrainerOptions('in-run-all-reduce', { ...parts, microBatches: 2 });
  expect(twoMicro.inGraphUpdate).toBeUndefined();
  const before = process.env.LATHE_FUSED_ADAMW;
  process.env.LATHE_FUSED_ADAMW = '0';
  try {
    const composed = reductionTrainerOptions('in-run-all-reduce', parts);
    expect(composed.inGraphUpdate).toBeUndefined();
    composed.inGraphGradients!.dispose?.();
  } finally {
    if (before === undefined) delete process.env.LATHE_FUSED_ADAMW;
    else process.env.LATHE_FUSED_ADAMW = before;
  }
  for (const o of [fused, twoMicro]) o.inGraphGradients!.dispose?.();
});

/** Each of `configs.length` ranks joining over TCP in this process (each rank its own env): one promise per rank. */
function rankJoins(port: number, configs: Record<string, unknown>[], opts: { zeroStage?: number; gradOverlap?: boolean; gradBucketMb?: number } = {}) {
  const n = configs.length;
  return configs.map((config, rank) =>
    joinDataParallel({
      device: 'cpu',
      config,
      batch: { rows: 4, microBatches: 1 },
      env: { RANK: String(rank), WORLD_SIZE: String(n), LOCAL_RANK: String(rank), LOCAL_WORLD_SIZE: String(n), MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port) },
      timeoutMs: 10_000,
      ...opts,
    }),
  );
}

test('joinDataParallel on the cpu: --grad_overlap on by default, the post-backward all-reduce (or ZeRO) all the same', async () => {
  const ranks = await Promise.all(rankJoins(29671, [{ grad_overlap: true }, { grad_overlap: true }]));
  try {
    for (const dp of ranks) {
      expect(dp!.gradOverlap).toBe(true);
      expect(dp!.reductionFor(cpu)).toBe('all-reduce');
      const opts = dp!.trainerOptionsFor(cpu);
      expect(Object.keys(opts).sort()).toEqual(['gradReduceDtype', 'onGradients']);
      expect(opts.gradReduceDtype).toBe('float32');
    }
  } finally {
    await Promise.all(ranks.map((dp) => dp!.close()));
  }
  const zero = await Promise.all(rankJoins(29672, [{}, {}], { zeroStage: 1, gradOverlap: false }));
  try {
    for (const dp of zero) {
      expect(dp!.reductionFor(cpu)).toBe('reduce-scatter');
      expect(dp!.trainerOptionsFor(cpu)).toEqual({ zero: dp!.collectives, gradReduceDtype: 'float32' });
    }
  } finally {
    await Promise.all(zero.map((dp) => dp!.close()));
  }
});

test('joinDataParallel: ranks started with different --grad_overlap stop with the same message naming it', async () => {
  const results = await Promise.allSettled(rankJoins(29673, [{ grad_overlap: true, lr: 1 }, { grad_overlap: false, lr: 1 }]));
  for (const r of results) {
    expect(r.status).toBe('rejected');
    expect(String((r as PromiseRejectedResult).reason)).toMatch(/rank 1 differs from rank 0 in grad_overlap \(false vs true\)/);
  }
});

test('joinDataParallel: alone (no launcher variables) there is no group', async () => {
  await expect(joinDataParallel({ device: 'cpu', config: {}, batch: { rows: 4, microBatches: 1 }, env: {} })).resolves.toBeUndefined();
});

test('--grad_bucket_mb: 100 MiB by default (the library\'s DEFAULT_BUCKET_BYTES), and the post-backward all-reduce launches one NCCL call per bucket of that size', async () => {
  expect(gradBucketMbOption.default).toBe(100);
  expect(DEFAULT_BUCKET_BYTES).toBe(100 * 2 ** 20);
  const calls: number[][] = [];
  // two ranks as far as the hook can tell; the sums themselves are not what is checked here
  const recording = { worldSize: 2, rank: 0, allReduce: async (ts: { byteLength: number }[]) => void calls.push(ts.map((t) => t.byteLength)), allReduceHost: async () => undefined } as unknown as Collectives;
  const grads = new Map([0, 1, 2].map((i) => [`w${i}`, cpu.zeros('float32', [2 ** 18])] as const));
  for (const [bucketBytes, want] of [[undefined, [[2 ** 20, 2 ** 20, 2 ** 20]]], [2 ** 21, [[2 ** 20, 2 ** 20], [2 ** 20]]], [2 ** 20, [[2 ** 20], [2 ** 20], [2 ** 20]]]] as const) {
    calls.length = 0;
    const opts = reductionTrainerOptions('all-reduce', { collectives: recording, device: cpu, gradReduceDtype: 'float32', microBatches: 1, inRun: () => { throw new Error('not in the run'); }, ...(bucketBytes ? { bucketBytes } : {}) });
    await opts.onGradients!(grads, new Float64Array(1));
    expect(calls).toEqual(want);
  }
  for (const g of grads.values()) g.dispose();
  const ranks = await Promise.all(rankJoins(29674, [{}, {}], { gradBucketMb: 25 }));
  try {
    for (const dp of ranks) expect(dp!.bucketBytes).toBe(25 * 2 ** 20);
  } finally {
    await Promise.all(ranks.map((dp) => dp!.close()));
  }
  const byDefault = await Promise.all(rankJoins(29675, [{}, {}]));
  try {
    for (const dp of byDefault) expect(dp!.bucketBytes).toBe(DEFAULT_BUCKET_BYTES);
  } finally {
    await Promise.all(byDefault.map((dp) => dp!.close()));
  }
});

/**
 * A training command's place in a data-parallel job, for the recipes: the job's layout from the
 * environment (`lathe launch`, torchrun, srun), the group formed at the rendezvous (TCP on the CPU,
 * NCCL over it on CUDA), the checks every rank runs at start (the global batch splits evenly; every
 * rank has the same config), and what a training loop then needs: the gradient reduction, its share
 * of each global batch, and whether it is the rank that writes the run directory.
 */
import { mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { fusedAdamWByDefault, listCheckpoints, type GradReduceDtype, type TrainerOptions } from '@lathe/train';
import type { Device } from '@lathe/runtime';
import { RunDir, type RunDirOptions } from './scaffold';
import type { ReportOptions } from './reporting';
import { gradBucketMbOption, gradOverlapOption, gradReduceDtypeOption } from './common-options';
import {
  checkDataParallelBatch,
  checkSameConfig,
  gradientAllReduce,
  gradientAllReduceInGraph,
  gradientReduceScatterInGraph,
  NcclCollectives,
  NcclInRunReducer,
  shardOf,
  TcpCollectives,
  worldFromEnv,
  type Collectives,
  type GradientHook,
  type InRunReducer,
  type WorldInfo,
} from '@lathe/distributed';

/**
 * How a data-parallel run sums its gradients over the ranks: `in-run-all-reduce` /
 * `in-run-reduce-scatter` inside the backward's run (one node per bucket, overlapping the rest of
 * the backward), `all-reduce` / `reduce-scatter` after it (the bucketed post-backward reduction);
 * the `reduce-scatter` forms are ZeRO's; `none` alone.
 */
export type GradientReduction = 'none' | 'all-reduce' | 'reduce-scatter' | 'in-run-all-reduce' | 'in-run-reduce-scatter';

/** What {@link gradientReduction} decides on. */
export interface GradientReductionFacts {
  device: 'cpu' | 'cuda';
  worldSize: number;
  /** `--zero_stage` (1 and 2 are one path). */
  zeroStage: number;
  /** `--grad_overlap`. */
  gradOverlap: boolean;
  /** The device runs its sessions on Lathe's compute stream (`Kernels.withDevice`), the stream the in-run nodes order NCCL behind. */
  computeStream: boolean;
}

/**
 * The reduction a rank gets: in the run wherever it can be (cuda, whose collectives are NCCL, on
 * Lathe's compute stream, `--grad_overlap` on), else after the backward. The CPU's ranks are
 * processes joined over TCP, which cannot sum inside a run, so there the default means post-backward.
 */
export function gradientReduction(f: GradientReductionFacts): GradientReduction {
  if (f.worldSize <= 1) return 'none';
  const inRun = f.gradOverlap && f.device === 'cuda' && f.computeStream;
  if (f.zeroStage >= 1) return inRun ? 'in-run-reduce-scatter' : 'reduce-scatter';
  return inRun ? 'in-run-all-reduce' : 'all-reduce';
}

/** The data-parallel options `Trainer.create` takes: one gradient reduction, and the dtype it sums in. */
export type DataParallelTrainerOptions = Pick<TrainerOptions, 'onGradients' | 'zero' | 'gradReduceDtype' | 'inGraphGradients' | 'inGraphShards' | 'inGraphUpdate'>;

/**
 * The trainer options of `reduction`: the post-backward hook or ZeRO's collectives, or the in-run
 * nodes built for `device` over `inRun()`'s reducer (called only for the in-run forms). The in-run
 * all-reduce with one micro-batch a step also takes the update into its run (`inGraphUpdate`): one
 * run a step, as on one GPU, instead of an accumulate run and an apply run — for float32 sums, and
 * for bfloat16 ones where the trainer's update is the fused node (which reads them as they are).
 */
export function reductionTrainerOptions(
  reduction: GradientReduction,
  parts: { collectives: Collectives; device: Device; gradReduceDtype: GradReduceDtype; inRun: () => InRunReducer; bucketBytes?: number; microBatches: number },
): DataParallelTrainerOptions {
  const { collectives, device, gradReduceDtype, bucketBytes } = parts;
  switch (reduction) {
    case 'none':
      return {};
    case 'all-reduce':
      return { onGradients: gradientAllReduce(collectives, { bucketBytes }), gradReduceDtype };
    case 'reduce-scatter':
      return { zero: collectives, gradReduceDtype };
    case 'in-run-all-reduce':
      return { inGraphGradients: gradientAllReduceInGraph(parts.inRun(), device, { bucketBytes }), gradReduceDtype, ...(parts.microBatches === 1 && (gradReduceDtype === 'float32' || fusedAdamWByDefault(device)) ? { inGraphUpdate: true } : {}) };
    case 'in-run-reduce-scatter':
      return { zero: collectives, inGraphShards: gradientReduceScatterInGraph(parts.inRun(), device, { bucketBytes }), gradReduceDtype };
  }
}

/** A rank of a data-parallel run. */
export interface DataParallelRun {
  world: WorldInfo;
  collectives: Collectives;
  /** `Trainer.create`'s `onGradients`: the bucketed all-reduce of the summed gradients, loss and metrics. */
  onGradients: GradientHook;
  /** 0, or 1 / 2 for ZeRO (`--zero_stage`; one path: see zeroStageOption). */
  zeroStage: number;
  /** `--grad_overlap`: the gradients summed inside the backward's run where the device allows it (see {@link gradientReduction}). */
  gradOverlap: boolean;
  /** `--grad_bucket_mb` in bytes: the gradients per NCCL launch of either reduction. */
  bucketBytes: number;
  /**
   * The post-backward reduction's trainer options, whatever `--grad_overlap` says: `onGradients`, or
   * with ZeRO `zero` (the collectives the shards are exchanged over), and `gradReduceDtype`. For a
   * caller whose hooks must serve several trainers (each in-run hook serves one).
   */
  trainerOptions: Pick<TrainerOptions, 'onGradients' | 'zero' | 'gradReduceDtype'>;
  /** The reduction a trainer on `device` gets (the in-run one needs the device's compute stream). */
  reductionFor(device: Device): GradientReduction;
  /**
   * What `Trainer.create` takes for one trainer on `device` (the rank's GPU, opened): the reduction
   * of {@link reductionFor}, its in-run nodes built for this trainer; the trainer frees them.
   */
  trainerOptionsFor(device: Device): DataParallelTrainerOptions;
  /** Rank 0: the one rank that writes the run directory (config, metrics, evaluations, checkpoints). */
  main: boolean;
  /** This rank's GPU (LOCAL_RANK): `Device.open(cfg.device, { id: deviceId })`. */
  deviceId: number;
  /** This rank's contiguous share of a global batch. */
  shard<T>(rows: readonly T[], flag?: string): T[];
  /** Leaves the group (after the last step). */
  close(): Promise<void>;
  /** Fails the other ranks' pending and later operations, naming this rank and `reason` (a run that throws). */
  abort(reason: string): void;
}

/** What `joinDataParallel` checks and forms the group for. */
export interface DataParallelOptions {
  device: 'cpu' | 'cuda';
  /** The command's resolved config: every rank must have the same (up to `ignore`). */
  config: Record<string, unknown>;
  /** Config keys that may differ between ranks. */
  ignore?: readonly string[];
  /** Rows of a global batch and micro-batches per rank, with the flags that set them (named in errors). */
  batch: { rows: number; microBatches: number; flags?: { batch: string; micro: string } };
  env?: NodeJS.ProcessEnv;
  /** How long the rendezvous may take to form (default 120 s). */
  timeoutMs?: number;
  /** `--zero_stage`: 1 or 2 shards the AdamW state over the ranks (ZeRO). Default 0. */
  zeroStage?: number;
  /** `--grad_reduce_dtype`: the dtype gradients are summed over the ranks in. Default float32. */
  gradReduceDtype?: GradReduceDtype;
  /** `--grad_overlap`: sum the gradients inside the backward's run where the device allows it. Default true. */
  gradOverlap?: boolean;
  /** `--grad_bucket_mb`: MiB of gradients per bucket of either reduction. */
  gradBucketMb?: number;
}

/**
 * Joins the job this process was started in, or returns undefined when it runs alone (no RANK /
 * WORLD_SIZE, no SLURM_PROCID / SLURM_NTASKS, or a world of 1). Every rank runs the same checks, so
 * a bad batch size or a mismatched config stops every rank with the same message.
 */
export async function joinDataParallel(opts: DataParallelOptions): Promise<DataParallelRun | undefined> {
  const world = worldFromEnv(opts.env);
  if (world.worldSize === 1) return undefined;
  checkDataParallelBatch(opts.batch.rows, opts.batch.microBatches, world.worldSize, opts.batch.flags);
  const tcp = await TcpCollectives.connect({ rank: world.rank, worldSize: world.worldSize, addr: world.masterAddr, port: world.masterPort, timeoutMs: opts.timeoutMs });
  let collectives: Collectives = tcp;
  try {
    await checkSameConfig(tcp, opts.config, opts.ignore);
    if (opts.device === 'cuda') collectives = await NcclCollectives.create(tcp, { deviceId: world.localRank });
  } catch (e) {
    await tcp.close();
    throw e;
  }
  const zeroStage = opts.zeroStage ?? 0;
  // the commands' options are the one source of these defaults
  const bucketBytes = (opts.gradBucketMb ?? gradBucketMbOption.default) * 2 ** 20;
  const onGradients = gradientAllReduce(collectives, { bucketBytes });
  const gradOverlap = opts.gradOverlap ?? gradOverlapOption.default;
  const gradReduceDtype: GradReduceDtype = opts.gradReduceDtype ?? gradReduceDtypeOption.default;
  // one reducer (a CUDA event on NCCL's stream) for every trainer of the run, freed with the group
  let reducer: NcclInRunReducer | undefined;
  const inRun = (): InRunReducer => {
    if (!(collectives instanceof NcclCollectives)) throw new Error('the in-run gradient reduction needs NCCL collectives (--device cuda)');
    return (reducer ??= NcclInRunReducer.create(collectives));
  };
  const reductionFor = (device: Device) => gradientReduction({ device: opts.device, worldSize: world.worldSize, zeroStage, gradOverlap, computeStream: device.kind === 'cuda' && device.computeStream !== undefined });
  return {
    world,
    collectives,
    onGradients,
    zeroStage,
    gradOverlap,
    bucketBytes,
    trainerOptions: { ...(zeroStage >= 1 ? { zero: collectives } : { onGradients }), gradReduceDtype },
    reductionFor,
    trainerOptionsFor(device) {
      const reduction = reductionFor(device);
      if (gradOverlap && opts.device === 'cuda' && !reduction.startsWith('in-run') && world.rank === 0) {
        process.stderr.write(`note: --grad_overlap: ${device.name} runs its sessions on ONNX Runtime's own stream (Lathe's CUDA kernels are off), so the gradients are summed after the backward\n`);
      }
      return reductionTrainerOptions(reduction, { collectives, device, gradReduceDtype, inRun, bucketBytes, microBatches: opts.batch.microBatches });
    },
    main: world.rank === 0,
    deviceId: opts.device === 'cuda' ? world.localRank : 0,
    shard: (rows, flag) => shardOf(rows, world.rank, world.worldSize, flag),
    close: async () => {
      await collectives.close();
      reducer?.dispose();
    },
    abort: (reason) => collectives.abort(reason),
  };
}

/**
 * The run directory of a rank. Rank 0 opens `cfg.run_dir` (a new run, or a resume) and is the only
 * rank that writes there; the others wait for it, then run in a scratch folder of their own whose
 * checkpoints/ links to the run's checkpoints, so a resume reads the same checkpoint on every rank
 * (a shared filesystem across hosts) and nothing they write collides with rank 0's files.
 * Alone (`dp` undefined) it is `RunDir.open(cfg)`.
 */
export async function openRankRunDir(cfg: RunDirOptions & Partial<ReportOptions>, dp: DataParallelRun | undefined): Promise<RunDir> {
  if (!dp) return RunDir.open(cfg);
  if (dp.main) {
    let run: RunDir;
    try {
      run = RunDir.open(cfg);
    } catch (e) {
      // the other ranks wait for rank 0's run directory: tell them why it will not come
      dp.abort(`could not open --run_dir ${cfg.run_dir}: ${(e as Error).message}`);
      throw e;
    }
    await dp.collectives.barrier();
    return run;
  }
  await dp.collectives.barrier();
  const scratch = mkdtempSync(join(tmpdir(), `lathe-rank-${dp.world.rank}-`));
  if (cfg.resume) {
    mkdirSync(join(scratch, 'checkpoints'));
    for (const c of listCheckpoints(cfg.run_dir)) symlinkSync(resolve(c.dir), join(scratch, 'checkpoints', basename(c.dir)));
  }
  const close = dp.close;
  dp.close = async () => {
    await close();
    rmSync(scratch, { recursive: true, force: true });
  };
  return RunDir.open({ ...cfg, run_dir: scratch, overwrite: true, report_to: 'none' });
}

/**
 * Whether any rank was asked to stop (Ctrl-C, SIGTERM) after this step: the ranks agree, so all of
 * them stop after the same step (one rank stopping alone would leave the others waiting).
 */
export async function anyRankStopped(dp: DataParallelRun | undefined, stopped: boolean): Promise<boolean> {
  if (!dp) return stopped;
  const v = Float64Array.from([stopped ? 1 : 0]);
  await dp.collectives.allReduceHost(v, 'sum');
  return v[0] > 0;
}

/** Whether this rank must join the checkpoint's state gathering although it writes nothing (ZeRO). */
export function joinsCheckpoint(dp: DataParallelRun | undefined): boolean {
  return !dp || dp.main || dp.zeroStage >= 1;
}

/**
 * One RL step's results gathered from every rank, for rank 0's logs: every rank's rollouts in rank
 * order (the prompts' order), and each metric the mean of the ranks' values — exact for means over
 * the equal shares (rewards, lengths, KL) and for what every rank already shares (the loss and
 * gradient norm, summed by the gradient hook); a count is a rank's average. A metric that is not a
 * finite number on some rank is NaN.
 */
export async function gatherRlStep<T extends { metrics: object; rollouts: readonly unknown[] }>(dp: DataParallelRun, step: T): Promise<T> {
  if (dp.world.worldSize === 1) return step;
  const parts = (await dp.collectives.allGatherBytes(new TextEncoder().encode(JSON.stringify({ metrics: step.metrics, rollouts: step.rollouts })))).map(
    (b) => JSON.parse(new TextDecoder().decode(b)) as { metrics: Record<string, unknown>; rollouts: T['rollouts'] },
  );
  const metrics: Record<string, unknown> = { ...step.metrics };
  for (const [k, v] of Object.entries(step.metrics)) {
    if (typeof v !== 'number') continue;
    const values = parts.map((p) => p.metrics[k]);
    metrics[k] = values.every((x): x is number => typeof x === 'number' && Number.isFinite(x)) ? values.reduce((a, b) => a + b, 0) / values.length : NaN;
  }
  return { ...step, metrics: metrics as T['metrics'], rollouts: parts.flatMap((p) => p.rollouts) };
}

/**
 * A training command's place in a data-parallel job, for the recipes: the job's layout from the
 * environment (`lathe launch`, torchrun, srun), the group formed at the rendezvous (TCP on the CPU,
 * NCCL over it on CUDA), the checks every rank runs at start (the global batch splits evenly; every
 * rank has the same config), and what a training loop then needs: the gradient hook, its share of
 * each global batch, and whether it is the rank that writes the run directory.
 */
import { mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { listCheckpoints, type GradReduceDtype, type TrainerOptions } from '@lathe/train';
import { RunDir, type RunDirOptions } from './scaffold';
import type { ReportOptions } from './reporting';
import { checkDataParallelBatch, checkSameConfig, gradientAllReduce, NcclCollectives, shardOf, TcpCollectives, worldFromEnv, type Collectives, type GradientHook, type WorldInfo } from '@lathe/distributed';

/** A rank of a data-parallel run. */
export interface DataParallelRun {
  world: WorldInfo;
  collectives: Collectives;
  /** `Trainer.create`'s `onGradients`: the bucketed all-reduce of the summed gradients, loss and metrics. */
  onGradients: GradientHook;
  /** 0, or 1 / 2 for ZeRO (`--zero_stage`; one path: see zeroStageOption). */
  zeroStage: number;
  /** What `Trainer.create` takes for this job: `onGradients`, or with ZeRO `zero` (the collectives the shards are exchanged over), and `gradReduceDtype`. */
  trainerOptions: Pick<TrainerOptions, 'onGradients' | 'zero' | 'gradReduceDtype'>;
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
  const onGradients = gradientAllReduce(collectives);
  const zeroStage = opts.zeroStage ?? 0;
  return {
    world,
    collectives,
    onGradients,
    zeroStage,
    trainerOptions: { ...(zeroStage >= 1 ? { zero: collectives } : { onGradients }), gradReduceDtype: opts.gradReduceDtype ?? 'float32' },
    main: world.rank === 0,
    deviceId: opts.device === 'cuda' ? world.localRank : 0,
    shard: (rows, flag) => shardOf(rows, world.rank, world.worldSize, flag),
    close: () => collectives.close(),
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

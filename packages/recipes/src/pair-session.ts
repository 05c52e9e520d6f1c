/**
 * The run around a preference recipe's training (`lathe rm train`, `lathe dpo`): this rank's place
 * in a data-parallel job, its run directory and its model, opened in that order; and however the
 * training ends, what the recipe held released, the run directory closed and the job left — the
 * other ranks told why when this one failed.
 */
import { joinDataParallel, openRankRunDir, type DataParallelRun } from './launch-dp';
import type { GradReduceDtype } from '@lathe/train';
import type { PairRunConfig } from './pair-run';
import type { ReportOptions } from './reporting';
import { loadRunModel, type ModelOptions, type RunDir, type RunDirOptions, type RunModel } from './scaffold';

/** The options a preference session reads: the pair run's, where the run lives, the model, `--zero_stage` and `--grad_reduce_dtype` (float32 where the command has no such option). */
export type PairSessionConfig = PairRunConfig & RunDirOptions & Partial<ReportOptions> & ModelOptions & { zero_stage: number; grad_reduce_dtype?: GradReduceDtype; grad_overlap?: boolean; grad_bucket_mb?: number };

/** What a preference session gives the recipe's training. */
export interface PairSession {
  /** This rank's place in a data-parallel job (lathe launch), if it runs in one. */
  dp: DataParallelRun | undefined;
  run: RunDir;
  model: RunModel;
  /** Registers something to dispose when the training ends (last registered, first disposed), before the run directory closes. */
  hold<T extends { dispose(): void }>(resource: T): T;
}

/** Opens a preference session, runs `train` in it and closes it (see the module comment); returns what `train` returns. */
export async function inPairSession<T>(cfg: PairSessionConfig & Record<string, unknown>, train: (session: PairSession) => Promise<T>): Promise<T> {
  // under lathe launch: this rank's share of a data-parallel job; rank 0 alone writes the run directory
  const dp = await joinDataParallel({ device: cfg.device, config: cfg, batch: { rows: cfg.batch_size, microBatches: cfg.micro_batches }, zeroStage: cfg.zero_stage, gradReduceDtype: cfg.grad_reduce_dtype, gradOverlap: cfg.grad_overlap, gradBucketMb: cfg.grad_bucket_mb });
  const run = await openRankRunDir(cfg, dp);
  const held: { dispose(): void }[] = [];
  try {
    // the built-in model is written into this rank's own run directory (rank 0's may not hold it yet)
    const model = await loadRunModel({ ...cfg, run_dir: run.dir });
    return await train({
      dp,
      run,
      model,
      hold: (resource) => {
        held.push(resource);
        return resource;
      },
    });
  } catch (e) {
    // the other ranks would wait for this one at their next all-reduce: they stop now, told why
    dp?.abort((e as Error).message);
    throw e;
  } finally {
    for (const r of held.reverse()) r.dispose();
    await run.close();
    await dp?.close();
  }
}

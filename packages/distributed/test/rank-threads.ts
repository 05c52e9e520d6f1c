/**
 * Ranks as worker threads for the in-run all-reduce tests (overlap, in-graph update): each runs
 * overlap-rank.ts (the TypeScript source through tsx, as the serve thread starts) over one shared
 * `ThreadGroup` and reports its `RankResult`.
 */
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import { ThreadGroup } from '@lathe/distributed';
import type { RankJob, RankResult } from './overlap-rank';

/** Runs `world` ranks of `job` as worker threads; rejects with the first rank's error. */
export function rankThreads(world: number, job: Omit<RankJob, 'shared' | 'rank'>): Promise<RankResult[]> {
  // a small staging area, so larger gradients go through it in several rounds
  const shared = ThreadGroup.create(world, 256);
  const boot = `require(${JSON.stringify(require.resolve('tsx/cjs'))});require(${JSON.stringify(join(__dirname, 'overlap-rank.ts'))});`;
  return Promise.all(
    Array.from({ length: world }, (_, rank) => {
      const w = new Worker(boot, { eval: true, workerData: { ...job, shared, rank } satisfies RankJob, execArgv: ['--conditions=lathe-source'] });
      return new Promise<RankResult>((resolve, reject) => {
        w.once('message', (m: { ok?: RankResult; error?: string }) => (m.ok ? resolve(m.ok) : reject(new Error(`rank ${rank}: ${m.error}`))));
        w.once('error', reject);
        w.once('exit', (code) => reject(new Error(`rank ${rank} exited with ${code} before reporting`)));
      }).finally(() => void w.terminate());
    }),
  );
}

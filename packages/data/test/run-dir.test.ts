import { appendFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import {
  MetricsLog,
  RolloutStore,
  createRunDir,
  diffConfigs,
  listRunCheckpoints,
  listRuns,
  pruneCheckpoints,
  readMetrics,
  readRunConfig,
  resolveRun,
  runPaths,
  summarizeRun,
} from '@lathe/data';

const root = mkdtempSync(path.join(tmpdir(), 'lathe-runs-'));

/** A run like `lathe sft` leaves: config, metrics, checkpoints step-N (with trainer_state.json), eval files. */
function makeRun(name: string, config: Record<string, unknown>, steps: { step: number; loss: number; accuracy: number }[]): string {
  const dir = path.join(root, name);
  const p = createRunDir(dir, config);
  const log = new MetricsLog(p.metrics);
  for (const s of steps) {
    log.log({ step: s.step, loss: s.loss, lr: 1e-3 });
    const ckpt = path.join(p.checkpoints, `step-${String(s.step).padStart(8, '0')}`);
    mkdirSync(ckpt);
    writeFileSync(path.join(ckpt, 'trainer_state.json'), JSON.stringify({ step: s.step, dataPosition: 0, seed: 0 }));
    writeFileSync(path.join(ckpt, 'model.safetensors'), Buffer.alloc(1000));
    const n = 10;
    const rows = Array.from({ length: n }, (_, i) => JSON.stringify({ prompt: 'p', correct: i < Math.round(s.accuracy * n) }));
    writeFileSync(path.join(p.eval, `step-${String(s.step).padStart(8, '0')}.jsonl`), rows.join('\n') + '\n');
  }
  return dir;
}

const steps = [
  { step: 100, loss: 2.0, accuracy: 0.2 },
  { step: 200, loss: 1.0, accuracy: 0.7 },
  { step: 300, loss: 0.5, accuracy: 0.4 },
  { step: 400, loss: 0.8, accuracy: 0.3 },
  { step: 500, loss: 0.9, accuracy: 0.5 },
];

describe('run directories', () => {
  test('summary: config, last metrics, checkpoints, eval accuracy, rollout counts; incomplete checkpoints ignored', async () => {
    const dir = makeRun('a', { lr: 1e-3, model: 'm', lora: { rank: 8 } }, steps);
    mkdirSync(path.join(dir, 'checkpoints', '.step-00000600.tmp-123')); // a checkpoint being written
    mkdirSync(path.join(dir, 'checkpoints', 'step-00000700')); // no trainer_state.json: incomplete
    const store = await RolloutStore.open(runPaths(dir).rollouts);
    store.addTrain({ step: 1, epoch: 0, prompt_index: 0, rollout_index: 0, prompt: 'p', completion: 'c' });
    store.addEval({ step: 1, dataset: 'd', prompt_index: 0, rollout_index: 0, prompt: 'p', completion: 'c' });
    await store.close();
    const s = summarizeRun(dir);
    expect(s.name).toBe('a');
    expect(s.lastMetrics).toEqual({ step: 500, loss: 0.9, lr: 1e-3 });
    expect(s.checkpoints.map((c) => c.step)).toEqual([100, 200, 300, 400, 500]);
    expect(s.checkpoints[0].bytes).toBeGreaterThan(1000);
    expect(s.evals.map((e) => e.accuracy)).toEqual([0.2, 0.7, 0.4, 0.3, 0.5]);
    expect(s.rollouts).toEqual({ train: 1, eval: 1, lastStep: 1 });
    expect(readRunConfig(dir)).toEqual({ lr: 1e-3, model: 'm', lora: { rank: 8 } });
    expect(resolveRun('a', root)).toBe(dir);
    expect(resolveRun(dir, '/nowhere')).toBe(dir);
    expect(() => resolveRun('zzz', root)).toThrow(`run 'zzz': neither a directory nor a run under ${root}`);
  });

  test('listRuns finds run directories only, newest first', () => {
    makeRun('b', { lr: 2e-3 }, steps.slice(0, 1));
    mkdirSync(path.join(root, 'not-a-run'));
    expect(listRuns(root).map((r) => r.name).sort()).toEqual(['a', 'b']);
    expect(() => listRuns(path.join(root, 'missing'))).toThrow('missing: no such directory (pass --root');
  });

  test('metrics: a torn last line (crash mid-append) is skipped; a bad line elsewhere names file and line', () => {
    const dir = makeRun('torn', {}, steps.slice(0, 2));
    const file = runPaths(dir).metrics;
    appendFileSync(file, '{"step": 300, "lo');
    expect(readMetrics(file).map((m) => m.step)).toEqual([100, 200]);
    appendFileSync(file, '\n{"step": 400}\n');
    expect(() => readMetrics(file)).toThrow(`${file}:3: not valid JSON`);
    expect(() => new MetricsLog(file).log({ step: 1.5 })).toThrow("metrics need an integer 'step'");
  });

  test('config diff: changed, added and removed keys, nested keys dotted', () => {
    expect(diffConfigs({ lr: 1, model: 'm', lora: { rank: 8, alpha: 16 }, gone: true }, { lr: 2, model: 'm', lora: { rank: 16, alpha: 16 }, added: [1] })).toEqual([
      { key: 'added', a: undefined, b: [1] },
      { key: 'gone', a: true, b: undefined },
      { key: 'lora.rank', a: 8, b: 16 },
      { key: 'lr', a: 1, b: 2 },
    ]);
    expect(diffConfigs({ a: 1 }, { a: 1 })).toEqual([]);
  });
});

describe('pruning checkpoints', () => {
  const kept = (dir: string) => listRunCheckpoints(dir).map((c) => c.step);

  test('keep last N', () => {
    const dir = makeRun('p1', {}, steps);
    const r = pruneCheckpoints(dir, { keepLast: 2, keepBest: 0, metric: 'eval_accuracy', mode: 'max', dryRun: false });
    expect(r.deleted.map((d) => d.step)).toEqual([100, 200, 300]);
    expect(r.freedBytes).toBe(r.deleted.reduce((s, d) => s + d.bytes, 0));
    expect(kept(dir)).toEqual([400, 500]);
    expect(readdirSync(runPaths(dir).checkpoints).sort()).toEqual(['step-00000400', 'step-00000500']); // nothing half-deleted left
  });

  test('keep last 1 and the best by eval accuracy (max) or by loss (min)', () => {
    const a = makeRun('p2', {}, steps);
    const r = pruneCheckpoints(a, { keepLast: 1, keepBest: 1, metric: 'eval_accuracy', mode: 'max', dryRun: false });
    expect(r.kept).toEqual([
      { step: 200, dir: expect.any(String), reason: ['best 1 by eval_accuracy (max)'], metric: 0.7 },
      { step: 500, dir: expect.any(String), reason: ['last 1'], metric: 0.5 },
    ]);
    expect(kept(a)).toEqual([200, 500]);
    const b = makeRun('p3', {}, steps);
    pruneCheckpoints(b, { keepLast: 0, keepBest: 2, metric: 'loss', mode: 'min', dryRun: false });
    expect(kept(b)).toEqual([300, 400]);
  });

  test('dry run deletes nothing; impossible requests are errors naming the flag or metric', () => {
    const dir = makeRun('p4', {}, steps);
    const r = pruneCheckpoints(dir, { keepLast: 1, keepBest: 0, metric: 'loss', mode: 'min', dryRun: true });
    expect(r.deleted.map((d) => d.step)).toEqual([100, 200, 300, 400]);
    expect(kept(dir)).toEqual([100, 200, 300, 400, 500]);
    expect(() => pruneCheckpoints(dir, { keepLast: 0, keepBest: 0, metric: 'loss', mode: 'min', dryRun: false })).toThrow('--keep_last 0 and --keep_best 0 would delete every checkpoint');
    expect(() => pruneCheckpoints(dir, { keepLast: 1, keepBest: 1, metric: 'reward', mode: 'max', dryRun: false })).toThrow("no checkpoint step has a value of 'reward'");
    expect(existsSync(path.join(dir, 'checkpoints', 'step-00000100'))).toBe(true);
  });
});

/**
 * A run directory at the start of a run: `startRunDir` (a new run refuses an earlier run's files
 * unless overwrite; a failed run's config and base model never survive) and `rewindRunDir` (a
 * resume cuts metrics, evaluations and rollouts back to its checkpoint's step).
 */
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RolloutStore, deleteRolloutsAfter, readEvalRollouts, readTrainRollouts, rewindRunDir, runPaths, startRunDir } from '@lathe/data';

const root = mkdtempSync(join(tmpdir(), 'lathe-run-dir-resume-'));
let n = 0;
const fresh = () => {
  const dir = join(root, `run-${n++}`);
  mkdirSync(dir);
  return dir;
};
const checkpoint = (dir: string, step: number) => {
  const c = join(runPaths(dir).checkpoints, `step-${String(step).padStart(8, '0')}`);
  mkdirSync(c, { recursive: true });
  writeFileSync(join(c, 'trainer_state.json'), JSON.stringify({ step, dataPosition: 0, seed: 0 }));
};

test('startRunDir: an empty or missing folder is fine; an earlier run is refused, naming what is there and the way on', () => {
  startRunDir(join(root, 'missing'), { overwrite: false });
  const dir = fresh();
  startRunDir(dir, { overwrite: false });
  writeFileSync(runPaths(dir).metrics, '{"step":1}\n');
  mkdirSync(runPaths(dir).eval);
  writeFileSync(join(runPaths(dir).eval, 'step-00000000.jsonl'), '{"correct":true}\n');
  expect(() => startRunDir(dir, { overwrite: false })).toThrow(`--run_dir ${dir} holds an earlier run (metrics.jsonl, eval/) with no checkpoint to resume from: pass --overwrite to start over, or choose another --run_dir`);
  checkpoint(dir, 5);
  expect(() => startRunDir(dir, { overwrite: false })).toThrow(`--run_dir ${dir} already holds checkpoints: pass --resume to continue that run, --overwrite to start over, or choose another --run_dir`);
});

test("startRunDir: a failed run's config.yaml and base-model/ are removed; overwrite removes the run's files and nothing else", () => {
  const dir = fresh();
  const p = runPaths(dir);
  mkdirSync(p.baseModel);
  writeFileSync(join(p.baseModel, 'config.json'), '{}');
  writeFileSync(p.config, 'lr: 1\n');
  startRunDir(dir, { overwrite: false });
  expect(readdirSync(dir)).toEqual([]);

  for (const f of [p.metrics, p.rollouts, `${p.rollouts}-wal`, p.config, join(dir, 'notes.txt')]) writeFileSync(f, 'x');
  checkpoint(dir, 3);
  mkdirSync(p.eval);
  writeFileSync(join(p.eval, 'step-00000003.jsonl'), '{}\n');
  mkdirSync(p.baseModel);
  startRunDir(dir, { overwrite: true });
  expect(readdirSync(dir)).toEqual(['notes.txt']);
});

test('rewindRunDir: metrics lines after the step (and a torn last line) go, the rest stay byte for byte; later evaluations go', () => {
  const dir = fresh();
  const p = runPaths(dir);
  const kept = ['{"step":0,"eval_accuracy":0.5}', '{"step":1,"loss":2.0}', '{"loss":1.5,"step":2}'];
  writeFileSync(p.metrics, [...kept, '{"step":3,"loss":1.0}', '{"step":4,"loss":0.9}', '{"step":5,"lo'].join('\n'));
  mkdirSync(p.eval);
  for (const s of [0, 2, 4]) writeFileSync(join(p.eval, `step-${String(s).padStart(8, '0')}.jsonl`), '{"correct":true}\n');
  expect(rewindRunDir(dir, 2)).toEqual({ metricsLines: 3, evalFiles: 1, trainRollouts: 0, evalRollouts: 0 });
  expect(readFileSync(p.metrics, 'utf8')).toBe(kept.map((l) => `${l}\n`).join(''));
  expect(readdirSync(p.eval)).toEqual(['step-00000000.jsonl', 'step-00000002.jsonl']);
  expect(rewindRunDir(dir, 2)).toEqual({ metricsLines: 0, evalFiles: 0, trainRollouts: 0, evalRollouts: 0 }); // idempotent
  expect(readdirSync(dir).filter((f) => f.includes('.tmp-'))).toEqual([]);

  writeFileSync(p.metrics, '{"step":1}\nnot json\n{"step":2}\n');
  expect(() => rewindRunDir(dir, 1)).toThrow(`${p.metrics}:2: not valid JSON`);
});

test('rewindRunDir and deleteRolloutsAfter: the rollouts of later steps go, training and evaluation alike', async () => {
  const dir = fresh();
  const file = runPaths(dir).rollouts;
  const store = await RolloutStore.open(file);
  for (const step of [1, 2, 3, 4]) {
    for (let k = 0; k < 3; k++) store.addTrain({ step, epoch: 0, prompt_index: k, rollout_index: 0, prompt: 'p', completion: `c${step}` });
    if (step % 2 === 0) store.addEval({ step, dataset: 'heldout', prompt_index: 0, rollout_index: 0, prompt: 'p', completion: 'e' });
  }
  await store.close();
  expect(rewindRunDir(dir, 2)).toEqual({ metricsLines: 0, evalFiles: 0, trainRollouts: 6, evalRollouts: 1 });
  expect(readTrainRollouts(file).map((r) => r.step)).toEqual([1, 1, 1, 2, 2, 2]);
  expect(readEvalRollouts(file).map((r) => r.step)).toEqual([2]);
  // rows written after a rewind continue the row ids where the kept rows end, as in an uninterrupted run
  const again = await RolloutStore.open(file);
  again.addTrain({ step: 3, epoch: 0, prompt_index: 0, rollout_index: 0, prompt: 'p', completion: 'c3' });
  await again.close();
  expect(readTrainRollouts(file).map((r) => r.id)).toEqual([1, 2, 3, 4, 5, 6, 7]);
  expect(deleteRolloutsAfter(file, 0)).toEqual({ train: 7, eval: 1 });
  expect(() => deleteRolloutsAfter(join(dir, 'none.sqlite'), 0)).toThrow(`${join(dir, 'none.sqlite')}: cannot open the rollout store (no such file)`);
  expect(existsSync(join(dir, 'none.sqlite'))).toBe(false);
});

import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import Database from 'libsql';
import { inspectRolloutStore, readEvalRollouts, readTrainRollouts, RolloutStore, type TrainRollout } from '@lathe/data';

const dir = mkdtempSync(path.join(tmpdir(), 'lathe-rollouts-'));

const row = (i: number): TrainRollout => ({
  step: Math.floor(i / 4),
  epoch: 1,
  prompt_index: i,
  rollout_index: i % 4,
  prompt: `p${i} ∑`,
  completion: `c${i}`,
  reward: i % 3 === 0 ? null : i / 2,
  advantage: 0.5 - i,
  extra: i % 2 ? { rewards: { math: 1, format: 0.5 }, tokens: [i, i + 1] } : null,
});

describe('RolloutStore', () => {
  test('train and eval rollouts round-trip with nulls and JSON extras; filters by step and dataset', async () => {
    const file = path.join(dir, 'a.sqlite');
    const store = await RolloutStore.open(file, { batchSize: 16 });
    const rows = Array.from({ length: 40 }, (_, i) => row(i));
    for (const r of rows) store.addTrain(r);
    store.addEval({ step: 3, dataset: 'math500', prompt_index: 0, rollout_index: 0, prompt: 'q', completion: 'a', reward: 1, correct: true });
    store.addEval({ step: 3, dataset: 'gsm8k', prompt_index: 1, rollout_index: 2, prompt: 'q2', completion: 'a2', correct: false, extra: { len: 5 } });
    await store.close();
    const back = readTrainRollouts(file);
    expect(back.map(({ id: _id, created_at: _t, ...r }) => r)).toEqual(rows);
    expect(back.map((r) => r.id)).toEqual(rows.map((_, i) => i + 1));
    expect(readTrainRollouts(file, { step: 2 }).map((r) => r.prompt_index)).toEqual([8, 9, 10, 11]);
    expect(readTrainRollouts(file, { minStep: 9, limit: 2 }).map((r) => r.prompt_index)).toEqual([36, 37]);
    const ev = readEvalRollouts(file, { dataset: 'gsm8k' });
    expect(ev.map(({ id: _id, created_at: _t, ...r }) => r)).toEqual([{ step: 3, dataset: 'gsm8k', prompt_index: 1, rollout_index: 2, prompt: 'q2', completion: 'a2', reward: null, correct: false, extra: { len: 5 } }]);
    expect(inspectRolloutStore(file)).toEqual({ train: 40, eval: 2, lastStep: 9, integrity: 'ok' });
  });

  test('rows are written in batches: nothing is committed before a batch fills or flush() is called', async () => {
    const file = path.join(dir, 'b.sqlite');
    const store = await RolloutStore.open(file, { batchSize: 10, flushIntervalMs: 0 });
    for (let i = 0; i < 9; i++) store.addTrain(row(i));
    expect(store.queued).toBe(9);
    await new Promise((r) => setTimeout(r, 100));
    expect(inspectRolloutStore(file).train).toBe(0);
    store.addTrain(row(9)); // the 10th row hands the batch to the writer thread
    expect(store.queued).toBe(0);
    for (let i = 10; i < 13; i++) store.addTrain(row(i));
    await store.flush();
    expect(store.committed).toBe(13);
    expect(inspectRolloutStore(file).train).toBe(13);
    await store.close();
    // close() checkpoints the write-ahead log into the database file.
    expect(!existsSync(`${file}-wal`) || statSync(`${file}-wal`).size === 0).toBe(true);
  });

  test('the interval hands over partial batches', async () => {
    const file = path.join(dir, 'c.sqlite');
    const store = await RolloutStore.open(file, { batchSize: 1000, flushIntervalMs: 50 });
    store.addTrain(row(0));
    const deadline = Date.now() + 5000;
    while (store.committed === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(store.committed).toBe(1);
    await store.close();
  });

  test('reopening appends; the database is in WAL mode', async () => {
    const file = path.join(dir, 'd.sqlite');
    for (let round = 0; round < 2; round++) {
      const store = await RolloutStore.open(file);
      store.addTrain(row(round));
      await store.close();
    }
    expect(readTrainRollouts(file).map((r) => r.prompt_index)).toEqual([0, 1]);
    const db = new Database(file);
    expect((db.prepare('PRAGMA journal_mode').raw(true).get() as unknown[])[0]).toBe('wal');
    db.close();
  });

  test('bad rows and bad files give errors naming the file and field', async () => {
    const file = path.join(dir, 'e.sqlite');
    const store = await RolloutStore.open(file);
    expect(() => store.addTrain({ ...row(0), step: 1.5 })).toThrow(`${file}: train rollout field 'step' must be an integer, got 1.5`);
    expect(() => store.addEval({ step: 0, dataset: 'x', prompt_index: 0, rollout_index: 0, prompt: 'p', completion: 3 as unknown as string })).toThrow(`${file}: eval rollout fields 'prompt' and 'completion' must be strings`);
    await store.close();
    expect(() => store.addTrain(row(0))).toThrow(`${file}: the rollout store is closed`);
    const db = new Database(file);
    db.exec('PRAGMA user_version = 99');
    db.close();
    await expect(RolloutStore.open(file)).rejects.toThrow(`${file}: cannot open the rollout store (schema version 99, this Lathe writes version 1)`);
    await expect(RolloutStore.open(path.join(dir, 'no/such/dir/x.sqlite'))).rejects.toThrow(/no\/such\/dir\/x\.sqlite: cannot open the rollout store/);
    expect(() => readTrainRollouts(path.join(dir, 'absent.sqlite'))).toThrow(/absent\.sqlite: cannot open the rollout store/);
  });
});

/**
 * Starts a writer process, waits until it reports `minCommits` committed batches, kills it with
 * SIGKILL and returns the last committed count it reported.
 */
const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

function writeThenKill(file: string, batch: number, payload: number, minCommits: number): Promise<number> {
  // One process (tsx as a loader, not its CLI, which would run the script in a grandchild the kill misses).
  const tsx = pathToFileURL(require.resolve('tsx')).href;
  const child = spawn(process.execPath, ['--import', tsx, '--conditions=lathe-source', path.join(__dirname, 'helpers/rollout-writer.ts'), file, String(batch), String(payload)], { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let acked = 0;
  let commits = 0;
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve, reject) => {
    let buffer = '';
    child.stdout.on('data', (d: Buffer) => {
      buffer += d.toString();
      const lines = buffer.split('\n');
      buffer = lines.pop()!;
      for (const l of lines) {
        const m = /^committed (\d+)$/.exec(l);
        if (!m) continue;
        acked = Number(m[1]);
        if (++commits === minCommits) child.kill('SIGKILL');
      }
    });
    // 'close': after the exit and the end of its output, so every acknowledgement it printed is counted.
    child.on('close', (code, signal) => (signal === 'SIGKILL' ? resolve(acked) : reject(new Error(`writer exited with ${code}: ${stderr}`))));
  });
}

describe('a writer killed with SIGKILL mid-write', () => {
  test.each([
    ['small rows', 100, 64, 12],
    ['4 MB transactions (the kill lands inside one)', 200, 20_000, 3],
  ])('%s: the database is intact and holds every acknowledged batch, and at most the one in flight beyond', async (_name, batch, payload, commits) => {
    const file = path.join(dir, `kill-${batch}.sqlite`);
    const acked = await writeThenKill(file, batch, payload, commits);
    expect(acked).toBeGreaterThanOrEqual(commits * batch);
    const info = inspectRolloutStore(file);
    expect(info.integrity).toBe('ok');
    expect(info.train).toBeGreaterThanOrEqual(acked);
    expect(info.train).toBeLessThanOrEqual(acked + batch);
    expect(info.train % batch).toBe(0); // whole batches only: a batch is one transaction
    const rows = readTrainRollouts(file);
    expect(rows.map((r) => r.prompt_index)).toEqual(rows.map((_, i) => i));
    expect(rows.every((r) => r.completion.length === `${r.prompt_index}:`.length + payload && r.extra?.i === r.prompt_index)).toBe(true);
    // The file stays writable after the crash.
    const store = await RolloutStore.open(file);
    store.addTrain(row(0));
    await store.close();
    expect(inspectRolloutStore(file).train).toBe(info.train + 1);
  }, 60_000);
});

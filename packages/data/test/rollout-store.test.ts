import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import Database from 'libsql';
import { countRollouts, inspectRolloutStore, readEvalRollouts, readTrainRollouts, rolloutById, rolloutGroup, ROLLOUT_SCHEMA_VERSION, RolloutStore, type TrainRollout } from '@lathe/data';

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
    expect(countRollouts(file)).toEqual({ train: 40, eval: 2, lastStep: 9, datasets: ['gsm8k', 'math500'] });
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
    await expect(RolloutStore.open(file)).rejects.toThrow(`${file}: cannot open the rollout store (schema version 99, this Lathe writes version ${ROLLOUT_SCHEMA_VERSION})`);
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

describe('per-token values (schema version 2)', () => {
  const V1 = `
CREATE TABLE train_rollouts (id INTEGER PRIMARY KEY, step INTEGER NOT NULL, epoch INTEGER NOT NULL, prompt_index INTEGER NOT NULL, rollout_index INTEGER NOT NULL, prompt TEXT NOT NULL, completion TEXT NOT NULL, reward REAL, advantage REAL, extra TEXT, created_at REAL NOT NULL);
CREATE TABLE eval_rollouts (id INTEGER PRIMARY KEY, step INTEGER NOT NULL, dataset TEXT NOT NULL, prompt_index INTEGER NOT NULL, rollout_index INTEGER NOT NULL, prompt TEXT NOT NULL, completion TEXT NOT NULL, reward REAL, correct INTEGER, extra TEXT, created_at REAL NOT NULL);
INSERT INTO train_rollouts VALUES (1, 0, 0, 7, 0, 'p', 'c', 1.0, 0.5, '{"tokens":[1,2]}', 0);
PRAGMA user_version = 1;`;

  test('log-probs and entropies round-trip as float32 per token; rows without them read none', async () => {
    const file = path.join(dir, 'values.sqlite');
    const store = await RolloutStore.open(file);
    const logprobs = [-0.1, -2.5, -1e-7, -30.123456789];
    store.addTrain({ ...row(0), logprobs, entropies: Float32Array.from([0.5, 1.25, 0, 3.3]) });
    store.addTrain(row(1));
    store.addEval({ step: 0, dataset: 'd', prompt_index: 0, rollout_index: 0, prompt: 'q', completion: 'a', logprobs: [-1, -2] });
    await store.close();
    const [a, b] = readTrainRollouts(file);
    expect(a.logprobs).toEqual(logprobs.map(Math.fround));
    expect(a.entropies).toEqual([0.5, 1.25, 0, Math.fround(3.3)]);
    expect(b.logprobs).toBeUndefined();
    expect(b.entropies).toBeUndefined();
    expect(readEvalRollouts(file)[0].logprobs).toEqual([-1, -2]);
    expect(rolloutById(file, 'train', a.id)).toMatchObject({ logprobs: logprobs.map(Math.fround), entropies: [0.5, 1.25, 0, Math.fround(3.3)] });
    expect(rolloutById(file, 'train', b.id)).toMatchObject({ logprobs: null, entropies: null });
    expect(rolloutGroup(file, 'train', 0, 0)[0].logprobs).toEqual(logprobs.map(Math.fround));
    const db = new Database(file, { readonly: true });
    // base64 of 4 float32 bytes a token: 16 bytes, 24 characters
    expect(db.prepare('SELECT length(logprobs) FROM train_rollouts WHERE id = ?').raw(true).get(a.id)).toEqual([24]);
    db.close();
    const bad = await RolloutStore.open(path.join(dir, 'bad-values.sqlite'));
    expect(() => bad.addTrain({ ...row(0), logprobs: 3 as unknown as number[] })).toThrow(/train rollout field 'logprobs' must be a list of numbers, got 3/);
    await bad.close();
  });

  test('a version-1 store still opens: readers find no values; a writer adds the columns and keeps the old rows', async () => {
    const file = path.join(dir, 'v1.sqlite');
    const db = new Database(file);
    db.exec(V1);
    db.close();
    expect(readTrainRollouts(file)).toEqual([{ id: 1, step: 0, epoch: 0, prompt_index: 7, rollout_index: 0, prompt: 'p', completion: 'c', reward: 1, advantage: 0.5, extra: { tokens: [1, 2] }, created_at: 0 }]);
    expect(rolloutById(file, 'train', 1)).toMatchObject({ id: 1, logprobs: null, entropies: null, length: 2 });
    expect(rolloutGroup(file, 'train', 0, 7).map((r) => r.logprobs)).toEqual([null]);
    const store = await RolloutStore.open(file);
    store.addTrain({ ...row(4), logprobs: [-0.5] });
    await store.close();
    const back = readTrainRollouts(file);
    expect(back.map((r) => [r.id, r.logprobs])).toEqual([[1, undefined], [2, [-0.5]]]);
    const after = new Database(file, { readonly: true });
    expect(after.prepare('PRAGMA user_version').raw(true).get()).toEqual([ROLLOUT_SCHEMA_VERSION]);
    after.close();
    expect(ROLLOUT_SCHEMA_VERSION).toBe(2);
  });
});

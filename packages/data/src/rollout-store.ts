/**
 * The rollout store: every training and evaluation rollout of a run in one SQLite file
 * (`runs/<name>/rollouts.sqlite`), through libsql (SQLite with a prebuilt binary shipped as an npm
 * package; no install scripts). Writes are batched and run on a worker thread, each batch one
 * transaction, so the training loop only queues rows. The database is in WAL mode: a crash (even
 * kill -9) loses only the batches not yet committed and never corrupts the file.
 */
import { existsSync } from 'node:fs';
import { Worker } from 'node:worker_threads';
import { createRequire } from 'node:module';
import type Database from 'libsql';

/** What every stored rollout holds: a sampled completion of a prompt at a step. */
export interface StoredRollout {
  step: number;
  /** Index of the prompt in the dataset. */
  prompt_index: number;
  /** Index of this sample among the prompt's group. */
  rollout_index: number;
  prompt: string;
  completion: string;
  reward?: number | null;
  /** Anything else (per-source rewards, lengths, token ids…), stored as JSON. */
  extra?: Record<string, unknown> | null;
  /** Per completion token: the log-prob of the sampled token under the policy that sampled it (stored as base64 of float32). */
  logprobs?: ArrayLike<number> | null;
  /** Per completion token: the entropy of that policy's next-token distribution, where it was computed (stored as float32). */
  entropies?: ArrayLike<number> | null;
}

/** One training rollout. */
export interface TrainRollout extends StoredRollout {
  epoch: number;
  advantage?: number | null;
}

/** One evaluation rollout. */
export interface EvalRollout extends StoredRollout {
  /** The evaluation set's name (e.g. `math500`). */
  dataset: string;
  correct?: boolean | null;
}

/** Options of {@link RolloutStore.open}. */
export interface RolloutStoreOptions {
  /** Rows per batch: a batch is handed to the writer thread when this many are queued (default 256). */
  batchSize?: number;
  /** Also hand over whatever is queued every this many milliseconds (default 2000; 0: only by size). */
  flushIntervalMs?: number;
  /**
   * `normal` (default): commits survive a crash of the process (kill -9 included); `full`: also a
   * power loss (an fsync per batch).
   */
  durability?: 'normal' | 'full';
}

/**
 * SQL of the two tables; `PRAGMA user_version` holds the schema version. Version 2 added the
 * per-token `logprobs` and `entropies` columns; a version-1 store gains them when a writer opens it,
 * and readers treat their absence as no values.
 */
export const ROLLOUT_SCHEMA_VERSION = 2;
const SCHEMA = `
CREATE TABLE IF NOT EXISTS train_rollouts (
  id INTEGER PRIMARY KEY,
  step INTEGER NOT NULL,
  epoch INTEGER NOT NULL,
  prompt_index INTEGER NOT NULL,
  rollout_index INTEGER NOT NULL,
  prompt TEXT NOT NULL,
  completion TEXT NOT NULL,
  reward REAL,
  advantage REAL,
  extra TEXT,
  created_at REAL NOT NULL,
  logprobs TEXT,
  entropies TEXT
);
CREATE INDEX IF NOT EXISTS train_rollouts_step ON train_rollouts (step);
CREATE TABLE IF NOT EXISTS eval_rollouts (
  id INTEGER PRIMARY KEY,
  step INTEGER NOT NULL,
  dataset TEXT NOT NULL,
  prompt_index INTEGER NOT NULL,
  rollout_index INTEGER NOT NULL,
  prompt TEXT NOT NULL,
  completion TEXT NOT NULL,
  reward REAL,
  correct INTEGER,
  extra TEXT,
  created_at REAL NOT NULL,
  logprobs TEXT,
  entropies TEXT
);
CREATE INDEX IF NOT EXISTS eval_rollouts_step ON eval_rollouts (step, dataset);
PRAGMA user_version = ${ROLLOUT_SCHEMA_VERSION};
`;

// The writer thread's code. It is plain JavaScript run with `eval: true`, so it works the same from
// TypeScript sources (jest, tsx) and from the built package.
const WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
const Database = require(workerData.libsql);
let db;
try {
  db = new Database(workerData.file);
  // The wait first: after a crash, setting WAL mode can meet a reader still recovering the log.
  db.pragma('busy_timeout = 10000');
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = ' + (workerData.durability === 'full' ? 'FULL' : 'NORMAL'));
  const version = db.prepare('PRAGMA user_version').raw(true).get()[0];
  if (version > workerData.version) throw new Error('schema version ' + version + ', this Lathe writes version ' + workerData.version);
  db.exec(workerData.schema);
  // an older store: the columns added since, at the end of each table (additive, so old readers still read it)
  for (const table of ['train_rollouts', 'eval_rollouts']) {
    const have = new Set(db.prepare('PRAGMA table_info(' + table + ')').all().map((c) => c.name));
    for (const c of ['logprobs', 'entropies']) if (!have.has(c)) db.exec('ALTER TABLE ' + table + ' ADD COLUMN ' + c + ' TEXT');
  }
} catch (e) {
  parentPort.postMessage({ type: 'error', id: -1, message: e && e.message ? e.message : String(e) });
  process.exit(0);
}
const insTrain = db.prepare('INSERT INTO train_rollouts (step, epoch, prompt_index, rollout_index, prompt, completion, reward, advantage, extra, created_at, logprobs, entropies) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)');
const insEval = db.prepare('INSERT INTO eval_rollouts (step, dataset, prompt_index, rollout_index, prompt, completion, reward, correct, extra, created_at, logprobs, entropies) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)');
const num = (v) => (v === undefined || v === null || Number.isNaN(v) ? null : v);
const json = (v) => (v === undefined || v === null ? null : JSON.stringify(v));
// per-token values as base64 of little-endian float32 (4 bytes a token; this libsql cannot bind BLOBs)
const f32 = (v) => (v === undefined || v === null ? null : Buffer.from(Float32Array.from(v).buffer).toString('base64'));
const write = db.transaction((train, evals, t) => {
  for (const r of train) insTrain.run(r.step, r.epoch, r.prompt_index, r.rollout_index, r.prompt, r.completion, num(r.reward), num(r.advantage), json(r.extra), t, f32(r.logprobs), f32(r.entropies));
  for (const r of evals) insEval.run(r.step, r.dataset, r.prompt_index, r.rollout_index, r.prompt, r.completion, num(r.reward), r.correct === undefined || r.correct === null ? null : r.correct ? 1 : 0, json(r.extra), t, f32(r.logprobs), f32(r.entropies));
});
parentPort.on('message', (m) => {
  if (m.type === 'write') {
    try {
      write(m.train, m.evals, Date.now() / 1000);
      parentPort.postMessage({ type: 'committed', id: m.id, rows: m.train.length + m.evals.length });
    } catch (e) {
      parentPort.postMessage({ type: 'error', id: m.id, message: e && e.message ? e.message : String(e) });
    }
  } else if (m.type === 'close') {
    try { db.pragma('wal_checkpoint(TRUNCATE)'); db.close(); } catch (e) { /* closing anyway */ }
    parentPort.postMessage({ type: 'closed' });
  }
});
parentPort.postMessage({ type: 'ready' });
`;

type WorkerMessage = { type: 'ready' } | { type: 'closed' } | { type: 'committed'; id: number; rows: number } | { type: 'error'; id: number; message: string };

function checkRow(r: TrainRollout | EvalRollout, kind: string, file: string): void {
  for (const k of ['step', 'prompt_index', 'rollout_index'] as const) {
    if (!Number.isInteger(r[k])) throw new Error(`${file}: ${kind} rollout field '${k}' must be an integer, got ${JSON.stringify(r[k])}`);
  }
  if (typeof r.prompt !== 'string' || typeof r.completion !== 'string') throw new Error(`${file}: ${kind} rollout fields 'prompt' and 'completion' must be strings`);
  for (const k of ['logprobs', 'entropies'] as const) {
    const v = r[k];
    if (v !== undefined && v !== null && (typeof v !== 'object' || typeof v.length !== 'number')) throw new Error(`${file}: ${kind} rollout field '${k}' must be a list of numbers, got ${JSON.stringify(v)}`);
  }
}

/**
 * Writes rollouts to a SQLite file off the caller's thread. `addTrain`/`addEval` only queue; a
 * batch is committed (one transaction) when `batchSize` rows are queued, every `flushIntervalMs`,
 * on `flush()` and on `close()`. A row is durable once the `flush()` after it has resolved.
 *
 * ```ts
 * const store = await RolloutStore.open('runs/grpo/rollouts.sqlite');
 * store.addTrain({ step, epoch, prompt_index, rollout_index, prompt, completion, reward, advantage });
 * await store.close();
 * ```
 */
export class RolloutStore {
  private train: TrainRollout[] = [];
  private evals: EvalRollout[] = [];
  private nextId = 0;
  private waiting = new Map<number, { resolve: () => void; reject: (e: Error) => void }>();
  private inflight = new Map<number, Promise<void>>();
  private failure: Error | null = null;
  private timer: NodeJS.Timeout | null = null;
  private closed = false;
  /** Rows committed to the database so far (by this store). */
  committed = 0;

  private constructor(
    /** The database file. */
    readonly file: string,
    private readonly worker: Worker,
    private readonly batchSize: number,
  ) {}

  /** Opens (creating if needed) a rollout database and starts its writer thread. */
  static async open(file: string, options: RolloutStoreOptions = {}): Promise<RolloutStore> {
    const batchSize = options.batchSize ?? 256;
    if (!Number.isInteger(batchSize) || batchSize < 1) throw new Error(`RolloutStore: batchSize must be a positive integer, got ${batchSize}`);
    const worker = new Worker(WORKER, {
      eval: true,
      workerData: { file, libsql: require.resolve('libsql'), durability: options.durability ?? 'normal', schema: SCHEMA, version: ROLLOUT_SCHEMA_VERSION },
    });
    const store = new RolloutStore(file, worker, batchSize);
    await new Promise<void>((resolve, reject) => {
      const onMessage = (m: WorkerMessage) => {
        worker.off('message', onMessage);
        worker.off('error', onError);
        if (m.type === 'ready') resolve();
        else reject(new Error(`${file}: cannot open the rollout store (${m.type === 'error' ? m.message : m.type})`));
      };
      const onError = (e: Error) => reject(new Error(`${file}: the rollout writer failed to start (${e.message})`));
      worker.on('message', onMessage);
      worker.once('error', onError);
    });
    worker.on('message', (m: WorkerMessage) => store.onMessage(m));
    worker.on('error', (e) => store.fail(new Error(`${file}: the rollout writer thread failed (${e.message})`)));
    worker.unref();
    const every = options.flushIntervalMs ?? 2000;
    if (every > 0) {
      store.timer = setInterval(() => store.handOver(), every);
      store.timer.unref();
    }
    return store;
  }

  private onMessage(m: WorkerMessage): void {
    if (m.type === 'committed' || m.type === 'error') {
      const w = this.waiting.get(m.id);
      this.waiting.delete(m.id);
      this.inflight.delete(m.id);
      if (this.waiting.size === 0) this.worker.unref();
      if (m.type === 'committed') {
        this.committed += m.rows;
        w?.resolve();
      } else {
        const e = new Error(`${this.file}: a batch of rollouts was not written (${m.message})`);
        this.failure ??= e;
        w?.reject(e);
      }
    }
  }

  private fail(e: Error): void {
    this.failure ??= e;
    for (const w of this.waiting.values()) w.reject(e);
    this.waiting.clear();
    this.inflight.clear();
  }

  private check(): void {
    if (this.failure) throw this.failure;
    if (this.closed) throw new Error(`${this.file}: the rollout store is closed`);
  }

  /** Hands the queued rows to the writer thread as one batch; resolves when it is committed. */
  private handOver(): Promise<void> {
    if (this.train.length === 0 && this.evals.length === 0) return Promise.resolve();
    const id = this.nextId++;
    const msg = { type: 'write', id, train: this.train, evals: this.evals };
    this.train = [];
    this.evals = [];
    const done = new Promise<void>((resolve, reject) => this.waiting.set(id, { resolve, reject }));
    done.catch(() => undefined); // surfaced by the next add/flush/close
    this.inflight.set(id, done);
    this.worker.ref();
    this.worker.postMessage(msg);
    return done;
  }

  /** Queues a training rollout (committed with its batch). */
  addTrain(row: TrainRollout): void {
    this.check();
    checkRow(row, 'train', this.file);
    if (!Number.isInteger(row.epoch)) throw new Error(`${this.file}: train rollout field 'epoch' must be an integer, got ${JSON.stringify(row.epoch)}`);
    this.train.push(row);
    if (this.train.length + this.evals.length >= this.batchSize) void this.handOver();
  }

  /** Queues an evaluation rollout. */
  addEval(row: EvalRollout): void {
    this.check();
    checkRow(row, 'eval', this.file);
    if (typeof row.dataset !== 'string') throw new Error(`${this.file}: eval rollout field 'dataset' must be a string`);
    this.evals.push(row);
    if (this.train.length + this.evals.length >= this.batchSize) void this.handOver();
  }

  /** Rows queued and not yet handed to the writer. */
  get queued(): number {
    return this.train.length + this.evals.length;
  }

  /** Commits everything queued so far; resolves when all of it is in the database. */
  async flush(): Promise<void> {
    this.check();
    void this.handOver();
    await Promise.allSettled([...this.inflight.values()]);
    if (this.failure) throw this.failure;
  }

  /** Commits what is queued, checkpoints the WAL into the database file and stops the writer. */
  async close(): Promise<void> {
    if (this.closed) return;
    if (this.timer) clearInterval(this.timer);
    try {
      await this.flush();
    } finally {
      this.closed = true;
      this.worker.ref();
      await new Promise<void>((resolve) => {
        const onClosed = (m: WorkerMessage) => {
          if (m.type === 'closed') resolve();
        };
        this.worker.on('message', onClosed);
        this.worker.once('exit', () => resolve());
        this.worker.postMessage({ type: 'close' });
      });
      await this.worker.terminate();
    }
  }
}

/** A training rollout read back, with its row id and commit time (seconds since the epoch); per-token values only where stored. */
export interface StoredTrainRollout extends TrainRollout {
  id: number;
  created_at: number;
  logprobs?: number[];
  entropies?: number[];
}

/** An evaluation rollout read back. */
export interface StoredEvalRollout extends EvalRollout {
  id: number;
  created_at: number;
  logprobs?: number[];
  entropies?: number[];
}

/** libsql, loaded on first use: the Parquet and JSONL parts of this package never load the native binary. */
function libsql(): typeof Database {
  return createRequire(__filename)('libsql') as typeof Database;
}

/** Opens an existing store (read-only unless `write`); a missing or unreadable file is an error naming it. */
function openStore(file: string, write = false): Database.Database {
  if (!existsSync(file)) throw new Error(`${file}: cannot open the rollout store (no such file)`);
  try {
    const Sqlite = libsql();
    const db = new Sqlite(file, write ? { fileMustExist: true } : { readonly: true, fileMustExist: true });
    db.pragma('busy_timeout = 10000'); // wait out a writer's checkpoint instead of failing
    return db;
  } catch (e) {
    throw new Error(`${file}: cannot open the rollout store (${(e as Error).message})`);
  }
}

type Filter = { step?: number; minStep?: number; maxStep?: number; limit?: number };

function where(f: Filter, dataset?: string): { sql: string; args: (string | number)[] } {
  const parts: string[] = [];
  const args: (string | number)[] = [];
  for (const [value, sql] of [[dataset, 'dataset = ?'], [f.step, 'step = ?'], [f.minStep, 'step >= ?'], [f.maxStep, 'step <= ?']] as const) {
    if (value === undefined) continue;
    parts.push(sql);
    args.push(value);
  }
  const sql = `${parts.length ? ` WHERE ${parts.join(' AND ')}` : ''} ORDER BY id${f.limit !== undefined ? ` LIMIT ${Math.floor(f.limit)}` : ''}`;
  return { sql, args };
}

/** A per-token column's values: base64 of little-endian float32 (null when the row, or a version-1 store, has none). */
export function tokenValues(text: unknown): number[] | null {
  if (typeof text !== 'string') return null;
  const bytes = new Uint8Array(Buffer.from(text, 'base64')); // a fresh, aligned copy
  if (bytes.byteLength % 4 !== 0) return null;
  return Array.from(new Float32Array(bytes.buffer, 0, bytes.byteLength / 4));
}

/** The per-token columns a table of an open store has (none in a version-1 store). */
export function tokenValueColumns(db: Database.Database, table: string): string[] {
  const have = new Set((db.prepare(`PRAGMA table_info(${table})`).all() as { name: string }[]).map((c) => c.name));
  return ['logprobs', 'entropies'].filter((c) => have.has(c));
}

/** The rows of one table that pass a filter, oldest first, keyed by column, with `extra` parsed from its JSON and the per-token values decoded. */
function selectRollouts(file: string, table: string, columns: string, filter: { sql: string; args: (string | number)[] }): Record<string, unknown>[] {
  const db = openStore(file);
  try {
    const extra = tokenValueColumns(db, table).map((c) => `, ${c}`).join('');
    const rows = db.prepare(`SELECT ${columns}${extra} FROM ${table}${filter.sql}`).all(...filter.args) as Record<string, unknown>[];
    return rows.map(({ logprobs, entropies, ...r }) => {
      const [lp, ent] = [tokenValues(logprobs), tokenValues(entropies)];
      return { ...r, extra: typeof r.extra === 'string' ? (JSON.parse(r.extra) as Record<string, unknown>) : null, ...(lp ? { logprobs: lp } : {}), ...(ent ? { entropies: ent } : {}) };
    });
  } finally {
    db.close();
  }
}

/** Training rollouts from a store file, oldest first (optionally for one step or a range). */
export function readTrainRollouts(file: string, filter: Filter = {}): StoredTrainRollout[] {
  const columns = 'id, step, epoch, prompt_index, rollout_index, prompt, completion, reward, advantage, extra, created_at';
  return selectRollouts(file, 'train_rollouts', columns, where(filter)) as unknown as StoredTrainRollout[];
}

/** Evaluation rollouts from a store file, oldest first. */
export function readEvalRollouts(file: string, filter: Filter & { dataset?: string } = {}): StoredEvalRollout[] {
  const columns = 'id, step, dataset, prompt_index, rollout_index, prompt, completion, reward, correct, extra, created_at';
  const rows = selectRollouts(file, 'eval_rollouts', columns, where(filter, filter.dataset));
  // SQLite has no booleans: `correct` is stored as 1, 0 or NULL
  return rows.map((r) => ({ ...r, correct: r.correct === null ? null : r.correct === 1 })) as unknown as StoredEvalRollout[];
}

/**
 * Deletes the training and evaluation rollouts of steps after `step`, in one transaction: what a
 * run wrote after the checkpoint a resume starts from (see `rewindRunDir`). Call it while no
 * {@link RolloutStore} has the file open. Returns the rows deleted.
 */
export function deleteRolloutsAfter(file: string, step: number): { train: number; eval: number } {
  if (!Number.isInteger(step)) throw new Error(`${file}: deleteRolloutsAfter needs an integer step, got ${step}`);
  const db = openStore(file, true);
  try {
    // a store that a crash cut short before its first commit may lack the tables
    const tables = new Set((db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").raw(true).all() as unknown[][]).map((r) => r[0]));
    const from = (table: string) => (tables.has(table) ? db.prepare(`DELETE FROM ${table} WHERE step > ?`).run(step).changes : 0);
    return db.transaction(() => ({ train: from('train_rollouts'), eval: from('eval_rollouts') }))();
  } catch (e) {
    throw new Error(`${file}: cannot delete the rollouts after step ${step} (${(e as Error).message})`);
  } finally {
    db.close();
  }
}

/** The first column of a query's first row. */
const firstValue = (db: Database.Database, sql: string) => (db.prepare(sql).raw(true).get() as unknown[])[0];

/** An open store's training and evaluation row counts and its last training step. */
export function rolloutCounts(db: Database.Database): { train: number; eval: number; lastStep: number | null } {
  return {
    train: firstValue(db, 'SELECT count(*) FROM train_rollouts') as number,
    eval: firstValue(db, 'SELECT count(*) FROM eval_rollouts') as number,
    lastStep: firstValue(db, 'SELECT max(step) FROM train_rollouts') as number | null,
  };
}

/** Row counts and SQLite's own integrity verdict (`ok` when the file is sound). */
export function inspectRolloutStore(file: string): { train: number; eval: number; lastStep: number | null; integrity: string } {
  const db = openStore(file);
  try {
    return { ...rolloutCounts(db), integrity: firstValue(db, 'PRAGMA integrity_check') as string };
  } finally {
    db.close();
  }
}

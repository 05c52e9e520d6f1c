/**
 * Paged, filtered reads of a rollout store for browsing (Lathe Studio): every filter and the page
 * are applied in SQL, so a store of any size answers a page without loading the rest.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import type Database from 'libsql';
import { rolloutCounts, tokenValueColumns, tokenValues } from './rollout-store';

/** Which table: training rollouts or evaluation rollouts. */
export type RolloutTable = 'train' | 'eval';

/** The columns a page can be sorted by. */
export const ROLLOUT_SORTS = ['step', 'reward', 'advantage', 'length'] as const;
/** A sort key of {@link RolloutQuery}. */
export type RolloutSort = (typeof ROLLOUT_SORTS)[number];

/** Filters and page of {@link queryRollouts}; absent fields do not filter. */
export interface RolloutQuery {
  table: RolloutTable;
  step?: number;
  minStep?: number;
  maxStep?: number;
  promptIndex?: number;
  /** Evaluation set name (eval table only). */
  dataset?: string;
  /** Case-insensitive substring of the prompt. */
  prompt?: string;
  /** Case-insensitive substring of the completion. */
  completion?: string;
  minReward?: number;
  maxReward?: number;
  /** Advantage bounds (train table only). */
  minAdvantage?: number;
  maxAdvantage?: number;
  /** Bounds on the completion's length in tokens (characters where a row stores no token ids). */
  minLength?: number;
  maxLength?: number;
  /** Sort key of the page (default 'step': step, prompt, sample); rows without the key (a null reward) come last either way. */
  sort?: RolloutSort;
  /** Descending instead of ascending (ties keep the step, prompt, sample order). */
  desc?: boolean;
  /** Rows to skip (default 0). */
  offset?: number;
  /** Rows per page (default 50, at most 1000). */
  limit?: number;
}

/** One row of a page: the prompt and completion cut to their first `preview` characters. */
export interface RolloutRow {
  id: number;
  step: number;
  prompt_index: number;
  rollout_index: number;
  /** Evaluation set (eval rows) or null. */
  dataset: string | null;
  prompt: string;
  completion: string;
  reward: number | null;
  /** Train rows' advantage (null for eval rows). */
  advantage: number | null;
  /** Eval rows' verdict (null for train rows or ungraded). */
  correct: boolean | null;
  /** Completion length in tokens (characters where no token ids were stored). */
  length: number;
}

/** One page and the number of rows that pass the filters. */
export interface RolloutPage {
  total: number;
  offset: number;
  rows: RolloutRow[];
}

/** A full row with its parsed `extra` and per-token values (null where none were stored, as in a version-1 store). */
export interface RolloutDetail extends RolloutRow {
  extra: Record<string, unknown> | null;
  logprobs: number[] | null;
  entropies: number[] | null;
}

const LENGTH = "coalesce(json_array_length(extra, '$.tokens'), length(completion))";

function open(file: string): Database.Database {
  if (!existsSync(file)) throw new Error(`${file}: cannot open the rollout store (no such file)`);
  try {
    const Sqlite = createRequire(__filename)('libsql') as typeof Database;
    const db = new Sqlite(file, { readonly: true, fileMustExist: true });
    db.pragma('busy_timeout = 10000');
    return db;
  } catch (e) {
    throw new Error(`${file}: cannot open the rollout store (${(e as Error).message})`);
  }
}

function withStore<T>(file: string, f: (db: Database.Database) => T): T {
  const db = open(file);
  try {
    return f(db);
  } catch (e) {
    const msg = (e as Error).message;
    throw new Error(msg.startsWith(file) ? msg : `${file}: cannot read the rollout store (${msg})`);
  } finally {
    db.close();
  }
}

function whereOf(q: RolloutQuery): { sql: string; args: (string | number)[] } {
  const parts: string[] = [];
  const args: (string | number)[] = [];
  const add = (v: string | number | undefined, sql: string) => {
    if (v === undefined) return;
    if (typeof v === 'number' && !Number.isFinite(v)) throw new Error(`rollout filter '${sql}': expected a finite number, got ${v}`);
    parts.push(sql);
    args.push(v);
  };
  add(q.step, 'step = ?');
  add(q.minStep, 'step >= ?');
  add(q.maxStep, 'step <= ?');
  add(q.promptIndex, 'prompt_index = ?');
  if (q.table === 'eval') add(q.dataset, 'dataset = ?');
  add(q.prompt && `%${q.prompt}%`, 'prompt LIKE ?');
  add(q.completion && `%${q.completion}%`, 'completion LIKE ?');
  add(q.minReward, 'reward >= ?');
  add(q.maxReward, 'reward <= ?');
  if (q.table === 'train') {
    add(q.minAdvantage, 'advantage >= ?');
    add(q.maxAdvantage, 'advantage <= ?');
  }
  add(q.minLength, `${LENGTH} >= ?`);
  add(q.maxLength, `${LENGTH} <= ?`);
  return { sql: parts.length ? ` WHERE ${parts.join(' AND ')}` : '', args };
}

function columns(table: RolloutTable, preview: number | null): string {
  const text = (c: string) => (preview === null ? c : `substr(${c}, 1, ${preview}) AS ${c}`);
  const own = table === 'train' ? 'NULL AS dataset, advantage, NULL AS correct' : 'dataset, NULL AS advantage, correct';
  return `id, step, prompt_index, rollout_index, ${text('prompt')}, ${text('completion')}, reward, ${own}, ${LENGTH} AS length`;
}

const tableName = (t: RolloutTable) => {
  if (t !== 'train' && t !== 'eval') throw new Error(`rollout table: expected 'train' or 'eval', got ${JSON.stringify(t)}`);
  return t === 'train' ? 'train_rollouts' : 'eval_rollouts';
};

/** The ORDER BY of a page: the key (nulls last), then the store's own order as the tie-break. */
function orderOf(q: RolloutQuery): string {
  const sort = q.sort ?? 'step';
  if (!(ROLLOUT_SORTS as readonly string[]).includes(sort)) throw new Error(`rollout sort: expected one of ${ROLLOUT_SORTS.join(', ')}, got ${JSON.stringify(sort)}`);
  const base = 'step, prompt_index, rollout_index, id';
  const dir = q.desc ? 'DESC' : 'ASC';
  if (sort === 'step') return `ORDER BY step ${dir}, prompt_index, rollout_index, id`;
  // eval rows have no advantage: the key is NULL for all and the store's order stands
  const key = sort === 'length' ? LENGTH : sort === 'advantage' && q.table === 'eval' ? 'NULL' : sort;
  return `ORDER BY ${key} IS NULL, ${key} ${dir}, ${base}`;
}

const toRow = (r: Record<string, unknown>): RolloutRow => ({ ...(r as unknown as RolloutRow), correct: r.correct === null || r.correct === undefined ? null : r.correct === 1 });

/**
 * One page of rollouts passing `q`, in (step, prompt, sample) order or sorted by `q.sort`, with
 * the count of all that pass. Prompts and completions are cut to `preview` characters (default 300).
 */
export function queryRollouts(file: string, q: RolloutQuery, options: { preview?: number } = {}): RolloutPage {
  const table = tableName(q.table);
  const offset = Math.max(0, Math.floor(q.offset ?? 0));
  const limit = Math.min(1000, Math.max(1, Math.floor(q.limit ?? 50)));
  const preview = Math.max(1, Math.floor(options.preview ?? 300));
  const w = whereOf(q);
  return withStore(file, (db) => {
    const total = (db.prepare(`SELECT count(*) FROM ${table}${w.sql}`).raw(true).get(...w.args) as number[])[0];
    // the page's ids first (sorting keys only), then only those rows' text: sorting whole rows costs 5× more
    const order = orderOf(q);
    const page = `SELECT id FROM ${table}${w.sql} ${order} LIMIT ${limit} OFFSET ${offset}`;
    const rows = db.prepare(`SELECT ${columns(q.table, preview)} FROM ${table} WHERE id IN (${page}) ${order}`).all(...w.args) as Record<string, unknown>[];
    return { total, offset, rows: rows.map(toRow) };
  });
}

/** A detail row's columns: the page's, whole, with `extra` and the per-token values the store has. */
function detailColumns(db: Database.Database, table: RolloutTable): string {
  return [columns(table, null), 'extra', ...tokenValueColumns(db, tableName(table))].join(', ');
}

const toDetail = (r: Record<string, unknown>): RolloutDetail => ({
  ...toRow(r),
  extra: typeof r.extra === 'string' ? (JSON.parse(r.extra) as Record<string, unknown>) : null,
  logprobs: tokenValues(r.logprobs),
  entropies: tokenValues(r.entropies),
});

/** Every completion of one prompt at one step (its group), whole, with `extra` parsed and per-token values. */
export function rolloutGroup(file: string, table: RolloutTable, step: number, promptIndex: number, dataset?: string): RolloutDetail[] {
  const name = tableName(table);
  return withStore(file, (db) => {
    const ds = table === 'eval' && dataset !== undefined ? ' AND dataset = ?' : '';
    const args: (string | number)[] = [step, promptIndex, ...(ds ? [dataset!] : [])];
    const rows = db.prepare(`SELECT ${detailColumns(db, table)} FROM ${name} WHERE step = ? AND prompt_index = ?${ds} ORDER BY rollout_index, id`).all(...args) as Record<string, unknown>[];
    return rows.map(toDetail);
  });
}

/** One rollout by its row id (null when there is none). */
export function rolloutById(file: string, table: RolloutTable, id: number): RolloutDetail | null {
  const name = tableName(table);
  return withStore(file, (db) => {
    const r = db.prepare(`SELECT ${detailColumns(db, table)} FROM ${name} WHERE id = ?`).get(id) as Record<string, unknown> | undefined;
    return r ? toDetail(r) : null;
  });
}

/** Row counts and step range of a store, without SQLite's full integrity check (fast on any size). */
export function countRollouts(file: string): { train: number; eval: number; lastStep: number | null; datasets: string[] } {
  return withStore(file, (db) => {
    return {
      ...rolloutCounts(db),
      datasets: (db.prepare('SELECT DISTINCT dataset FROM eval_rollouts ORDER BY dataset').raw(true).all() as string[][]).map((r) => r[0]),
    };
  });
}

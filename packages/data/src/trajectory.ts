/**
 * The trajectory schema: one row per sampled response, in Parquet files compatible with the source
 * systems (DESIGN.md, "Trajectory schema"), plus the columns RL adds. Rows convert to and from Arrow
 * tables; validation names the file, row and column of every problem.
 */
import * as arrow from 'apache-arrow';
import {
  batchOf,
  checkSchema,
  flattenLists,
  flattenNested,
  listData,
  makeListData,
  nestedListData,
  scalarData,
  type ColumnSpec,
  type FlatList,
} from './arrow';
import { readParquet, readParquetBatches, writeParquet, type ParquetWriteOptions } from './parquet';

/** One trajectory: a prompt, a sampled response, its grade and (after labeling or RL) more. */
export interface Trajectory {
  /** Index of the prompt in its dataset. */
  prompt_idx: number;
  prompt: string;
  prompt_token_ids: ArrayLike<number>;
  output_token_ids: ArrayLike<number>;
  /** 1 if the response was judged correct, else 0 (a float in 0–1). */
  correct?: number | null;
  /** A value estimate in 0–1 (used instead of, or beside, `correct`). */
  value?: number | null;
  /** After labeling: per output position, the min-p candidate token ids… */
  candidate_ids?: ArrayLike<number>[] | null;
  /** …their Q-values… */
  candidate_q_values?: ArrayLike<number>[] | null;
  /** …and the reference policy's log-probs of each candidate. */
  candidate_ref_logprobs?: ArrayLike<number>[] | null;
  /** RL: the optimizer step that sampled it. */
  step?: number | null;
  /** RL: the group (prompt × sampling round) it belongs to; advantages are normalised within a group. */
  group_id?: number | null;
  /** RL: the combined reward. */
  reward?: number | null;
  /** RL: reward per source (e.g. `{ math: 1, format: 0.5 }`), stored as columns `reward_<source>`. */
  rewards?: Record<string, number> | null;
  /** RL: the sequence-level advantage. */
  advantage?: number | null;
  /** RL: per output token advantages (GAE and other token-level estimators). */
  token_advantages?: ArrayLike<number> | null;
  /** RL: log-probs of the output tokens under the sampling (old) policy and the frozen reference. */
  old_logprobs?: ArrayLike<number> | null;
  ref_logprobs?: ArrayLike<number> | null;
  /**
   * RL: per output token, 1 where the policy is trained on it and 0 where it is not — tokens the
   * policy did not sample, such as tool or environment output inside a multi-turn response; null:
   * every token is trained on.
   */
  output_mask?: ArrayLike<number> | null;
  /** Generation: whether the prompt was rendered with thinking on (Qwen3's enable_thinking); null where the template has no switch. */
  thinking?: boolean | null;
  /** Generation: the sample's index among its prompt's samples of the same thinking mode. */
  sample_idx?: number | null;
  /** Generation: 'stop' (a stop token ended the sample) or 'length' (the token limit did). */
  finish_reason?: string | null;
}

/** Every column of the trajectory schema, in file order. `reward_<source>` columns come after them. */
export const TRAJECTORY_COLUMNS: readonly ColumnSpec[] = [
  { name: 'prompt_idx', kind: 'int64', required: true, nullable: false, describe: 'index of the prompt in its dataset' },
  { name: 'prompt', kind: 'string', required: true, nullable: false, describe: 'the prompt text' },
  { name: 'prompt_token_ids', kind: 'list<int32>', required: true, nullable: false, describe: 'prompt token ids' },
  { name: 'output_token_ids', kind: 'list<int32>', required: true, nullable: false, describe: 'response token ids' },
  { name: 'correct', kind: 'float32', required: false, nullable: true, describe: 'graded correctness in 0–1' },
  { name: 'value', kind: 'float32', required: false, nullable: true, describe: 'value estimate in 0–1' },
  { name: 'candidate_ids', kind: 'list<list<int32>>', required: false, nullable: true, describe: 'per output position, candidate token ids' },
  { name: 'candidate_q_values', kind: 'list<list<float32>>', required: false, nullable: true, describe: 'per output position, Q-values of the candidates' },
  { name: 'candidate_ref_logprobs', kind: 'list<list<float32>>', required: false, nullable: true, describe: 'per output position, reference log-probs of the candidates' },
  { name: 'step', kind: 'int64', required: false, nullable: true, describe: 'RL optimizer step that sampled the response' },
  { name: 'group_id', kind: 'int64', required: false, nullable: true, describe: 'RL group id' },
  { name: 'reward', kind: 'float32', required: false, nullable: true, describe: 'RL combined reward' },
  { name: 'advantage', kind: 'float32', required: false, nullable: true, describe: 'RL sequence advantage' },
  { name: 'token_advantages', kind: 'list<float32>', required: false, nullable: true, describe: 'RL per-token advantages' },
  { name: 'old_logprobs', kind: 'list<float32>', required: false, nullable: true, describe: 'RL sampling-policy log-probs of the output tokens' },
  { name: 'ref_logprobs', kind: 'list<float32>', required: false, nullable: true, describe: 'RL reference-policy log-probs of the output tokens' },
  { name: 'output_mask', kind: 'list<int32>', required: false, nullable: true, describe: 'RL per output token: 1 trained on, 0 not (tool or environment output); null: all trained on' },
  { name: 'thinking', kind: 'bool', required: false, nullable: true, describe: 'generation: prompt rendered with thinking on (null: the template has no switch)' },
  { name: 'sample_idx', kind: 'int64', required: false, nullable: true, describe: "generation: index of the sample among its prompt's samples of the same thinking mode" },
  { name: 'finish_reason', kind: 'string', required: false, nullable: true, describe: "generation: 'stop' (stop token) or 'length' (token limit)" },
];

/** Prefix of the per-source reward columns. */
export const REWARD_PREFIX = 'reward_';
const REWARD_SOURCE = /^[A-Za-z0-9_]+$/;

/** The column specs of a table with these reward sources. */
function specsFor(sources: readonly string[]): ColumnSpec[] {
  return [...TRAJECTORY_COLUMNS, ...sources.map((s) => ({ name: REWARD_PREFIX + s, kind: 'float32' as const, required: false, nullable: true, describe: `RL reward from source '${s}'` }))];
}

/** Reward sources of a schema (its `reward_<source>` columns). */
export function rewardSources(schema: arrow.Schema): string[] {
  return schema.fields.filter((f) => f.name.startsWith(REWARD_PREFIX) && f.name !== 'reward').map((f) => f.name.slice(REWARD_PREFIX.length));
}

const isNum = (v: unknown): v is number => typeof v === 'number' && !Number.isNaN(v);

/**
 * Checks rows before writing: required fields present, numbers finite, token ids int32, `correct` and
 * `value` in 0–1, the candidate columns agreeing in shape, per-token RL columns as long as the
 * output. Errors name the row (`where` row i) and the column.
 */
export function validateTrajectories(rows: readonly Trajectory[], where = 'trajectories'): void {
  rows.forEach((r, i) => {
    const at = (col: string, msg: string) => new Error(`${where}: row ${i}, column '${col}': ${msg}`);
    if (!Number.isInteger(r.prompt_idx)) throw at('prompt_idx', `expected an integer, got ${JSON.stringify(r.prompt_idx)}`);
    if (typeof r.prompt !== 'string') throw at('prompt', `expected a string, got ${JSON.stringify(r.prompt)}`);
    for (const col of ['prompt_token_ids', 'output_token_ids'] as const) {
      const ids = r[col];
      if (!ids || typeof ids.length !== 'number') throw at(col, 'missing (expected a list of int32 token ids)');
      for (let k = 0; k < ids.length; k++) {
        const v = ids[k];
        if (!Number.isInteger(v) || v < -2147483648 || v > 2147483647) throw at(col, `element ${k} is ${v}, not an int32 token id`);
      }
    }
    for (const col of ['correct', 'value'] as const) {
      const v = r[col];
      if (v === undefined || v === null) continue;
      if (!isNum(v) || v < 0 || v > 1) throw at(col, `expected a number in 0–1, got ${JSON.stringify(v)}`);
    }
    for (const col of ['step', 'group_id', 'sample_idx'] as const) {
      const v = r[col];
      if (v !== undefined && v !== null && !Number.isInteger(v)) throw at(col, `expected an integer, got ${JSON.stringify(v)}`);
    }
    for (const col of ['reward', 'advantage'] as const) {
      const v = r[col];
      if (v !== undefined && v !== null && !Number.isFinite(v)) throw at(col, `expected a finite number, got ${JSON.stringify(v)}`);
    }
    if (r.thinking !== undefined && r.thinking !== null && typeof r.thinking !== 'boolean') throw at('thinking', `expected true, false or null, got ${JSON.stringify(r.thinking)}`);
    if (r.finish_reason !== undefined && r.finish_reason !== null && typeof r.finish_reason !== 'string') throw at('finish_reason', `expected a string, got ${JSON.stringify(r.finish_reason)}`);
    for (const [s, v] of Object.entries(r.rewards ?? {})) {
      if (!REWARD_SOURCE.test(s)) throw at(REWARD_PREFIX + s, `reward source '${s}' must be letters, digits and _`);
      if (!Number.isFinite(v)) throw at(REWARD_PREFIX + s, `expected a finite number, got ${JSON.stringify(v)}`);
    }
    const outLen = r.output_token_ids.length;
    for (const col of ['token_advantages', 'old_logprobs', 'ref_logprobs', 'output_mask'] as const) {
      const v = r[col];
      if (v && v.length !== outLen) throw at(col, `has ${v.length} values, output_token_ids has ${outLen}`);
    }
    if (r.output_mask) {
      for (let k = 0; k < r.output_mask.length; k++) if (r.output_mask[k] !== 0 && r.output_mask[k] !== 1) throw at('output_mask', `element ${k} is ${r.output_mask[k]}, not 0 or 1`);
    }
    const cands = (['candidate_ids', 'candidate_q_values', 'candidate_ref_logprobs'] as const).filter((c) => r[c]);
    for (const col of cands.slice(1)) {
      const a = r[cands[0]]!;
      const b = r[col]!;
      if (a.length !== b.length) throw at(col, `has ${b.length} positions, ${cands[0]} has ${a.length}`);
      for (let k = 0; k < a.length; k++) if (a[k].length !== b[k].length) throw at(col, `position ${k} has ${b[k].length} candidates, ${cands[0]} has ${a[k].length}`);
    }
    if (r.candidate_ids) {
      for (let k = 0; k < r.candidate_ids.length; k++) {
        const c = r.candidate_ids[k];
        for (let j = 0; j < c.length; j++) if (!Number.isInteger(c[j])) throw at('candidate_ids', `position ${k}, candidate ${j} is ${c[j]}, not a token id`);
      }
    }
  });
}

/** Options of {@link trajectoriesToBatch}. */
export interface TrajectoryBatchOptions {
  /**
   * Optional columns to write even where every row's value is null, so that files written in parts
   * (some without a value in that column) share one schema.
   */
  columns?: readonly string[];
}

/**
 * Trajectories as an Arrow record batch in the schema's column order. Optional columns appear when
 * any row has them (or `options.columns` names them); reward sources become `reward_<source>`
 * columns. Validates first.
 */
export function trajectoriesToBatch(rows: readonly Trajectory[], where?: string, options: TrajectoryBatchOptions = {}): arrow.RecordBatch {
  validateTrajectories(rows, where);
  const forced = new Set(options.columns ?? []);
  for (const c of forced) if (!TRAJECTORY_COLUMNS.some((s) => s.name === c)) throw new Error(`${where ?? 'trajectories'}: unknown column '${c}' in options.columns`);
  const has = (k: keyof Trajectory) => forced.has(k) || rows.some((r) => r[k] !== undefined && r[k] !== null);
  const cols: { name: string; data: arrow.Data; nullable?: boolean }[] = [];
  const i32 = (n: number) => new Int32Array(n);
  const f32 = (n: number) => new Float32Array(n);
  const listWithNulls = (k: keyof Trajectory, flat: FlatList<Int32Array | Float32Array>) => {
    const d = listData(flat);
    return withNulls(d, rows.map((r) => r[k] === undefined || r[k] === null));
  };
  for (const spec of TRAJECTORY_COLUMNS) {
    const k = spec.name as keyof Trajectory;
    if (!spec.required && !has(k)) continue;
    const values = rows.map((r) => r[k]);
    let data: arrow.Data;
    switch (spec.kind) {
      case 'list<int32>':
        data = spec.required ? listData(flattenLists(values as ArrayLike<number>[], i32)) : listWithNulls(k, flattenLists(values as ArrayLike<number>[], i32));
        break;
      case 'list<float32>':
        data = listWithNulls(k, flattenLists(values as ArrayLike<number>[], f32));
        break;
      case 'list<list<int32>>':
      case 'list<list<float32>>': {
        const nested = values as ArrayLike<number>[][];
        const n = spec.kind === 'list<list<int32>>' ? flattenNested(nested, i32) : flattenNested(nested, f32);
        data = withNulls(nestedListData<Int32Array | Float32Array>(n.outer, n.inner), rows.map((r) => r[k] === undefined || r[k] === null));
        break;
      }
      default:
        data = scalarData(spec.kind as 'int64' | 'float32' | 'string' | 'bool', values);
    }
    cols.push({ name: spec.name, data, nullable: spec.nullable });
  }
  const sources = [...new Set(rows.flatMap((r) => Object.keys(r.rewards ?? {})))].sort();
  for (const s of sources) cols.push({ name: REWARD_PREFIX + s, data: scalarData('float32', rows.map((r) => r.rewards?.[s] ?? null)), nullable: true });
  return batchOf(cols);
}

/** Marks rows as null in a list column's Data. */
function withNulls(d: arrow.Data<arrow.List>, isNull: boolean[]): arrow.Data<arrow.List> {
  const nulls = isNull.filter(Boolean).length;
  if (nulls === 0) return d;
  const bitmap = new Uint8Array(Math.ceil(isNull.length / 8));
  isNull.forEach((n, i) => {
    if (!n) bitmap[i >> 3] |= 1 << (i & 7);
  });
  return makeListData({ type: d.type, length: d.length, nullCount: nulls, nullBitmap: bitmap, valueOffsets: d.valueOffsets, child: d.children[0] });
}

/**
 * Checks a table read from a file: the schema (missing required columns, wrong types) and each row's
 * nulls in non-nullable columns and ranges of `correct`/`value`. Errors name `where`, the row and the column.
 */
export function validateTrajectoryTable(table: arrow.Table | arrow.RecordBatch, where: string, firstRow = 0): void {
  const specs = specsFor(rewardSources(table.schema));
  checkSchema(table.schema, specs, where);
  for (const spec of specs) {
    const col = table.getChild(spec.name);
    if (!col) continue;
    if (!spec.nullable && col.nullCount > 0) {
      for (let i = 0; i < col.length; i++) if (col.get(i) === null) throw new Error(`${where}: row ${firstRow + i}, column '${spec.name}': null (the column is required)`);
    }
    if (spec.name === 'correct' || spec.name === 'value') {
      for (let i = 0; i < col.length; i++) {
        const v = col.get(i) as number | null;
        if (v !== null && !(v >= 0 && v <= 1)) throw new Error(`${where}: row ${firstRow + i}, column '${spec.name}': ${v} is outside 0–1`);
      }
    }
  }
}

const nums = (v: unknown): number[] | null => (v === null || v === undefined ? null : Array.from((v as arrow.Vector).toArray() as ArrayLike<number | bigint>, Number));
const nested = (v: unknown): number[][] | null => (v === null || v === undefined ? null : Array.from({ length: (v as arrow.Vector).length }, (_, i) => nums((v as arrow.Vector).get(i)) ?? []));
const num = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v));

/** The rows of a trajectory table (validated first), with absent optional columns left out. */
export function tableToTrajectories(table: arrow.Table | arrow.RecordBatch, where = 'table', firstRow = 0): Trajectory[] {
  validateTrajectoryTable(table, where, firstRow);
  const col = (name: string) => table.getChild(name);
  const sources = rewardSources(table.schema);
  const out: Trajectory[] = [];
  const c = Object.fromEntries(TRAJECTORY_COLUMNS.map((s) => [s.name, col(s.name)]));
  for (let i = 0; i < table.numRows; i++) {
    const t: Trajectory = {
      prompt_idx: Number(c.prompt_idx!.get(i)),
      prompt: c.prompt!.get(i) as string,
      prompt_token_ids: Int32Array.from(nums(c.prompt_token_ids!.get(i)) ?? []),
      output_token_ids: Int32Array.from(nums(c.output_token_ids!.get(i)) ?? []),
    };
    for (const k of ['correct', 'value', 'step', 'group_id', 'reward', 'advantage', 'sample_idx'] as const) if (c[k]) t[k] = num(c[k]!.get(i));
    if (c.thinking) t.thinking = c.thinking.get(i) as boolean | null;
    if (c.finish_reason) t.finish_reason = c.finish_reason.get(i) as string | null;
    for (const k of ['token_advantages', 'old_logprobs', 'ref_logprobs', 'output_mask'] as const) if (c[k]) t[k] = nums(c[k]!.get(i));
    for (const k of ['candidate_ids', 'candidate_q_values', 'candidate_ref_logprobs'] as const) if (c[k]) t[k] = nested(c[k]!.get(i));
    if (sources.length) {
      t.rewards = {};
      for (const s of sources) {
        const v = num(col(REWARD_PREFIX + s)!.get(i));
        if (v !== null) t.rewards[s] = v;
      }
    }
    out.push(t);
  }
  return out;
}

/** Writes trajectories to a Parquet file (validated; see {@link trajectoriesToBatch}). */
export async function writeTrajectories(file: string, rows: readonly Trajectory[], options: ParquetWriteOptions & TrajectoryBatchOptions = {}): Promise<{ rows: number; bytes: number }> {
  return writeParquet(file, [trajectoriesToBatch(rows, file, options)], options);
}

/** Reads a trajectory Parquet file (a pyarrow/pandas one too), validated with errors naming file, row and column. */
export async function readTrajectories(file: string): Promise<Trajectory[]> {
  return tableToTrajectories(await readParquet(file), file);
}

/** Streams a trajectory Parquet file in validated record batches (for files larger than memory). */
export async function* readTrajectoryBatches(file: string, options: { batchSize?: number; columns?: string[] } = {}): AsyncGenerator<arrow.RecordBatch> {
  let row = 0;
  for await (const b of readParquetBatches(file, options)) {
    if (!options.columns) validateTrajectoryTable(b, file, row);
    row += b.numRows;
    yield b;
  }
}

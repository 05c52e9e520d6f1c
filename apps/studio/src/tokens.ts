/**
 * The token view's data: one trajectory of a Parquet file (or one stored rollout) as its tokens,
 * each decoded on its own, with the per-token values there are — the sampling log-prob, the Q-value
 * of the sampled token among its labelled candidates, the token advantage — and the candidate sets.
 */
import { existsSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { parquetInfo, readParquetBatches, readParquetSchema, readRunConfig, readTrajectoryBatches, tableToTrajectories, type Trajectory } from '@lathe/data';
import { BUILTIN_TOKENIZER, additionTokenizer } from '@lathe/recipes';
import { HfTokenizer } from '@lathe/tokenizer';

/** Decodes one token id (null: no tokenizer, ids are shown). */
export type TokenDecoder = ((id: number) => string) | null;

/** One token and its values (null where the file has none). */
export interface TokenCell {
  id: number;
  text: string;
  logprob: number | null;
  /** The entropy of the next-token distribution at this token: stored rollouts' (where the trainer computed it), or a Parquet file's `token_entropies`. */
  entropy: number | null;
  q: number | null;
  advantage: number | null;
  /** The labelled candidates at this position: id, text, Q (and reference log-prob when stored). */
  candidates: { id: number; text: string; q: number | null; logprob: number | null }[] | null;
}

/** A trajectory laid out for the token view. */
export interface TokenView {
  source: string;
  row: number;
  rows: number;
  prompt: string;
  tokens: TokenCell[];
  /** Which colourings have values. */
  values: ('logprob' | 'entropy' | 'q' | 'advantage')[];
  reward: number | null;
  correct: number | null;
  /** The tokenizer used to show the text, or why ids are shown. */
  tokenizer: string;
}

/** The Parquet files under `root` (at most 5 folders deep), as paths relative to it. */
export function listParquet(root: string): string[] {
  const out: string[] = [];
  const walk = (dir: string, depth: number) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory() && depth < 5 && e.name !== 'node_modules' && e.name !== 'checkpoints' && !e.name.startsWith('.')) walk(p, depth + 1);
      else if (e.isFile() && e.name.endsWith('.parquet')) out.push(relative(root, p));
    }
  };
  if (existsSync(root)) walk(root, 0);
  return out.sort();
}

const cache = new Map<string, { decode: TokenDecoder; name: string }>();

/**
 * The tokenizer for a file inside `root`: `choice` 'run' takes the config.yaml of the nearest run
 * directory above it (its `tokenizer`, else its `model` folder when that holds tokenizer.json).
 */
export async function tokenizerFor(file: string, root: string, choice: string): Promise<{ decode: TokenDecoder; name: string }> {
  let spec = choice;
  if (choice === 'run') {
    spec = '';
    for (let dir = dirname(resolve(file)); dir.startsWith(resolve(root)); dir = dirname(dir)) {
      if (!existsSync(join(dir, 'config.yaml'))) {
        if (dir === dirname(dir)) break;
        continue;
      }
      const cfg = readRunConfig(dir) ?? {};
      const tok = typeof cfg.tokenizer === 'string' ? cfg.tokenizer : 'model';
      const model = typeof cfg.model === 'string' ? cfg.model : '';
      spec = tok === 'model' ? model : tok;
      break;
    }
  }
  const hit = cache.get(spec);
  if (hit) return hit;
  let out: { decode: TokenDecoder; name: string };
  if (spec === BUILTIN_TOKENIZER) {
    const tok = additionTokenizer();
    out = { decode: (id) => tok.decode([id]), name: BUILTIN_TOKENIZER };
  } else if (spec !== '' && existsSync(join(spec, 'tokenizer.json'))) {
    const tok = await HfTokenizer.fromFolder(spec);
    out = { decode: (id) => tok.decode([id], { skipSpecialTokens: false }), name: spec };
  } else out = { decode: null, name: spec === '' ? 'none found (no run config above the file): token ids shown' : `${spec}: no tokenizer.json there: token ids shown` };
  cache.set(spec, out);
  return out;
}

/** The per-output-token entropy column of a trajectory file (beside the schema's columns). */
export const ENTROPY_COLUMN = 'token_entropies';

const text = (decode: TokenDecoder, id: number) => (decode ? decode(id) : `⟨${id}⟩`);
const nums = (v: ArrayLike<number> | null | undefined): number[] | null => (v ? Array.from(v) : null);

/** Lays out one trajectory's output tokens with their values (`entropies`: per token, from a stored rollout). */
export function tokenCells(t: Trajectory, decode: TokenDecoder, entropies: ArrayLike<number> | null = null): { tokens: TokenCell[]; values: TokenView['values'] } {
  const ids = Array.from(t.output_token_ids);
  const lp = nums(t.old_logprobs);
  const ent = nums(entropies);
  const adv = nums(t.token_advantages);
  const cids = t.candidate_ids?.map((c) => Array.from(c)) ?? null;
  const cq = t.candidate_q_values?.map((c) => Array.from(c)) ?? null;
  const cref = t.candidate_ref_logprobs?.map((c) => Array.from(c)) ?? null;
  const tokens = ids.map((id, i) => {
    const cand = cids?.[i] ?? null;
    const k = cand ? cand.indexOf(id) : -1;
    return {
      id,
      text: text(decode, id),
      logprob: lp?.[i] ?? null,
      entropy: ent?.[i] ?? null,
      // the Q of the sampled token: its entry among the candidates labelled at this position
      q: k >= 0 && cq?.[i] ? (cq[i][k] ?? null) : null,
      advantage: adv?.[i] ?? null,
      candidates: cand ? cand.map((c, j) => ({ id: c, text: text(decode, c), q: cq?.[i]?.[j] ?? null, logprob: cref?.[i]?.[j] ?? null })) : null,
    };
  });
  const values: TokenView['values'] = [];
  if (lp) values.push('logprob');
  if (ent) values.push('entropy');
  if (tokens.some((c) => c.q !== null)) values.push('q');
  if (adv) values.push('advantage');
  return { tokens, values };
}

/** Row `row` (0-based) of a trajectory Parquet file, laid out for the token view. */
export async function trajectoryTokens(file: string, row: number, decoder: { decode: TokenDecoder; name: string }, source: string): Promise<TokenView> {
  if (!existsSync(file) || !statSync(file).isFile()) throw new Error(`${source}: no such file`);
  const { rows } = await parquetInfo(file);
  if (!Number.isInteger(row) || row < 0 || row >= rows) throw new Error(`${source}: row ${row} is out of range (the file has ${rows} rows, 0–${rows - 1})`);
  let seen = 0;
  for await (const b of readTrajectoryBatches(file, { batchSize: 256 })) {
    if (row < seen + b.numRows) {
      const t = tableToTrajectories(b, source, seen)[row - seen];
      // per-token entropies where the writer had the next-token distribution (lathe critic label's token_entropies)
      const ent = b.getChild(ENTROPY_COLUMN)?.get(row - seen) as ArrayLike<number> | null | undefined;
      return { source, row, rows, prompt: t.prompt, ...tokenCells(t, decoder.decode, ent ? Array.from(ent, Number) : null), reward: t.reward ?? null, correct: t.correct ?? null, tokenizer: decoder.name };
    }
    seen += b.numRows;
  }
  throw new Error(`${source}: row ${row} not found`);
}

/** One row of a trajectory file's table: its row number and its scalar columns. */
export interface TrajectoryRow {
  row: number;
  prompt_idx: number | null;
  step: number | null;
  prompt: string;
  reward: number | null;
  correct: number | null;
  advantage: number | null;
  /** Output tokens. */
  length: number;
}

/** Filters and page of {@link trajectoryRows}; absent fields do not filter (a bound on a column the file lacks passes no row). */
export interface TrajectoryQuery {
  offset?: number;
  limit?: number;
  /** Case-insensitive substring of the prompt. */
  prompt?: string;
  promptIdx?: number;
  step?: number;
  minReward?: number;
  maxReward?: number;
  minAdvantage?: number;
  maxAdvantage?: number;
  /** Bounds on the output's length in tokens. */
  minLength?: number;
  maxLength?: number;
}

const within = (v: number | null, lo: number | undefined, hi: number | undefined) => (lo === undefined || (v !== null && v >= lo)) && (hi === undefined || (v !== null && v <= hi));

/**
 * Lengths of a batch's list column from its offsets, without materialising the lists (reading
 * 100,000 outputs' ids takes ~1 s this way and ~5 s element by element).
 */
function listLengths(v: { data: readonly { offset: number; length: number; valueOffsets: ArrayLike<number> }[] } | null | undefined, rows: number): Int32Array {
  const out = new Int32Array(rows);
  if (!v) return out;
  let at = 0;
  for (const d of v.data) {
    for (let i = 0; i < d.length && at < rows; i++, at++) out[at] = d.valueOffsets[d.offset + i + 1] - d.valueOffsets[d.offset + i];
  }
  return out;
}

/**
 * Rows `offset`..`offset + limit` of a trajectory Parquet file, with the number of rows that pass
 * the filters. Read a batch at a time, only the columns shown (never the candidate sets), so a file
 * of any size is never loaded whole; the prompts and output ids are read in the filtering pass only
 * when a filter needs them, else in a second pass that stops at the page's last row.
 */
export async function trajectoryRows(file: string, q: TrajectoryQuery, source: string): Promise<{ total: number; offset: number; rows: TrajectoryRow[] }> {
  if (!existsSync(file) || !statSync(file).isFile()) throw new Error(`${source}: no such file`);
  const names = new Set((await readParquetSchema(file)).fields.map((f) => f.name));
  const byLength = q.minLength !== undefined || q.maxLength !== undefined;
  const needle = q.prompt?.toLowerCase();
  const columns = ['prompt_idx', 'step', 'reward', 'correct', 'advantage', ...(needle ? ['prompt'] : []), ...(byLength ? ['output_token_ids'] : [])].filter((c) => names.has(c));
  const offset = Math.max(0, Math.floor(q.offset ?? 0));
  const limit = Math.min(1000, Math.max(1, Math.floor(q.limit ?? 50)));
  const rows: TrajectoryRow[] = [];
  let total = 0;
  let row = 0;
  const num = (v: unknown) => (v === null || v === undefined ? null : Number(v));
  // this pass reads every row's prompt_idx and step: it builds the prompt index the group view uses
  const indexing = names.has('prompt_idx') && !cachedPromptIndex(file) ? new PromptIndexBuilder(file) : null;
  for await (const b of readParquetBatches(file, { columns, batchSize: 1024 })) {
    const [pi, st, pr, rw, co, ad] = ['prompt_idx', 'step', 'prompt', 'reward', 'correct', 'advantage'].map((name) => b.getChild(name));
    const lengths = byLength ? listLengths(b.getChild('output_token_ids') as never, b.numRows) : undefined;
    for (let i = 0; i < b.numRows; i++, row++) {
      const reward = (rw?.get(i) as number | null | undefined) ?? null;
      const [promptIdx, step, advantage] = [num(pi?.get(i)), num(st?.get(i)), num(ad?.get(i))];
      indexing?.add(row, promptIdx, step);
      if (!within(reward, q.minReward, q.maxReward) || !within(advantage, q.minAdvantage, q.maxAdvantage) || (lengths && !within(lengths[i], q.minLength, q.maxLength))) continue;
      if ((q.promptIdx !== undefined && promptIdx !== q.promptIdx) || (q.step !== undefined && step !== q.step)) continue;
      const prompt = needle ? String(pr?.get(i) ?? '') : '';
      if (needle && !prompt.toLowerCase().includes(needle)) continue;
      if (total >= offset && rows.length < limit) rows.push({ row, prompt_idx: promptIdx, step, prompt, reward, correct: num(co?.get(i)), advantage, length: lengths ? lengths[i] : 0 });
      total++;
    }
  }
  indexing?.finish();
  const rest = [...(needle ? [] : ['prompt']), ...(byLength ? [] : ['output_token_ids'])].filter((c) => names.has(c));
  if (rows.length > 0 && rest.length > 0) {
    // the page's prompts and lengths: read up to its last row only
    const want = new Map(rows.map((r) => [r.row, r]));
    const last = rows[rows.length - 1].row;
    let at = 0;
    // row groups before the page's first row are skipped undecoded
    for await (const b of readParquetBatches(file, { columns: rest, batchSize: 1024, fromRow: rows[0].row, onRowGroup: (first) => (at = first) })) {
      const lengths = rest.includes('output_token_ids') ? listLengths(b.getChild('output_token_ids') as never, b.numRows) : undefined;
      const pr = b.getChild('prompt');
      for (let i = 0; i < b.numRows; i++, at++) {
        const r = want.get(at);
        if (!r) continue;
        if (lengths) r.length = lengths[i];
        if (pr && !needle) r.prompt = String(pr.get(i) ?? '');
      }
      if (at > last) break;
    }
  }
  return { total, offset, rows };
}

/** One completion of a trajectory file's group, decoded. */
export interface TrajectoryGroupRow extends TrajectoryRow {
  sample_idx: number | null;
  /** The output tokens decoded (ids shown without a tokenizer). */
  text: string;
}

/** A trajectory file's rows by prompt: each `prompt_idx`'s row numbers and their steps, in file order. */
type PromptIndex = Map<number, { rows: number[]; steps: (number | null)[] }>;

const promptIndexes = new Map<string, { mtimeMs: number; size: number; index: PromptIndex }>();
/** How many files' indexes are kept (the least recently used goes first). */
const PROMPT_INDEXES_KEPT = 8;

/** The file's cached prompt index while its mtime and size are unchanged, else undefined. */
function cachedPromptIndex(file: string): PromptIndex | undefined {
  const { mtimeMs, size } = statSync(file);
  const key = resolve(file);
  const hit = promptIndexes.get(key);
  if (!hit || hit.mtimeMs !== mtimeMs || hit.size !== size) return undefined;
  promptIndexes.delete(key); // re-inserted: most recently used last
  promptIndexes.set(key, hit);
  return hit.index;
}

/**
 * Collects a file's prompt index from a pass over every row (`add` in file order), and caches it
 * under the file's mtime and size as they were when the pass began.
 */
class PromptIndexBuilder {
  private readonly index: PromptIndex = new Map();
  private readonly stat: { mtimeMs: number; size: number };
  constructor(private readonly file: string) {
    const { mtimeMs, size } = statSync(file);
    this.stat = { mtimeMs, size };
  }
  add(row: number, promptIdx: number | null, step: number | null): void {
    if (promptIdx === null) return;
    let entry = this.index.get(promptIdx);
    if (!entry) this.index.set(promptIdx, (entry = { rows: [], steps: [] }));
    entry.rows.push(row);
    entry.steps.push(step);
  }
  finish(): PromptIndex {
    const key = resolve(this.file);
    promptIndexes.delete(key);
    promptIndexes.set(key, { ...this.stat, index: this.index });
    if (promptIndexes.size > PROMPT_INDEXES_KEPT) promptIndexes.delete(promptIndexes.keys().next().value as string);
    return this.index;
  }
}

/** A column's values as numbers (null where the row has none), read as one typed array rather than row by row. */
function columnNumbers(v: { length: number; nullCount: number; isValid(i: number): boolean; toArray(): ArrayLike<number | bigint> } | null | undefined): (number | null)[] | null {
  if (!v) return null;
  const values = v.toArray();
  const out = new Array<number | null>(v.length);
  for (let i = 0; i < v.length; i++) out[i] = v.nullCount > 0 && !v.isValid(i) ? null : Number(values[i]);
  return out;
}

/**
 * The file's prompt index: cached (by {@link trajectoryRows}' pass or an earlier lookup), else
 * built from its `prompt_idx` and `step` columns alone.
 */
async function promptIndex(file: string, names: Set<string>): Promise<PromptIndex> {
  const hit = cachedPromptIndex(file);
  if (hit) return hit;
  const builder = new PromptIndexBuilder(file);
  let row = 0;
  if (names.has('prompt_idx')) {
    for await (const b of readParquetBatches(file, { columns: ['prompt_idx', 'step'].filter((c) => names.has(c)), batchSize: 8192 })) {
      const [pi, st] = [columnNumbers(b.getChild('prompt_idx') as never), columnNumbers(b.getChild('step') as never)];
      for (let i = 0; i < b.numRows; i++, row++) builder.add(row, pi?.[i] ?? null, st?.[i] ?? null);
    }
  }
  return builder.finish();
}

/**
 * Every row of one prompt (`prompt_idx`, and `step` when the file has steps) of a trajectory file:
 * its group of completions, decoded, in file order. The rows are found through the file's prompt
 * index (built once per file version); only the row groups from the group's first row to its last
 * are then read.
 */
export async function trajectoryGroup(file: string, promptIdx: number, step: number | undefined, decoder: { decode: TokenDecoder }, source: string): Promise<TrajectoryGroupRow[]> {
  if (!existsSync(file) || !statSync(file).isFile()) throw new Error(`${source}: no such file`);
  const names = new Set((await readParquetSchema(file)).fields.map((f) => f.name));
  const entry = (await promptIndex(file, names)).get(promptIdx);
  const found = entry ? entry.rows.filter((_, k) => step === undefined || entry.steps[k] === step) : [];
  if (found.length === 0) return [];
  const out: TrajectoryGroupRow[] = [];
  const wanted = new Set(found);
  const last = found[found.length - 1];
  const columns = ['step', 'reward', 'correct', 'advantage', 'sample_idx', 'prompt', 'output_token_ids'].filter((c) => names.has(c));
  const num = (v: unknown) => (v === null || v === undefined ? null : Number(v));
  let at = 0;
  // row groups before the group's first row are skipped undecoded
  for await (const b of readParquetBatches(file, { columns, batchSize: 1024, fromRow: found[0], onRowGroup: (first) => (at = first) })) {
    const [st, rw, co, ad, si, pr, ids] = ['step', 'reward', 'correct', 'advantage', 'sample_idx', 'prompt', 'output_token_ids'].map((c) => b.getChild(c));
    for (let i = 0; i < b.numRows; i++, at++) {
      if (!wanted.has(at)) continue;
      const tokens = Array.from((ids?.get(i) as ArrayLike<number> | null) ?? [], Number);
      out.push({ row: at, prompt_idx: promptIdx, step: num(st?.get(i)), prompt: String(pr?.get(i) ?? ''), reward: num(rw?.get(i)), correct: num(co?.get(i)), advantage: num(ad?.get(i)), length: tokens.length, sample_idx: num(si?.get(i)), text: tokens.map((id) => text(decoder.decode, id)).join('') });
    }
    if (at > last) break;
  }
  return out;
}

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
  for await (const b of readParquetBatches(file, { columns, batchSize: 1024 })) {
    const [pi, st, pr, rw, co, ad] = ['prompt_idx', 'step', 'prompt', 'reward', 'correct', 'advantage'].map((name) => b.getChild(name));
    const lengths = byLength ? listLengths(b.getChild('output_token_ids') as never, b.numRows) : undefined;
    for (let i = 0; i < b.numRows; i++, row++) {
      const reward = (rw?.get(i) as number | null | undefined) ?? null;
      const [promptIdx, step, advantage] = [num(pi?.get(i)), num(st?.get(i)), num(ad?.get(i))];
      if (!within(reward, q.minReward, q.maxReward) || !within(advantage, q.minAdvantage, q.maxAdvantage) || (lengths && !within(lengths[i], q.minLength, q.maxLength))) continue;
      if ((q.promptIdx !== undefined && promptIdx !== q.promptIdx) || (q.step !== undefined && step !== q.step)) continue;
      const prompt = needle ? String(pr?.get(i) ?? '') : '';
      if (needle && !prompt.toLowerCase().includes(needle)) continue;
      if (total >= offset && rows.length < limit) rows.push({ row, prompt_idx: promptIdx, step, prompt, reward, correct: num(co?.get(i)), advantage, length: lengths ? lengths[i] : 0 });
      total++;
    }
  }
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

/**
 * Every row of one prompt (`prompt_idx`, and `step` when the file has steps) of a trajectory file:
 * its group of completions, decoded, in file order. Read a batch at a time.
 */
export async function trajectoryGroup(file: string, promptIdx: number, step: number | undefined, decoder: { decode: TokenDecoder }, source: string): Promise<TrajectoryGroupRow[]> {
  if (!existsSync(file) || !statSync(file).isFile()) throw new Error(`${source}: no such file`);
  const names = new Set((await readParquetSchema(file)).fields.map((f) => f.name));
  const wanted = ['prompt_idx', 'step', 'reward', 'correct', 'advantage', 'sample_idx'];
  const out: TrajectoryGroupRow[] = [];
  const num = (v: unknown) => (v === null || v === undefined ? null : Number(v));
  let row = 0;
  // the group's rows from the small columns first; then their prompts and ids, read up to the last
  for await (const b of readParquetBatches(file, { columns: wanted.filter((c) => names.has(c)), batchSize: 1024 })) {
    const [pi, st, rw, co, ad, si] = wanted.map((c) => b.getChild(c));
    for (let i = 0; i < b.numRows; i++, row++) {
      if (num(pi?.get(i)) !== promptIdx || (step !== undefined && num(st?.get(i)) !== step)) continue;
      out.push({ row, prompt_idx: promptIdx, step: num(st?.get(i)), prompt: '', reward: num(rw?.get(i)), correct: num(co?.get(i)), advantage: num(ad?.get(i)), length: 0, sample_idx: num(si?.get(i)), text: '' });
    }
  }
  if (out.length === 0) return out;
  const byRow = new Map(out.map((r) => [r.row, r]));
  const last = out[out.length - 1].row;
  let at = 0;
  for await (const b of readParquetBatches(file, { columns: ['prompt', 'output_token_ids'].filter((c) => names.has(c)), batchSize: 1024, fromRow: out[0].row, onRowGroup: (first) => (at = first) })) {
    const [pr, ids] = [b.getChild('prompt'), b.getChild('output_token_ids')];
    for (let i = 0; i < b.numRows; i++, at++) {
      const r = byRow.get(at);
      if (!r) continue;
      const tokens = Array.from((ids?.get(i) as ArrayLike<number> | null) ?? [], Number);
      Object.assign(r, { prompt: String(pr?.get(i) ?? ''), length: tokens.length, text: tokens.map((id) => text(decoder.decode, id)).join('') });
    }
    if (at > last) break;
  }
  return out;
}


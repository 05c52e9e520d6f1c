/**
 * The critic's distribution tokens: a joint grid of reward bins × remaining-length bins, each cell
 * one token id past the tokenizer's vocabulary. The critic predicts a distribution over the cells at
 * every token of an attempt; its marginals give Q (the expected reward) and the expected number of
 * tokens still to come.
 */
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** The file beside a critic checkpoint that records its grid (also in config.json as `lathe_critic`; see {@link saveBins}). */
export const CRITIC_BINS_FILE = 'critic_bins.json';

/**
 * The grid, as saved with a checkpoint. Reward bins are given by representative values (a reward
 * falls in the bin of the nearest value, a tie going up), length bins by integer edges.
 */
export interface CriticBins {
  /** Representative reward of each reward bin, strictly ascending within [0, 1] (e.g. [0, 1] for pass/fail). */
  reward_values: number[];
  /** Remaining-length bin edges, strictly ascending integers from 0: bin j holds remaining lengths in [edges[j], edges[j+1]). */
  length_edges: number[];
  /** Token id of grid cell 0; cell r·lengthBins + l is `first_token_id + r·lengthBins + l`. */
  first_token_id: number;
}

/** Reward values of the default grids: pass/fail, or eleven steps of 0.1 for fractional rewards. */
export function defaultRewardValues(kind: 'binary' | 'fractional'): number[] {
  return kind === 'binary' ? [0, 1] : Array.from({ length: 11 }, (_, i) => i / 10);
}

/**
 * Log-spaced length edges covering remaining lengths 0…maxLength: 0, then about `bins` geometric
 * steps up to maxLength + 1, rounded to integers and kept strictly ascending (so short lengths get
 * bins of one token each, long ones wide bins).
 */
export function logLengthEdges(maxLength: number, bins: number): number[] {
  if (!Number.isInteger(maxLength) || maxLength < 1) throw new Error(`length bins: max length must be a positive integer, got ${maxLength}`);
  if (!Number.isInteger(bins) || bins < 1) throw new Error(`length bins: bin count must be a positive integer, got ${bins}`);
  const top = maxLength + 1;
  const edges = [0];
  for (let j = 1; j <= bins; j++) {
    const e = Math.max(Math.round(top ** (j / bins)), edges[edges.length - 1] + 1);
    if (e >= top) break;
    edges.push(e);
  }
  edges.push(top);
  return edges;
}

/** Checks a grid's fields, naming the first that is wrong (`where` names its source). */
export function validateBins(bins: CriticBins, where = 'critic bins'): CriticBins {
  const { reward_values: rv, length_edges: le, first_token_id: first } = bins;
  if (!Array.isArray(rv) || rv.length < 2) throw new Error(`${where}: reward_values must list at least 2 values`);
  rv.forEach((v, i) => {
    if (typeof v !== 'number' || !(v >= 0 && v <= 1)) throw new Error(`${where}: reward_values[${i}] = ${v} is outside [0, 1]`);
    if (i > 0 && !(v > rv[i - 1])) throw new Error(`${where}: reward_values must be strictly ascending, but [${i}] = ${v} follows ${rv[i - 1]}`);
  });
  if (!Array.isArray(le) || le.length < 2 || le[0] !== 0) throw new Error(`${where}: length_edges must start at 0 and have at least 2 edges`);
  le.forEach((e, j) => {
    if (!Number.isInteger(e)) throw new Error(`${where}: length_edges[${j}] = ${e} is not an integer`);
    if (j > 0 && !(e > le[j - 1])) throw new Error(`${where}: length_edges must be strictly ascending, but [${j}] = ${e} follows ${le[j - 1]}`);
  });
  if (!Number.isInteger(first) || first < 0) throw new Error(`${where}: first_token_id must be a non-negative integer, got ${first}`);
  return bins;
}

/** Number of reward bins, length bins and grid cells. */
export function gridShape(bins: CriticBins): { rewardBins: number; lengthBins: number; cells: number } {
  const rewardBins = bins.reward_values.length;
  const lengthBins = bins.length_edges.length - 1;
  return { rewardBins, lengthBins, cells: rewardBins * lengthBins };
}

/** The reward bin of a reward in [0, 1]: the nearest representative value, a tie going to the higher. */
export function rewardBin(bins: CriticBins, reward: number, where = 'reward'): number {
  if (!(reward >= 0 && reward <= 1)) throw new Error(`${where}: ${reward} is outside [0, 1]`);
  let best = 0;
  for (let i = 1; i < bins.reward_values.length; i++) if (Math.abs(reward - bins.reward_values[i]) <= Math.abs(reward - bins.reward_values[best])) best = i;
  return best;
}

/** The length bin of a remaining length; an error names the value when the edges do not reach it. */
export function lengthBin(bins: CriticBins, remaining: number, where = 'remaining length'): number {
  const e = bins.length_edges;
  if (!Number.isInteger(remaining) || remaining < 0) throw new Error(`${where}: ${remaining} is not a non-negative integer`);
  if (remaining >= e[e.length - 1]) {
    throw new Error(`${where}: ${remaining} is not covered by the length bins (length_edges end at ${e[e.length - 1]}); raise the max length of the bins`);
  }
  let lo = 0;
  let hi = e.length - 2;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (e[mid] <= remaining) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/** Grid cell (0-based) of a (reward, remaining length) pair. */
export function gridCell(bins: CriticBins, reward: number, remaining: number, where?: string): number {
  return rewardBin(bins, reward, where) * gridShape(bins).lengthBins + lengthBin(bins, remaining, where);
}

/**
 * Labels of an attempt of `length` tokens with final reward `reward`: the grid cell of
 * (reward, T − t) at its token t = 1…T, i.e. the number of tokens still to come after each token
 * (T − 1 at the first token, 0 at the last).
 */
export function attemptLabels(bins: CriticBins, reward: number, length: number, where?: string): number[] {
  return Array.from({ length }, (_, i) => gridCell(bins, reward, length - 1 - i, where));
}

/** Typical remaining length of each length bin: the middle of its integer range. */
export function lengthBinCentres(bins: CriticBins): number[] {
  const e = bins.length_edges;
  return e.slice(0, -1).map((lo, j) => (lo + e[j + 1] - 1) / 2);
}

/** What the critic's distribution over the grid says at one position. */
export interface CriticEstimate {
  /** Q = Σ P(reward bin) · reward value: the expected reward (P(reward = 1) on a pass/fail grid). */
  q: number;
  /** E[remaining length] = Σ P(length bin) · the bin's centre. */
  remaining: number;
}

/** Q and expected remaining length from probabilities over the grid's cells (summing to 1). */
export function marginals(bins: CriticBins, probs: ArrayLike<number>, offset = 0): CriticEstimate {
  const { rewardBins, lengthBins } = gridShape(bins);
  const centres = lengthBinCentres(bins);
  let q = 0;
  let remaining = 0;
  for (let r = 0; r < rewardBins; r++) {
    for (let l = 0; l < lengthBins; l++) {
      const p = probs[offset + r * lengthBins + l];
      q += p * bins.reward_values[r];
      remaining += p * centres[l];
    }
  }
  return { q, remaining };
}

/** Token ids the grid's cells stand for. */
export function gridTokenIds(bins: CriticBins): number[] {
  return Array.from({ length: gridShape(bins).cells }, (_, c) => bins.first_token_id + c);
}

/**
 * Where a grid of `cells` tokens goes in a model: from the tokenizer's vocabulary size on (Qwen3's
 * spare embedding rows 151669–151935), and how many rows the embedding must grow by when the model
 * has fewer spare rows than cells.
 */
export function placeGrid(tokenizerVocab: number, modelVocab: number, cells: number): { firstTokenId: number; addRows: number } {
  if (tokenizerVocab > modelVocab) throw new Error(`critic grid: the tokenizer has ${tokenizerVocab} tokens, more than the model's ${modelVocab} embedding rows`);
  return { firstTokenId: tokenizerVocab, addRows: Math.max(0, tokenizerVocab + cells - modelVocab) };
}

/** The key of a checkpoint's config.json that holds its grid. */
export const CRITIC_CONFIG_KEY = 'lathe_critic';

/** The token text of grid cell (reward bin r, length bin l), as the checkpoint's tokenizer files name it. */
export function cellTokenText(r: number, l: number): string {
  return `<|critic_r${r}_l${l}|>`;
}

/** Writes JSON atomically: a temporary file renamed into place. */
function writeJson(path: string, value: unknown, indent = 2): void {
  writeFileSync(`${path}.tmp`, JSON.stringify(value, null, indent) + '\n');
  renameSync(`${path}.tmp`, path);
}

/**
 * Records the grid in a checkpoint folder: `critic_bins.json`, the `lathe_critic` key of
 * config.json, and, where the folder has Hugging Face tokenizer files, one special added token per
 * cell (`<|critic_r{r}_l{l}|>` at its id) in tokenizer.json and tokenizer_config.json, so any
 * tokenizer that loads the folder names the distribution tokens. Each file is written atomically;
 * saving again is a no-op for tokens already present.
 */
export function saveBins(dir: string, bins: CriticBins): void {
  writeJson(join(dir, CRITIC_BINS_FILE), bins);
  const configPath = join(dir, 'config.json');
  if (existsSync(configPath)) writeJson(configPath, { ...(JSON.parse(readFileSync(configPath, 'utf8')) as object), [CRITIC_CONFIG_KEY]: bins });
  const { lengthBins } = gridShape(bins);
  const cells = gridTokenIds(bins).map((id, c) => ({ id, content: cellTokenText(Math.floor(c / lengthBins), c % lengthBins) }));
  const tokenizerPath = join(dir, 'tokenizer.json');
  if (existsSync(tokenizerPath)) {
    const t = JSON.parse(readFileSync(tokenizerPath, 'utf8')) as { added_tokens?: { id: number; content: string }[] };
    const added = t.added_tokens ?? [];
    const taken = new Map(added.map((a) => [a.id, a.content]));
    for (const c of cells) {
      const had = taken.get(c.id);
      if (had !== undefined && had !== c.content) throw new Error(`${tokenizerPath}: token id ${c.id} is already '${had}', but the critic grid puts ${c.content} there`);
      if (had === undefined) added.push({ ...c, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true } as { id: number; content: string });
    }
    t.added_tokens = added;
    writeJson(tokenizerPath, t);
  }
  const tokenizerConfigPath = join(dir, 'tokenizer_config.json');
  if (existsSync(tokenizerConfigPath)) {
    const tc = JSON.parse(readFileSync(tokenizerConfigPath, 'utf8')) as { added_tokens_decoder?: Record<string, unknown> };
    const decoder = tc.added_tokens_decoder ?? {};
    for (const c of cells) decoder[String(c.id)] ??= { content: c.content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true };
    tc.added_tokens_decoder = decoder;
    writeJson(tokenizerConfigPath, tc);
  }
}

/** Reads and checks a checkpoint's grid. */
export function loadBins(dir: string): CriticBins {
  const path = join(dir, CRITIC_BINS_FILE);
  if (!existsSync(path)) throw new Error(`${path}: not found — is ${dir} a critic checkpoint (lathe critic train writes it)?`);
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, 'utf8'));
  } catch (e) {
    throw new Error(`${path}: not valid JSON (${(e as Error).message})`);
  }
  return validateBins(raw as CriticBins, path);
}

/** Whether two grids are the same (a labeller refuses a checkpoint whose grid differs from its own); a message naming the difference, or undefined. */
export function binsDifference(a: CriticBins, b: CriticBins): string | undefined {
  for (const key of ['reward_values', 'length_edges', 'first_token_id'] as const) {
    if (JSON.stringify(a[key]) !== JSON.stringify(b[key])) return `${key} differ: ${JSON.stringify(a[key])} vs ${JSON.stringify(b[key])}`;
  }
  return undefined;
}

/**
 * An embedding (or untied LM head) [rows, cols] grown by `add` rows for the grid's tokens, each new
 * row the mean of the existing ones, so new tokens start as an average token rather than noise.
 */
export function growRows(weight: Float32Array, rows: number, cols: number, add: number): Float32Array {
  if (weight.length !== rows * cols) throw new Error(`growRows: weight has ${weight.length} values, expected ${rows} × ${cols}`);
  const out = new Float32Array((rows + add) * cols);
  out.set(weight);
  const mean = new Float64Array(cols);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) mean[c] += weight[r * cols + c] / rows;
  for (let r = rows; r < rows + add; r++) for (let c = 0; c < cols; c++) out[r * cols + c] = mean[c];
  return out;
}

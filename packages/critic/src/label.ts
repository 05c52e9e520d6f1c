/**
 * Per-token Q labels by tree attention: one row holds the critic's input up to and through an
 * attempt, then every candidate token of every attempt position, each in place of the realised
 * token at that position ({@link treeMask}); one forward pass gives the critic's grid distribution
 * for the realised tokens and for all candidates, which {@link treeEstimates} marginalises.
 */
import { gridShape, marginals, type CriticBins, type CriticEstimate } from './bins';

/** A labelling row: the tokens and the layout {@link treeEstimates} reads back. */
export interface TreeRow {
  ids: number[];
  positions: number[];
  /** 1 for candidate tokens (and, once padded, padding), 0 for the main sequence. */
  isCandidate: number[];
  /** Index of the attempt's first token in `ids`. */
  attemptStart: number;
  attemptLength: number;
  /** For attempt token t, the index in `ids` of its first candidate and how many it has. */
  candidateSlots: { start: number; count: number }[];
}

/**
 * The row for `prefix` (the prompt and any in-context attempts with feedback) and `attempt`, with
 * `candidates[t]` scored in place of `attempt[t]`.
 */
export function treeRow(prefix: readonly number[], attempt: readonly number[], candidates: readonly (readonly number[])[]): TreeRow {
  if (candidates.length !== attempt.length) throw new Error(`treeRow: ${candidates.length} candidate lists for an attempt of ${attempt.length} tokens`);
  const ids = [...prefix, ...attempt];
  const positions = ids.map((_, i) => i);
  const isCandidate = ids.map(() => 0);
  const candidateSlots = candidates.map((cs, t) => {
    const start = ids.length;
    for (const c of cs) {
      ids.push(c);
      positions.push(prefix.length + t);
      isCandidate.push(1);
    }
    return { start, count: cs.length };
  });
  return { ids, positions, isCandidate, attemptStart: prefix.length, attemptLength: attempt.length, candidateSlots };
}

/** Right-padded int64 tensors of tree rows for the labelling graph (padding counts as a candidate, so it attends only itself). */
export function padTreeBatch(rows: readonly TreeRow[], padId: number): Record<'input_ids' | 'position_ids' | 'is_candidate', { data: BigInt64Array; dims: number[] }> {
  const N = Math.max(...rows.map((r) => r.ids.length));
  const B = rows.length;
  const ids = new BigInt64Array(B * N).fill(BigInt(padId));
  const pos = new BigInt64Array(B * N);
  const cand = new BigInt64Array(B * N).fill(1n);
  rows.forEach((r, b) => {
    r.ids.forEach((id, i) => {
      ids[b * N + i] = BigInt(id);
      pos[b * N + i] = BigInt(r.positions[i]);
      cand[b * N + i] = BigInt(r.isCandidate[i]);
    });
  });
  return { input_ids: { data: ids, dims: [B, N] }, position_ids: { data: pos, dims: [B, N] }, is_candidate: { data: cand, dims: [B, N] } };
}

/** Q and expected remaining length of each attempt token and each of its candidates. */
export interface TreeEstimates {
  realised: CriticEstimate[];
  candidates: CriticEstimate[][];
}

/** Reads row `b`'s estimates from the graph's `cell_probs` [B, N, cells]. */
export function treeEstimates(bins: CriticBins, probs: ArrayLike<number>, dims: readonly number[], row: TreeRow, b: number): TreeEstimates {
  const cells = gridShape(bins).cells;
  const [, N, C] = dims;
  if (C !== cells) throw new Error(`treeEstimates: cell_probs has ${C} cells, the grid ${cells}`);
  const at = (i: number) => marginals(bins, probs, (b * N + i) * C);
  return {
    realised: Array.from({ length: row.attemptLength }, (_, t) => at(row.attemptStart + t)),
    candidates: row.candidateSlots.map(({ start, count }) => Array.from({ length: count }, (_, j) => at(start + j))),
  };
}

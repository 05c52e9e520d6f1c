/**
 * How the data-parallel checks (dp-check, sft-dp) end: rank 0 compares its losses with a reference
 * run's (`--reference ONE.json`, same global batches) and every rank prints its result line, rank 0
 * also writing it to `--out`.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { arg } from '../argv';

/** The largest relative loss difference against `--reference` and whether it is within `--tol` (1e-5 in float32, 2e-2 otherwise); undefined without a reference or off rank 0. */
export function lossParity(losses: readonly number[], rank: number, compute: string): { reference_world: number; max_rel_loss_diff: number; tol: number; pass: boolean } | undefined {
  const reference = arg('reference', '');
  if (!reference || rank !== 0) return undefined;
  const ref = JSON.parse(readFileSync(reference, 'utf8')) as { losses: number[]; world: number };
  const rel = Math.max(...losses.map((l, i) => Math.abs(l - ref.losses[i]) / Math.abs(ref.losses[i])));
  const tol = Number(arg('tol', compute === 'float32' ? '1e-5' : '2e-2'));
  return { reference_world: ref.world, max_rel_loss_diff: rel, tol, pass: rel <= tol };
}

/** Prints the rank's result as one JSON line; rank 0 also writes it to `--out`. */
export function reportResult(result: object, rank: number): void {
  const line = JSON.stringify(result);
  if (rank === 0 && arg('out', '')) writeFileSync(arg('out', ''), line + '\n');
  console.log(line);
}

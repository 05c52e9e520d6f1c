/**
 * Rollout groups from trajectory rows (the trajectory schema's RL columns, read with @lathe/data's
 * `readTrajectories`), for `GrpoTrainer.stepOnRollouts`: rows grouped by `group_id` (else by
 * `prompt_idx`), in the order their groups first appear.
 */
import type { RlPrompt, RolloutGroup } from './grpo-trainer';

/** The trajectory columns a rollout group reads (a structural subset of @lathe/data's `Trajectory`). */
export interface TrajectoryRollout {
  prompt_idx: number;
  prompt: string;
  prompt_token_ids: ArrayLike<number>;
  output_token_ids: ArrayLike<number>;
  reward?: number | null;
  group_id?: number | null;
  old_logprobs?: ArrayLike<number> | null;
  output_mask?: ArrayLike<number> | null;
  finish_reason?: string | null;
}

/**
 * Groups trajectory rows into rollout groups. Every row needs a `reward`; with `groupSize`, a
 * group with another count of rows is an error naming it (without, groups may differ in size). A row's `finish_reason`
 * 'stop' marks it stopped (its last token is then the stop token); absent or 'length', not.
 */
export function rolloutGroups(rows: readonly TrajectoryRollout[], groupSize?: number): RolloutGroup<{ promptIdx: number }>[] {
  const byGroup = new Map<number, { rows: TrajectoryRollout[]; index: number[] }>();
  rows.forEach((r, i) => {
    if (r.reward === undefined || r.reward === null || !Number.isFinite(r.reward)) throw new Error(`rolloutGroups: row ${i} has no finite reward (got ${JSON.stringify(r.reward)})`);
    const key = r.group_id ?? r.prompt_idx;
    const g = byGroup.get(key) ?? { rows: [], index: [] };
    g.rows.push(r);
    g.index.push(i);
    byGroup.set(key, g);
  });
  return [...byGroup.entries()].map(([key, g]) => {
    if (groupSize !== undefined && g.rows.length !== groupSize) throw new Error(`rolloutGroups: group ${key} (rows ${g.index.join(', ')}) has ${g.rows.length} completions, expected ${groupSize}`);
    const first = g.rows[0];
    const prompt: RlPrompt<{ promptIdx: number }> = { ids: Array.from(first.prompt_token_ids), text: first.prompt, meta: { promptIdx: first.prompt_idx }, key, index: first.prompt_idx };
    g.rows.forEach((r, j) => {
      if (Array.from(r.prompt_token_ids).join() !== prompt.ids.join()) throw new Error(`rolloutGroups: group ${key}: row ${g.index[j]}'s prompt_token_ids differ from row ${g.index[0]}'s`);
    });
    return {
      prompt,
      completions: g.rows.map((r) => ({
        tokens: Array.from(r.output_token_ids),
        stopped: r.finish_reason === 'stop',
        ...(r.old_logprobs ? { logprobs: Array.from(r.old_logprobs) } : {}),
        ...(r.output_mask ? { mask: Array.from(r.output_mask) } : {}),
      })),
      rewards: g.rows.map((r) => r.reward!),
    };
  });
}

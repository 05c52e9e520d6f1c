/** The critic's training data from trajectory rows: grouping by prompt, packing that keeps every label, and bad rows named. */
import type { Trajectory } from '@lathe/data';
import { feedbackText, type CriticBins } from '@lathe/critic';
import { criticLabelCount, criticTrainingExamples, packCriticExamples, padCriticBatch } from '../src/critic-data';

const bins: CriticBins = { reward_values: [0, 1], length_edges: [0, 1, 2, 4, 8], first_token_id: 56 };
const encode = (text: string) => [...text].map((c) => 1000 + c.charCodeAt(0));
const row = (prompt_idx: number, out: number[], correct: number | null, value?: number): Trajectory => ({ prompt_idx, prompt: `p${prompt_idx}`, prompt_token_ids: [prompt_idx + 1], output_token_ids: out, correct, ...(value !== undefined ? { value } : {}) });
const opts = { bins, encode, superviseFrom: 0, ablation: 'no_feedback' as const, maxLength: 16, where: 'data.parquet' };

describe('critic training data', () => {
  test("rows group by prompt_idx into one sequence per prompt; 'value' stands in for 'correct'", () => {
    const rows = [row(0, [10, 11], 1), row(1, [20], null, 0), row(0, [12], 0)];
    const { examples, skipped, prompts } = criticTrainingExamples(rows, opts);
    expect(prompts).toBe(2);
    expect(skipped).toBe(0);
    // prompt 0: [1] [10 11] (reward 1, T 2: cells 5, 4) [12] (reward 0, T 1: cell 0)
    expect(examples).toEqual([
      { ids: [1, 10, 11, 12], labels: [-1, 5, 4, 0] },
      { ids: [2, 20], labels: [-1, 0] },
    ]);
  });

  test('feedback tokens sit between attempts in the full format', () => {
    const { examples } = criticTrainingExamples([row(0, [10], 1), row(0, [11], 0)], { ...opts, ablation: 'none', maxLength: 64 });
    expect(examples[0].ids).toEqual([1, 10, ...encode(feedbackText(1, 1)), 11]);
  });

  test('packing keeps each token with its own label, segment and position', () => {
    const examples = [
      { ids: [1, 2, 3], labels: [-1, 6, 4] },
      { ids: [4, 5, 6, 7, 8], labels: [-1, -1, 3, 2, 0] },
      { ids: [9, 9], labels: [-1, 1] },
    ];
    const rows = packCriticExamples(examples, 8);
    // best-fit decreasing: the 5-token sequence opens row 0, the 3-token one fills it, the 2-token one opens row 1
    expect(rows).toEqual([
      { ids: [4, 5, 6, 7, 8, 1, 2, 3], labels: [-1, -1, 3, 2, 0, -1, 6, 4], segmentIds: [1, 1, 1, 1, 1, 2, 2, 2], positions: [0, 1, 2, 3, 4, 0, 1, 2], examples: 2 },
      { ids: [9, 9], labels: [-1, 1], segmentIds: [1, 1], positions: [0, 1], examples: 1 },
    ]);
    expect(criticLabelCount(rows)).toBe(6);
    const batch = padCriticBatch(rows, 0);
    expect(batch.labels.dims).toEqual([2, 8]);
    expect(Array.from(batch.labels.data as BigInt64Array, Number).slice(8)).toEqual([-1, 1, -1, -1, -1, -1, -1, -1]);
    expect(Array.from(batch.segment_ids.data as BigInt64Array, Number).slice(8)).toEqual([1, 1, 0, 0, 0, 0, 0, 0]);
  });

  test('a row with no reward, or one outside [0, 1], is named', () => {
    expect(() => criticTrainingExamples([row(0, [1], null)], opts)).toThrow("data.parquet: row 0 has neither 'correct' nor 'value'");
    expect(() => criticTrainingExamples([row(0, [1], 0), row(0, [1], 1.5)], opts)).toThrow("data.parquet: row 1, column 'correct': 1.5 is outside [0, 1]");
  });

  test('attempts longer than the training length are skipped and counted; lengths past the bins are named', () => {
    const { examples, skipped } = criticTrainingExamples([row(0, Array.from({ length: 7 }, () => 3), 1), row(0, [4], 1)], { ...opts, maxLength: 6 });
    expect(skipped).toBe(1);
    expect(examples).toEqual([{ ids: [1, 4], labels: [-1, 4] }]);
    expect(() => criticTrainingExamples([row(3, Array.from({ length: 9 }, () => 3), 1)], { ...opts, maxLength: 64 })).toThrow('data.parquet: prompt_idx 3 (first row 0), attempt 0: 8 is not covered by the length bins');
  });
});

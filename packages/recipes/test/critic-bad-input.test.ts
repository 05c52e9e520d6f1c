/** Bad input to the critic commands: each error names the file, column, row, value or difference. */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { batchOf, flattenLists, listData, scalarData, writeParquet, writeTrajectories } from '@lathe/data';
import { saveBins, type CriticBins } from '@lathe/critic';
import { defaults } from '../src/options';
import { criticEvalSchema, criticLabelSchema, criticTrainSchema } from '../src/critic-config';
import { runCriticTrain } from '../src/critic';
import { criticBins, runCriticLabel } from '../src/critic-label';

const dir = mkdtempSync(join(tmpdir(), 'critic-bad-'));
const bins: CriticBins = { reward_values: [0, 1], length_edges: [0, 1, 2, 4, 8], first_token_id: 56 };

describe('critic bad input', () => {
  test('a Parquet file missing a required column names it', async () => {
    const file = join(dir, 'no-output.parquet');
    await writeParquet(file, [batchOf([
      { name: 'prompt_idx', data: scalarData('int64', [0]) },
      { name: 'prompt', data: scalarData('string', ['1+1=']) },
      { name: 'prompt_token_ids', data: listData(flattenLists([[4, 13, 4, 14]], (n) => new Int32Array(n))) },
      { name: 'correct', data: scalarData('float32', [1]) },
    ])]);
    await expect(runCriticTrain({ ...defaults(criticTrainSchema), data: file, run_dir: join(dir, 'run1'), tokenizer: 'builtin:addition', steps: 1 })).rejects.toThrow(/output_token_ids/);
  });

  test('a reward outside [0, 1] is named with its row and column', async () => {
    const file = join(dir, 'bad-reward.parquet');
    // written by hand: writeTrajectories itself refuses such a row
    await writeParquet(file, [batchOf([
      { name: 'prompt_idx', data: scalarData('int64', [0, 0]) },
      { name: 'prompt', data: scalarData('string', ['1+1=', '1+1=']) },
      { name: 'prompt_token_ids', data: listData(flattenLists([[4, 13, 4, 14], [4, 13, 4, 14]], (n) => new Int32Array(n))) },
      { name: 'output_token_ids', data: listData(flattenLists([[5, 2], [6, 2]], (n) => new Int32Array(n))) },
      { name: 'correct', data: scalarData('float32', [1, 3]) },
    ])]);
    await expect(runCriticTrain({ ...defaults(criticTrainSchema), data: file, run_dir: join(dir, 'run2'), tokenizer: 'builtin:addition', steps: 1 })).rejects.toThrow(/row 1.*correct.*3/);
  });

  test('bins that do not cover an attempt name the value', async () => {
    const file = join(dir, 'long.parquet');
    await writeTrajectories(file, [{ prompt_idx: 0, prompt: '1+1=', prompt_token_ids: [4, 13, 4, 14], output_token_ids: Array.from({ length: 20 }, () => 5), correct: 1 }]);
    await expect(runCriticTrain({ ...defaults(criticTrainSchema), data: file, run_dir: join(dir, 'run3'), tokenizer: 'builtin:addition', steps: 1, max_remaining: 8, length_bins: 3, ablation: 'no_context' })).rejects.toThrow(
      '19 is not covered by the length bins (length_edges end at 9)',
    );
  });

  test("a critic checkpoint whose grid differs from the labeller's is refused", async () => {
    const ckpt = join(dir, 'ckpt');
    mkdirSync(ckpt);
    saveBins(ckpt, bins);
    writeFileSync(join(dir, 'other.json'), JSON.stringify({ ...bins, length_edges: [0, 2, 8] }));
    expect(() => criticBins({ critic: ckpt, bins: join(dir, 'other.json') })).toThrow(`--critic ${ckpt}: its grid differs from --bins ${join(dir, 'other.json')} (length_edges differ: [0,2,8] vs [0,1,2,4,8])`);
    expect(criticBins({ critic: ckpt, bins: '' })).toEqual(bins);
    await expect(runCriticLabel({ ...defaults(criticLabelSchema), critic: ckpt, model: ckpt, data: 'x.parquet', output: join(dir, 'o.parquet'), bins: join(dir, 'other.json') })).rejects.toThrow('its grid differs');
    expect(defaults(criticEvalSchema).max_context).toBe(0);
  });
});

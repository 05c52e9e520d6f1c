import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as arrow from 'apache-arrow';
import {
  batchOf,
  flattenLists,
  listData,
  readTrajectories,
  readTrajectoryBatches,
  scalarData,
  tableToTrajectories,
  trajectoriesToBatch,
  validateTrajectories,
  writeParquet,
  writeTrajectories,
  type Trajectory,
} from '@lathe/data';
import { seededRandom } from '@lathe/models';

const dir = mkdtempSync(path.join(tmpdir(), 'lathe-traj-'));

/** RL-labelled trajectories with every column, random values from a seed. */
function trajectories(n: number, seed: number): Trajectory[] {
  const rand = seededRandom(seed);
  const int = (k: number) => Math.floor(rand() * k);
  const f32 = () => Math.fround(rand() * 4 - 2);
  return Array.from({ length: n }, (_, i) => {
    const out = Array.from({ length: 1 + int(20) }, () => int(151_936));
    const positions = out.length;
    const widths = Array.from({ length: positions }, () => 1 + int(4));
    return {
      prompt_idx: Math.floor(i / 4),
      prompt: `What is ${i} + ${i}? ∑`,
      prompt_token_ids: Int32Array.from({ length: 3 + int(10) }, () => int(151_936)),
      output_token_ids: Int32Array.from(out),
      correct: i % 2,
      value: Math.fround(rand()),
      candidate_ids: widths.map((w) => Array.from({ length: w }, () => int(151_936))),
      candidate_q_values: widths.map((w) => Array.from({ length: w }, f32)),
      candidate_ref_logprobs: widths.map((w) => Array.from({ length: w }, f32)),
      step: 7,
      group_id: Math.floor(i / 4),
      reward: Math.fround(rand()),
      rewards: { math: i % 2, format: Math.fround(rand()) },
      advantage: f32(),
      token_advantages: Array.from({ length: positions }, f32),
      old_logprobs: Array.from({ length: positions }, f32),
      ref_logprobs: Array.from({ length: positions }, f32),
      output_mask: Array.from({ length: positions }, () => int(2)),
    };
  });
}

/** Trajectories with typed arrays turned into plain arrays, for comparison. */
const plain = (ts: Trajectory[]) => JSON.parse(JSON.stringify(ts, (_k, v) => (ArrayBuffer.isView(v) ? Array.from(v as Int32Array) : v)));

describe('trajectory schema', () => {
  test('every column (DESIGN.md schema + RL columns) round-trips through Parquet exactly', async () => {
    const ts = trajectories(64, 1);
    const file = path.join(dir, 'traj.parquet');
    await writeTrajectories(file, ts);
    const back = await readTrajectories(file);
    expect(plain(back)).toEqual(plain(ts));
    const batch = trajectoriesToBatch(ts);
    expect(batch.schema.fields.map((f) => `${f.name}:${String(f.type)}`)).toEqual([
      'prompt_idx:Int64',
      'prompt:Utf8',
      'prompt_token_ids:List<Int32>',
      'output_token_ids:List<Int32>',
      'correct:Float32',
      'value:Float32',
      'candidate_ids:List<List<Int32>>',
      'candidate_q_values:List<List<Float32>>',
      'candidate_ref_logprobs:List<List<Float32>>',
      'step:Int64',
      'group_id:Int64',
      'reward:Float32',
      'advantage:Float32',
      'token_advantages:List<Float32>',
      'old_logprobs:List<Float32>',
      'ref_logprobs:List<Float32>',
      'output_mask:List<Int32>',
      'reward_format:Float32',
      'reward_math:Float32',
    ]);
  });

  test('optional columns only where some row has them; nulls where a row lacks them', async () => {
    const ts: Trajectory[] = [
      { prompt_idx: 0, prompt: 'a', prompt_token_ids: [1], output_token_ids: [2, 3], correct: 1, old_logprobs: [-0.5, -0.25], output_mask: [1, 0] },
      { prompt_idx: 1, prompt: 'b', prompt_token_ids: [], output_token_ids: [] },
    ];
    const file = path.join(dir, 'sparse.parquet');
    await writeTrajectories(file, ts);
    const back = await readTrajectories(file);
    expect(plain(back)).toEqual([
      { prompt_idx: 0, prompt: 'a', prompt_token_ids: [1], output_token_ids: [2, 3], correct: 1, old_logprobs: [-0.5, -0.25], output_mask: [1, 0] },
      { prompt_idx: 1, prompt: 'b', prompt_token_ids: [], output_token_ids: [], correct: null, old_logprobs: null, output_mask: null },
    ]);
  });

  test('streams a file in validated batches', async () => {
    const ts = trajectories(300, 2);
    const file = path.join(dir, 'big.parquet');
    await writeTrajectories(file, ts, { rowGroupSize: 64 });
    const back: Trajectory[] = [];
    for await (const b of readTrajectoryBatches(file, { batchSize: 50 })) back.push(...tableToTrajectories(b));
    expect(plain(back)).toEqual(plain(ts));
  });

  test('reads a pyarrow-written file (pyarrow defaults: dictionary pages, "element" list children, float64 value) exactly', async () => {
    // tools/reference/data/make_pyarrow_fixture.py, run with pyarrow 25.0.1 on the GPU machine; the
    // JSON holds the rows as Python wrote them.
    const fixtures = path.join(__dirname, 'fixtures');
    const file = path.join(fixtures, 'pyarrow-trajectories.parquet');
    const rows = JSON.parse(readFileSync(path.join(fixtures, 'pyarrow-trajectories.json'), 'utf8')) as Record<string, unknown>[];
    const f32 = (v: unknown): unknown => (typeof v === 'number' ? Math.fround(v) : Array.isArray(v) ? v.map(f32) : v);
    const expected = rows.map((r) => ({
      prompt_idx: r.prompt_idx,
      prompt: r.prompt,
      prompt_token_ids: r.prompt_token_ids,
      output_token_ids: r.output_token_ids,
      correct: f32(r.correct),
      value: r.value,
      candidate_ids: r.candidate_ids,
      candidate_q_values: f32(r.candidate_q_values),
      candidate_ref_logprobs: f32(r.candidate_ref_logprobs),
      step: r.step,
      group_id: r.group_id,
      old_logprobs: f32(r.old_logprobs),
      rewards: { math: r.reward_math },
    }));
    const back = await readTrajectories(file);
    expect(plain(back)).toEqual(plain(expected as unknown as Trajectory[]));
    expect(back[7].correct).toBeNull();
    expect(back[3].old_logprobs).toBeNull();
    const streamed: Trajectory[] = [];
    for await (const b of readTrajectoryBatches(file, { batchSize: 3 })) streamed.push(...tableToTrajectories(b));
    expect(plain(streamed)).toEqual(plain(back));
  });

  test('reads the DuckDB-written fixture as trajectories', async () => {
    const fixtures = path.join(__dirname, 'fixtures');
    const back = await readTrajectories(path.join(fixtures, 'duckdb-trajectories.parquet'));
    const expected = JSON.parse(readFileSync(path.join(fixtures, 'duckdb-trajectories.json'), 'utf8')) as { prompt_idx: number; output_token_ids: number[]; candidate_ids: number[][] }[];
    expect(back.map((t) => t.prompt_idx)).toEqual(expected.map((e) => e.prompt_idx));
    expect(back.map((t) => Array.from(t.output_token_ids))).toEqual(expected.map((e) => e.output_token_ids));
    expect(back.map((t) => t.candidate_ids)).toEqual(expected.map((e) => e.candidate_ids));
  });
});

describe('validation errors name the row and the column', () => {
  const base = (): Trajectory => ({ prompt_idx: 0, prompt: 'p', prompt_token_ids: [1, 2], output_token_ids: [3, 4, 5] });
  test.each([
    ['correct outside 0–1', { correct: 1.5 }, "rows.jsonl: row 2, column 'correct': expected a number in 0–1, got 1.5"],
    ['a token id over int32', { output_token_ids: [3, 2 ** 31] }, "row 2, column 'output_token_ids': element 1 is 2147483648, not an int32 token id"],
    ['a fractional prompt_idx', { prompt_idx: 0.5 }, "row 2, column 'prompt_idx': expected an integer"],
    ['per-token log-probs of the wrong length', { old_logprobs: [0, 0] }, "row 2, column 'old_logprobs': has 2 values, output_token_ids has 3"],
    ['candidate shapes that disagree', { candidate_ids: [[1, 2], [3]], candidate_q_values: [[0.1, 0.2], [0.3, 0.4]] }, "row 2, column 'candidate_q_values': position 1 has 2 candidates, candidate_ids has 1"],
    ['a reward source name with a dash', { rewards: { 'a-b': 1 } }, "row 2, column 'reward_a-b': reward source 'a-b' must be letters, digits and _"],
    ['a NaN advantage', { advantage: NaN }, "row 2, column 'advantage': expected a finite number"],
    ['an output mask of the wrong length', { output_mask: [1, 0] }, "row 2, column 'output_mask': has 2 values, output_token_ids has 3"],
    ['an output mask that is not 0 or 1', { output_mask: [1, 0, 2] }, "row 2, column 'output_mask': element 2 is 2, not 0 or 1"],
  ])('%s', (_name, patch, message) => {
    const rows = [base(), base(), { ...base(), ...patch } as Trajectory];
    expect(() => validateTrajectories(rows, 'rows.jsonl')).toThrow(message);
  });
});

describe('files with the wrong schema', () => {
  const tokens = (rows: number[][]) => listData(flattenLists(rows, (n) => new Int32Array(n)));
  test('a missing required column names the file, the column and what the file has', async () => {
    const file = path.join(dir, 'missing.parquet');
    await writeParquet(file, [batchOf([
      { name: 'prompt_idx', data: scalarData('int64', [0]) },
      { name: 'prompt', data: scalarData('string', ['p']) },
      { name: 'prompt_token_ids', data: tokens([[1]]) },
    ])]);
    await expect(readTrajectories(file)).rejects.toThrow(`${file}: missing column 'output_token_ids' (list<int32>: response token ids); the file has 'prompt_idx', 'prompt', 'prompt_token_ids'`);
  });

  test('a column of the wrong type names the file, the column, the type found and the type expected', async () => {
    const file = path.join(dir, 'wrongtype.parquet');
    await writeParquet(file, [batchOf([
      { name: 'prompt_idx', data: scalarData('int64', [0]) },
      { name: 'prompt', data: scalarData('string', ['p']) },
      { name: 'prompt_token_ids', data: tokens([[1]]) },
      { name: 'output_token_ids', data: scalarData('string', ['1 2 3']) },
    ])]);
    await expect(readTrajectories(file)).rejects.toThrow(`${file}: column 'output_token_ids' has type Utf8, expected list<int32> (response token ids)`);
    const floats = path.join(dir, 'floatlists.parquet');
    await writeParquet(floats, [batchOf([
      { name: 'prompt_idx', data: scalarData('int64', [0]) },
      { name: 'prompt', data: scalarData('string', ['p']) },
      { name: 'prompt_token_ids', data: tokens([[1]]) },
      { name: 'output_token_ids', data: tokens([[1]]) },
      { name: 'candidate_q_values', data: tokens([[1]]) },
    ])]);
    await expect(readTrajectories(floats)).rejects.toThrow(`${floats}: column 'candidate_q_values' has type List<Int32>, expected list<list<float32>>`);
  });

  test('a null in a required column and a value out of range name the row', async () => {
    const file = path.join(dir, 'nulls.parquet');
    await writeParquet(file, [batchOf([
      { name: 'prompt_idx', data: scalarData('int64', [0, 1, 2]) },
      { name: 'prompt', data: scalarData('string', ['p', null, 'q']), nullable: true },
      { name: 'prompt_token_ids', data: tokens([[1], [2], [3]]) },
      { name: 'output_token_ids', data: tokens([[1], [2], [3]]) },
    ])]);
    await expect(readTrajectories(file)).rejects.toThrow(`${file}: row 1, column 'prompt': null (the column is required)`);
    const range = path.join(dir, 'range.parquet');
    await writeParquet(range, new arrow.Table([batchOf([
      { name: 'prompt_idx', data: scalarData('int64', [0, 1]) },
      { name: 'prompt', data: scalarData('string', ['p', 'q']) },
      { name: 'prompt_token_ids', data: tokens([[1], [2]]) },
      { name: 'output_token_ids', data: tokens([[1], [2]]) },
      { name: 'correct', data: scalarData('float32', [1, 2]) },
    ])]));
    await expect(readTrajectories(range)).rejects.toThrow(`${range}: row 1, column 'correct': 2 is outside 0–1`);
  });

  test('an empty trajectory file (schema, no rows) round-trips', async () => {
    const file = path.join(dir, 'empty.parquet');
    await writeParquet(file, new arrow.Table(trajectoriesToBatch([]).schema));
    expect(await readTrajectories(file)).toEqual([]);
  });
});

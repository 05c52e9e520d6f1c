/**
 * The generation columns of the trajectory schema (`thinking`, `sample_idx`, `finish_reason`, which
 * `lathe generate` writes) and forced optional columns, which let files written in parts share one
 * schema when a part has no value in a column.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { readParquetSchema, readTrajectories, trajectoriesToBatch, validateTrajectories, writeTrajectories, type Trajectory } from '@lathe/data';

const dir = mkdtempSync(path.join(tmpdir(), 'lathe-traj-gen-'));
const plain = (ts: Trajectory[]) => JSON.parse(JSON.stringify(ts, (_k, v) => (ArrayBuffer.isView(v) ? Array.from(v as Int32Array) : v)));

test('thinking, sample_idx and finish_reason round-trip through Parquet, nulls included', async () => {
  const rows: Trajectory[] = [
    { prompt_idx: 0, prompt: 'p', prompt_token_ids: [1, 2], output_token_ids: [3], correct: 1, thinking: true, sample_idx: 0, finish_reason: 'stop' },
    { prompt_idx: 0, prompt: 'p', prompt_token_ids: [1, 4], output_token_ids: [5, 6], correct: 0, thinking: false, sample_idx: 0, finish_reason: 'length' },
    { prompt_idx: 1, prompt: 'q', prompt_token_ids: [7], output_token_ids: [8], correct: null, thinking: null, sample_idx: 1, finish_reason: null },
  ];
  const file = path.join(dir, 'gen.parquet');
  await writeTrajectories(file, rows);
  expect(plain(await readTrajectories(file))).toEqual(plain(rows));
  const fields = (await readParquetSchema(file)).fields.map((f) => `${f.name}:${String(f.type)}`);
  expect(fields.slice(-3)).toEqual(['thinking:Bool', 'sample_idx:Int64', 'finish_reason:Utf8']);
});

test('forced columns are written even when every value is null', async () => {
  const rows: Trajectory[] = [{ prompt_idx: 0, prompt: 'p', prompt_token_ids: [1], output_token_ids: [2], correct: null, thinking: null }];
  expect(trajectoriesToBatch(rows).schema.fields.map((f) => f.name)).toEqual(['prompt_idx', 'prompt', 'prompt_token_ids', 'output_token_ids']);
  const forced = trajectoriesToBatch(rows, 'part', { columns: ['correct', 'thinking'] });
  expect(forced.schema.fields.map((f) => f.name)).toEqual(['prompt_idx', 'prompt', 'prompt_token_ids', 'output_token_ids', 'correct', 'thinking']);
  const file = path.join(dir, 'forced.parquet');
  await writeTrajectories(file, rows, { columns: ['correct', 'thinking'] });
  expect(plain(await readTrajectories(file))).toEqual(plain(rows));
  expect(() => trajectoriesToBatch(rows, 'part', { columns: ['corect'] })).toThrow("part: unknown column 'corect' in options.columns");
});

test('generation columns are validated by row and column', () => {
  const base: Trajectory = { prompt_idx: 0, prompt: 'p', prompt_token_ids: [1], output_token_ids: [2] };
  expect(() => validateTrajectories([base, { ...base, sample_idx: 1.5 }], 'rows')).toThrow("rows: row 1, column 'sample_idx': expected an integer, got 1.5");
  expect(() => validateTrajectories([{ ...base, thinking: 1 as unknown as boolean }], 'rows')).toThrow("rows: row 0, column 'thinking': expected true, false or null, got 1");
  expect(() => validateTrajectories([{ ...base, finish_reason: 3 as unknown as string }], 'rows')).toThrow("rows: row 0, column 'finish_reason': expected a string, got 3");
});

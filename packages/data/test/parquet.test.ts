import { mkdtempSync, readFileSync, writeFileSync, existsSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as arrow from 'apache-arrow';
import {
  batchOf,
  flattenLists,
  flattenNested,
  listData,
  nestedListData,
  parquetInfo,
  readParquet,
  readParquetBatches,
  readParquetSchema,
  scalarData,
  writeParquet,
} from '@lathe/data';
import { seededRandom } from '@lathe/models';

const dir = mkdtempSync(path.join(tmpdir(), 'lathe-parquet-'));
const FIXTURES = path.join(__dirname, 'fixtures');

/** Random rows: int64 ids, strings (some null, some non-ASCII), token lists (some empty) and nested float lists. */
function randomRows(n: number, seed: number) {
  const rand = seededRandom(seed);
  const int = (k: number) => Math.floor(rand() * k);
  return Array.from({ length: n }, (_, i) => ({
    id: i * 1_000_003,
    text: i % 7 === 3 ? null : `row ${i} ${'é🙂'.repeat(int(3))}`,
    tokens: Array.from({ length: int(40) }, () => int(2 ** 31) - 2 ** 30),
    q: Array.from({ length: int(4) }, () => Array.from({ length: int(5) }, () => Math.fround(rand() * 10 - 5))),
  }));
}

type Row = ReturnType<typeof randomRows>[number];

function toBatch(rows: Row[]): arrow.RecordBatch {
  const q = flattenNested(rows.map((r) => r.q), (n) => new Float32Array(n));
  return batchOf([
    { name: 'id', data: scalarData('int64', rows.map((r) => r.id)) },
    { name: 'text', data: scalarData('string', rows.map((r) => r.text)), nullable: true },
    { name: 'tokens', data: listData(flattenLists(rows.map((r) => r.tokens), (n) => new Int32Array(n))) },
    { name: 'q', data: nestedListData(q.outer, q.inner) },
  ]);
}

/** A table's rows as plain JSON-able values (bigint → number, vectors → arrays). */
function plainRows(t: arrow.Table | arrow.RecordBatch): Record<string, unknown>[] {
  const plain = (v: unknown): unknown => {
    if (typeof v === 'bigint') return Number(v);
    if (v instanceof arrow.Vector) return Array.from(v.toArray() as ArrayLike<unknown>, plain);
    if (v && typeof v === 'object' && 'toArray' in v) return Array.from((v as arrow.Vector).toArray() as ArrayLike<unknown>, plain);
    return v;
  };
  const names = t.schema.fields.map((f) => f.name);
  return Array.from({ length: t.numRows }, (_, i) => Object.fromEntries(names.map((n) => [n, plain(t.getChild(n)!.get(i))])));
}

describe('Parquet round trips', () => {
  test('list<int32>, list<list<float32>>, int64, nullable strings: every value back exactly, with types', async () => {
    const rows = randomRows(500, 1);
    const file = path.join(dir, 'round.parquet');
    const w = await writeParquet(file, new arrow.Table([toBatch(rows)]), { metadata: { source: 'test' } });
    expect(w.rows).toBe(500);
    expect(w.bytes).toBe(readFileSync(file).length);
    const t = await readParquet(file);
    expect(t.schema.fields.map((f) => `${f.name}:${String(f.type)}`)).toEqual(['id:Int64', 'text:Utf8', 'tokens:List<Int32>', 'q:List<List<Float32>>']);
    expect(plainRows(t)).toEqual(rows);
    expect(await parquetInfo(file)).toEqual({ rows: 500, rowGroups: 1, metadata: { source: 'test' } });
  });

  test.each(['uncompressed', 'snappy', 'zstd', 'lz4', 'gzip'] as const)('codec %s round-trips', async (compression) => {
    const rows = randomRows(50, 2);
    const file = path.join(dir, `codec-${compression}.parquet`);
    await writeParquet(file, new arrow.Table([toBatch(rows)]), { compression, dictionary: true });
    expect(plainRows(await readParquet(file))).toEqual(rows);
  });

  test('streaming: batches from an async generator are written through row groups and stream back in order', async () => {
    const rows = randomRows(2300, 3);
    async function* batches() {
      for (let i = 0; i < rows.length; i += 170) yield toBatch(rows.slice(i, i + 170));
    }
    const file = path.join(dir, 'stream.parquet');
    const w = await writeParquet(file, batches(), { rowGroupSize: 500 });
    expect(w.rows).toBe(2300);
    expect((await parquetInfo(file)).rowGroups).toBe(5);
    const sizes: number[] = [];
    const back: Record<string, unknown>[] = [];
    for await (const b of readParquetBatches(file, { batchSize: 200 })) {
      sizes.push(b.numRows);
      back.push(...plainRows(b));
    }
    expect(Math.max(...sizes)).toBeLessThanOrEqual(200);
    expect(back).toEqual(rows);
    // Only some columns.
    const ids: number[] = [];
    for await (const b of readParquetBatches(file, { columns: ['id'] })) {
      expect(b.schema.fields.map((f) => f.name)).toEqual(['id']);
      ids.push(...Array.from(b.getChild('id')!.toArray() as BigInt64Array, Number));
    }
    expect(ids).toEqual(rows.map((r) => r.id));
    // from row 1,234: the row groups before row 1,000 are skipped; the rest stream from row 1,000 on
    const starts: number[] = [];
    const from: number[] = [];
    for await (const b of readParquetBatches(file, { columns: ['id'], fromRow: 1234, onRowGroup: (first) => starts.push(first) })) from.push(...Array.from(b.getChild('id')!.toArray() as BigInt64Array, Number));
    expect(starts).toEqual([1000, 1500, 2000]);
    expect(from).toEqual(rows.slice(1000).map((r) => r.id));
  });

  test('no temporary file is left behind and a failed write leaves no file under the name', async () => {
    const file = path.join(dir, 'fail.parquet');
    async function* bad() {
      yield toBatch(randomRows(10, 4));
      yield batchOf([{ name: 'other', data: scalarData('int32', [1]) }]);
    }
    await expect(writeParquet(file, bad())).rejects.toThrow(/fail\.parquet: .*schema/);
    expect(existsSync(file)).toBe(false);
    expect(readdirSync(dir).filter((f) => f.includes('.tmp-'))).toEqual([]);
  });
});

describe('a Parquet file written by an independent implementation (DuckDB)', () => {
  // Written by DuckDB's C++ writer (tools/reference/data/make-duckdb-fixture.mjs); the JSON file is
  // DuckDB's own export of the same rows.
  const expected = JSON.parse(readFileSync(path.join(FIXTURES, 'duckdb-trajectories.json'), 'utf8')) as Record<string, unknown>[];

  test('reads every value as DuckDB exported it (float32 compared after rounding the JSON to float32)', async () => {
    const file = path.join(FIXTURES, 'duckdb-trajectories.parquet');
    expect((await parquetInfo(file)).rows).toBe(12);
    const t = await readParquet(file);
    expect(String(t.schema.fields.find((f) => f.name === 'candidate_q_values')!.type)).toBe('List<List<Float32>>');
    expect(String(t.schema.fields.find((f) => f.name === 'output_token_ids')!.type)).toBe('List<Int32>');
    const f32 = (v: unknown): unknown => (typeof v === 'number' ? Math.fround(v) : Array.isArray(v) ? v.map(f32) : v);
    const want = expected.map((r) => ({ ...r, correct: f32(r.correct), candidate_q_values: f32(r.candidate_q_values), candidate_ref_logprobs: f32(r.candidate_ref_logprobs) }));
    expect(plainRows(t)).toEqual(want);
    const streamed: Record<string, unknown>[] = [];
    for await (const b of readParquetBatches(file, { batchSize: 5 })) streamed.push(...plainRows(b));
    expect(streamed).toEqual(want);
  });
});

describe('Parquet errors name the file and the column', () => {
  const good = path.join(dir, 'good.parquet');
  beforeAll(async () => {
    await writeParquet(good, new arrow.Table([toBatch(randomRows(100, 5))]));
  }, 60_000); // a loaded machine (CI: 2 cores) can take longer than the 5 s default

  test('a truncated file', async () => {
    const bytes = readFileSync(good);
    const cut = path.join(dir, 'cut.parquet');
    writeFileSync(cut, bytes.subarray(0, Math.floor(bytes.length * 0.6)));
    await expect(readParquet(cut)).rejects.toThrow(`${cut}: truncated or incomplete Parquet file`);
    await expect(readParquetBatches(cut).next()).rejects.toThrow(`${cut}: truncated`);
  });

  test('a file whose footer is damaged but framed', async () => {
    const bytes = Buffer.from(readFileSync(good));
    const footerLen = bytes.readUInt32LE(bytes.length - 8);
    bytes.fill(0xff, bytes.length - 8 - footerLen, bytes.length - 8);
    const bad = path.join(dir, 'footer.parquet');
    writeFileSync(bad, bytes);
    await expect(readParquet(bad)).rejects.toThrow(`${bad}: cannot read Parquet`);
  });

  test('not a Parquet file, an empty file, a missing file', async () => {
    const text = path.join(dir, 'text.parquet');
    writeFileSync(text, 'prompt,response\n1,2\n');
    await expect(readParquet(text)).rejects.toThrow(`${text}: not a Parquet file`);
    const empty = path.join(dir, 'empty.parquet');
    writeFileSync(empty, '');
    await expect(readParquet(empty)).rejects.toThrow(`${empty}: not a Parquet file (0 bytes`);
    await expect(readParquet(path.join(dir, 'nope.parquet'))).rejects.toThrow(/nope\.parquet: cannot open \(ENOENT\)/);
  });

  test('a row group too big to decode in WebAssembly memory is refused before reading, naming the file and the remedy', async () => {
    await expect(readParquet(good, { maxRowGroupBytes: 1000 })).rejects.toThrow(new RegExp(`${good.replace(/[.]/g, '\\.')}: row group 0 \\(100 rows\\) needs .* GB to decode, over the 0.000001 GB .* row_group_size=100_000`));
    expect((await readParquet(good, { columns: ['id'], maxRowGroupBytes: 5000 })).numRows).toBe(100); // only the columns read count
  });

  test('asking for a column the file lacks', async () => {
    await expect(readParquet(good, { columns: ['id', 'output_token_ids'] })).rejects.toThrow(`${good}: no column 'output_token_ids' (the file has 'id', 'text', 'tokens', 'q')`);
    await expect(readParquetBatches(good, { columns: ['nope'] }).next()).rejects.toThrow(`${good}: no column 'nope'`);
    expect((await readParquetSchema(good)).fields.map((f) => f.name)).toEqual(['id', 'text', 'tokens', 'q']);
  });
});

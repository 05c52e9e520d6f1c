import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as arrow from 'apache-arrow';
import * as pw from 'parquet-wasm';
import { batchOf, flattenLists, listData, readParquet, readParquetBatches, scalarData, writeParquet } from '@lathe/data';

const dir = mkdtempSync(path.join(tmpdir(), 'lathe-parquet-damaged-'));
const good = path.join(dir, 'good.parquet');
const ROWS = 300;
const GROUP = 100;

/** A Thrift compact-protocol struct read from `buf` at `pos`: integer and struct fields by field id, others skipped; `end` is where it stops. */
function readThrift(buf: Buffer, pos: number): { fields: Map<number, unknown>; end: number } {
  const varint = (): bigint => {
    let v = 0n;
    for (let shift = 0n; ; shift += 7n) {
      const b = buf[pos++];
      v |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  const zigzag = () => {
    const v = varint();
    return Number((v >> 1n) ^ -(v & 1n));
  };
  const value = (type: number): unknown => {
    if (type === 1 || type === 2) return type === 1; // a struct field's boolean lives in its type
    if (type === 3) return buf[pos++];
    if (type === 4 || type === 5 || type === 6) return zigzag();
    if (type === 7) return (pos += 8), undefined;
    if (type === 8) return (pos += Number(varint())), undefined;
    if (type === 9 || type === 10) {
      const head = buf[pos++];
      const n = head >> 4 === 15 ? Number(varint()) : head >> 4;
      for (let i = 0; i < n; i++) {
        if ((head & 15) === 1 || (head & 15) === 2) pos++; // a list's booleans take a byte each
        else value(head & 15);
      }
      return undefined;
    }
    if (type === 11) {
      const n = Number(varint());
      const kv = n ? buf[pos++] : 0;
      for (let i = 0; i < n; i++) {
        value(kv >> 4);
        value(kv & 15);
      }
      return undefined;
    }
    if (type === 12) return struct();
    throw new Error(`thrift type ${type} at ${pos}`);
  };
  const struct = (): Map<number, unknown> => {
    const fields = new Map<number, unknown>();
    for (let id = 0; ; ) {
      const head = buf[pos++];
      if (head === 0) return fields;
      id = head >> 4 ? id + (head >> 4) : zigzag();
      fields.set(id, value(head & 15));
    }
  };
  const fields = struct();
  return { fields, end: pos };
}

interface Page {
  group: number;
  column: string;
  /** Page type: 0 data, 2 dictionary, 3 data v2. */
  type: number;
  /** The page's (compressed) bytes after its header. */
  start: number;
  size: number;
}

/**
 * Every page of the file, found by walking its page headers from the leading `PAR1` (independently
 * of the reader): a column chunk's pages follow one another until they hold its value count.
 */
async function pages(file: string): Promise<Page[]> {
  const bytes = readFileSync(file);
  const pf = await pw.ParquetFile.fromFile(new Blob([bytes]));
  const out: Page[] = [];
  try {
    const meta = pf.metadata();
    let pos = 4;
    for (let g = 0; g < meta.numRowGroups(); g++) {
      for (const c of meta.rowGroup(g).columns()) {
        for (let values = 0; values < Number(c.numValues()); ) {
          const { fields, end } = readThrift(bytes, pos);
          const type = fields.get(1) as number;
          const size = fields.get(3) as number;
          const header = (fields.get(5) ?? fields.get(8)) as Map<number, unknown> | undefined;
          if (type !== 2) values += header!.get(1) as number;
          out.push({ group: g, column: c.columnPath()[0], type, start: end, size });
          pos = end + size;
        }
      }
    }
    return out;
  } finally {
    pf.free();
  }
}

/** A copy of the good file with 16 bytes flipped in the middle of the first data page of one column chunk. */
async function damage(name: string, group: number, column: string): Promise<string> {
  const page = (await pages(good)).find((p) => p.group === group && p.column === column && p.type !== 2)!;
  const bytes = Buffer.from(readFileSync(good));
  const mid = page.start + Math.floor(page.size / 2) - 8;
  for (let i = mid; i < mid + 16; i++) bytes[i] ^= 0xff;
  const file = path.join(dir, name);
  writeFileSync(file, bytes);
  return file;
}

beforeAll(async () => {
  const rows = Array.from({ length: ROWS }, (_, i) => ({ id: i, text: `row ${i}: some text`, tokens: Array.from({ length: 20 }, (_, j) => i * 31 + j) }));
  const batch = batchOf([
    { name: 'id', data: scalarData('int64', rows.map((r) => r.id)) },
    { name: 'text', data: scalarData('string', rows.map((r) => r.text)) },
    { name: 'tokens', data: listData(flattenLists(rows.map((r) => r.tokens), (n) => new Int32Array(n))) },
  ]);
  await writeParquet(good, new arrow.Table([batch]), { rowGroupSize: GROUP }); // snappy: a damaged page fails to decompress
}, 60_000);

describe('a Parquet file with a damaged data page', () => {
  test('the page walk the damage relies on finds every column chunk of the three row groups, ending before the footer', async () => {
    const found = await pages(good);
    expect([...new Set(found.map((p) => `${p.group}:${p.column}`))]).toEqual(['0:id', '0:text', '0:tokens', '1:id', '1:text', '1:tokens', '2:id', '2:text', '2:tokens']);
    expect(found.every((p) => p.type === 0 && p.size > 16)).toBe(true); // plain data pages (no dictionary)
    const bytes = readFileSync(good);
    const last = found.at(-1)!;
    expect(last.start + last.size).toBeLessThanOrEqual(bytes.length - 8 - bytes.readUInt32LE(bytes.length - 8));
  });

  test('readParquet rejects with an error naming the file and the row group, and the process lives on', async () => {
    const bad = await damage('page1.parquet', 1, 'text');
    const err = await readParquet(bad).then(
      () => null,
      (e: unknown) => e as Error,
    );
    expect(err).toBeInstanceOf(Error);
    expect(err!.message).toMatch(new RegExp(`^${bad.replace(/[.]/g, '\\.')}: row group 1 \\(rows 100–199\\) cannot be decoded`));
    expect(err!.message).toMatch(/damaged/);
  });

  test('streaming yields the intact row groups before the error, which names the damaged one', async () => {
    const bad = await damage('page2.parquet', 2, 'id');
    const ids: number[] = [];
    let error: Error | null = null;
    try {
      for await (const b of readParquetBatches(bad, { batchSize: 50 })) ids.push(...Array.from(b.getChild('id')!.toArray() as BigInt64Array, Number));
    } catch (e) {
      error = e as Error;
    }
    expect(ids).toEqual(Array.from({ length: 200 }, (_, i) => i));
    expect(error?.message).toMatch(new RegExp(`^${bad.replace(/[.]/g, '\\.')}: row group 2 \\(rows 200–299\\) cannot be decoded`));
  });

  test('a good file still reads after a damaged one', async () => {
    const t = await readParquet(good);
    expect(t.numRows).toBe(ROWS);
    expect(Array.from(t.getChild('id')!.toArray() as BigInt64Array, Number)).toEqual(Array.from({ length: ROWS }, (_, i) => i));
  });
});

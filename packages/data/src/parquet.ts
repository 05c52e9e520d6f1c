/**
 * Parquet in and out through parquet-wasm (the Rust arrow-rs/parquet implementation compiled to
 * WebAssembly, no install scripts). Whole files read into an Arrow table; big files stream in record
 * batches from a file-backed Blob (only the row groups being read are in memory); writes stream
 * record batches through row groups into a temporary file renamed into place, so a crash never
 * leaves a half-written file under the final name. Errors name the file (and the column).
 */
import { existsSync, writeFileSync, openAsBlob, readSync, fstatSync, renameSync, rmSync, statSync } from 'node:fs';
import { open } from 'node:fs/promises';
import * as arrow from 'apache-arrow';
import * as pw from 'parquet-wasm';
import { parseTable } from 'arrow-js-ffi';
import { withOpenFile } from './files';

/** Compression codecs for writing. */
export type ParquetCompression = 'uncompressed' | 'snappy' | 'zstd' | 'lz4' | 'gzip';

/** Options for {@link writeParquet}. */
export interface ParquetWriteOptions {
  /** Codec of every column (default `snappy`, as pyarrow). */
  compression?: ParquetCompression;
  /** Rows per row group (default 16,384): bounds the writer's memory and is the unit of streaming reads. */
  rowGroupSize?: number;
  /**
   * Dictionary encoding (default false). arrow-rs's dictionary encoder is slow on token columns
   * (high-cardinality integers) and gains little there; strings with few distinct values benefit.
   */
  dictionary?: boolean;
  /** Key/value metadata stored in the file footer. */
  metadata?: Record<string, string>;
}

/** Options for reading. */
export interface ParquetReadOptions {
  /** Read only these columns (an unknown name is an error naming the file and column). */
  columns?: string[];
  /** Refuse row groups that need more bytes than this to decode (default {@link MAX_ROW_GROUP_BYTES}). */
  maxRowGroupBytes?: number;
}

const CODECS: Record<ParquetCompression, pw.Compression> = {
  uncompressed: pw.Compression.UNCOMPRESSED,
  snappy: pw.Compression.SNAPPY,
  zstd: pw.Compression.ZSTD,
  lz4: pw.Compression.LZ4_RAW,
  gzip: pw.Compression.GZIP,
};

const MAGIC = 'PAR1';

/**
 * Checks the file's framing before parsing (so a truncated or foreign file gets a plain message):
 * `PAR1` at both ends and a footer length that fits. Returns the file size.
 */
export function checkParquetFraming(file: string): number {
  return withOpenFile(file, (fd) => {
    const size = fstatSync(fd).size;
    if (size < 12) throw new Error(`${file}: not a Parquet file (${size} bytes; a Parquet file has at least 12)`);
    const head = Buffer.alloc(4);
    const tail = Buffer.alloc(8);
    readSync(fd, head, 0, 4, 0);
    readSync(fd, tail, 0, 8, size - 8);
    if (head.toString('latin1') !== MAGIC) throw new Error(`${file}: not a Parquet file (it does not start with ${MAGIC})`);
    if (tail.toString('latin1', 4) !== MAGIC) throw new Error(`${file}: truncated or incomplete Parquet file (no ${MAGIC} footer at the end of its ${size} bytes; was it still being written?)`);
    const footer = tail.readUInt32LE(0);
    if (footer + 12 > size) throw new Error(`${file}: corrupt Parquet file (footer length ${footer} exceeds the file size ${size})`);
    return size;
  });
}

/**
 * A parquet-wasm table as an Arrow JS table, copied out of WebAssembly memory through the Arrow C
 * data interface (arrow-js-ffi: one copy of the buffers, where an IPC round trip would serialise and
 * parse them). Frees the wasm table.
 */
function fromWasm(t: pw.Table): arrow.Table {
  const schema = arrow.tableFromIPC(t.schema.intoIPCStream()).schema;
  if (t.numBatches === 0) {
    t.free();
    return new arrow.Table(schema);
  }
  const ffi = t.intoFFI();
  try {
    const table = parseTable(pw.wasmMemory().buffer, ffi.arrayAddrs(), ffi.schemaAddr(), true);
    // Keep the file's schema (field nullability and metadata) on the copied batches.
    return new arrow.Table(schema, table.batches.map((b: arrow.RecordBatch) => new arrow.RecordBatch(schema, b.data)));
  } finally {
    ffi.drop();
  }
}

function wasmError(file: string, e: unknown): Error {
  const msg = e instanceof Error ? e.message : String(e);
  return new Error(`${file}: cannot read Parquet (${msg})`);
}

/** A WebAssembly trap: how a Rust panic inside parquet-wasm surfaces (`RuntimeError: unreachable`). */
function isWasmTrap(e: unknown): e is Error {
  return e instanceof Error && e.name === 'RuntimeError' && /wasm/.test(e.stack ?? '');
}

/** The end of the wasm call now in flight: reads queue behind it so that a trap is blamed on the read that caused it. */
let wasmCallDone: Promise<void> = Promise.resolve();

/**
 * Runs one asynchronous parquet-wasm call, turning a WebAssembly trap into a rejection made by
 * `onTrap`. parquet-wasm drives its futures from queued microtasks, so a panic (a damaged page that
 * fails to decompress, say) reaches no caller: it is an uncaught exception that ends the process,
 * and the call's promise never settles. While the call runs, the process's uncaught-exception
 * capture takes such traps; any other uncaught exception is thrown again as it would have been.
 */
async function guardWasm<T>(call: () => Promise<T>, onTrap: (trap: Error) => Error): Promise<T> {
  const before = wasmCallDone;
  let done!: () => void;
  wasmCallDone = new Promise((resolve) => (done = resolve));
  await before;
  // Another capture (the domain module's) owns the process's uncaught exceptions: run unguarded.
  if (process.hasUncaughtExceptionCaptureCallback()) {
    try {
      return await call();
    } finally {
      done();
    }
  }
  try {
    return await new Promise<T>((resolve, reject) => {
      const release = () => process.setUncaughtExceptionCaptureCallback(null);
      process.setUncaughtExceptionCaptureCallback((e) => {
        release();
        if (isWasmTrap(e)) reject(onTrap(e));
        else
          setImmediate(() => {
            throw e;
          });
      });
      call().then(
        (v) => (release(), resolve(v)),
        (e: unknown) => (release(), reject(e)),
      );
    });
  } finally {
    done();
  }
}

function freeQuietly(pf: pw.ParquetFile): void {
  try {
    pf.free();
  } catch {
    // the trap's error is the one to report
  }
}

/** The error for a trap while decoding row group `g` (rows `first`…): a damaged page, most likely. */
function rowGroupTrap(file: string, g: number, first: number, rows: number, columns: string[] | undefined, trap: Error): Error {
  const which = columns ? ` (columns ${columns.map((c) => `'${c}'`).join(', ')})` : '';
  return new Error(
    `${file}: row group ${g} (rows ${first}–${first + rows - 1}) cannot be decoded${which}: a page in it is damaged (parquet-wasm stopped with "${trap.name}: ${trap.message}" ` +
      `decompressing or decoding it); re-create the file, or check it with pyarrow: pq.ParquetFile(path).read_row_group(${g})`,
  );
}

function checkColumns(file: string, schema: arrow.Schema, columns?: string[]): void {
  if (!columns) return;
  const names = new Set(schema.fields.map((f) => f.name));
  for (const c of columns) if (!names.has(c)) throw new Error(`${file}: no column '${c}' (the file has ${[...names].map((n) => `'${n}'`).join(', ')})`);
}

/** Opens a Parquet file for reading (its framing checked first); errors name the file. */
async function openParquet(file: string): Promise<pw.ParquetFile> {
  checkParquetFraming(file);
  const blob = await openAsBlob(file);
  try {
    return await guardWasm(() => pw.ParquetFile.fromFile(blob), (trap) => new Error(`${file}: corrupt Parquet file (its footer cannot be decoded: parquet-wasm stopped with "${trap.name}: ${trap.message}")`));
  } catch (e) {
    throw (e as Error).message.startsWith(`${file}:`) ? e : wasmError(file, e);
  }
}

/** The Arrow schema of a Parquet file (reads only its footer). */
export async function readParquetSchema(file: string): Promise<arrow.Schema> {
  const pf = await openParquet(file);
  try {
    const s = pf.schema();
    return arrow.tableFromIPC(s.intoIPCStream()).schema;
  } finally {
    pf.free();
  }
}

/**
 * Reads a whole Parquet file (or some of its columns) into an Arrow table, one row group at a time
 * (the file itself is never copied into WebAssembly memory whole).
 */
export async function readParquet(file: string, options: ParquetReadOptions = {}): Promise<arrow.Table> {
  const batches: arrow.RecordBatch[] = [];
  let schema: arrow.Schema | undefined;
  for await (const b of readParquetBatches(file, { ...options, batchSize: 65536, onSchema: (s) => (schema = s) })) batches.push(b);
  return new arrow.Table(schema!, batches);
}

/**
 * The most bytes (compressed + uncompressed, of the columns read) one row group may hold: parquet-wasm
 * decodes a row group at once inside WebAssembly's 4 GB memory.
 */
export const MAX_ROW_GROUP_BYTES = 1.5e9;

function checkRowGroupSize(file: string, g: number, rg: pw.RowGroupMetaData, columns: string[] | undefined, max: number): void {
  let bytes = 0;
  for (const c of rg.columns()) {
    if (!columns || columns.includes(c.columnPath()[0])) bytes += c.compressedSize() + c.uncompressedSize();
  }
  if (bytes > max) {
    throw new Error(
      `${file}: row group ${g} (${rg.numRows()} rows) needs ${(bytes / 1e9).toFixed(2)} GB to decode, over the ${max / 1e9} GB a row group may take in WebAssembly memory; ` +
        'rewrite the file with smaller row groups (pyarrow: pq.write_table(t, path, row_group_size=100_000); its default is 1Mi rows) or read fewer columns',
    );
  }
}

/** Number of rows and row groups of a Parquet file (from its footer). */
export async function parquetInfo(file: string): Promise<{ rows: number; rowGroups: number; metadata: Record<string, string> }> {
  const pf = await openParquet(file);
  try {
    const meta = pf.metadata();
    const fm = meta.fileMetadata();
    const kv = fm.keyValueMetadata() as Map<string, string | undefined>;
    const metadata: Record<string, string> = {};
    for (const [k, v] of kv) if (k !== 'ARROW:schema' && v !== undefined) metadata[k] = v;
    return { rows: Number(fm.numRows()), rowGroups: meta.numRowGroups(), metadata };
  } finally {
    pf.free();
  }
}

/**
 * Streams a Parquet file as Arrow record batches of up to `batchSize` rows (default 8,192), reading
 * one row group at a time from disk: files larger than memory are fine.
 */
export async function* readParquetBatches(
  file: string,
  options: ParquetReadOptions & {
    batchSize?: number;
    onSchema?: (schema: arrow.Schema) => void;
    /** Skip the row groups wholly before this row (never decoded): the first batch then starts at its row group's first row, which `onRowGroup` tells. */
    fromRow?: number;
    /** Called before each row group's batches with the file row its first batch starts at. */
    onRowGroup?: (firstRow: number) => void;
  } = {},
): AsyncGenerator<arrow.RecordBatch> {
  const pf = await openParquet(file);
  let trapped = false;
  try {
    const meta = pf.metadata();
    const groups = meta.numRowGroups();
    const fileSchema = arrow.tableFromIPC(pf.schema().intoIPCStream()).schema;
    if (options.columns) checkColumns(file, fileSchema, options.columns);
    const schema = options.columns ? new arrow.Schema(options.columns.map((c) => fileSchema.fields.find((f) => f.name === c)!), fileSchema.metadata) : fileSchema;
    options.onSchema?.(schema);
    let first = 0;
    for (let g = 0; g < groups; g++) {
      const rg = meta.rowGroup(g);
      const rows = Number(rg.numRows());
      if (options.fromRow !== undefined && first + rows <= options.fromRow) {
        first += rows;
        continue;
      }
      checkRowGroupSize(file, g, rg, options.columns, options.maxRowGroupBytes ?? MAX_ROW_GROUP_BYTES);
      options.onRowGroup?.(first);
      let t: pw.Table;
      try {
        t = await guardWasm(
          () => pf.read({ rowGroups: [g], batchSize: options.batchSize ?? 8192, ...(options.columns ? { columns: options.columns } : {}) }),
          (trap) => {
            trapped = true;
            return rowGroupTrap(file, g, first, rows, options.columns, trap);
          },
        );
      } catch (e) {
        throw trapped ? e : wasmError(file, e);
      }
      for (const b of fromWasm(t).batches) yield b;
      first += rows;
    }
  } finally {
    if (!trapped) pf.free();
    else freeQuietly(pf); // after a trap the file's wasm state may be inconsistent: freeing it must not hide the error
  }
}

type BatchSource = arrow.Table | Iterable<arrow.RecordBatch> | AsyncIterable<arrow.RecordBatch>;

/** Arrow JS batches to parquet-wasm batches (through Arrow IPC). */
function toWasmBatches(batches: arrow.RecordBatch[]): pw.RecordBatch[] {
  const t = pw.Table.fromIPCStream(arrow.tableToIPC(new arrow.Table(batches), 'stream'));
  try {
    return t.recordBatches();
  } finally {
    t.free();
  }
}

/**
 * Writes Arrow data to a Parquet file: a table, or an (async) iterable of record batches that is
 * consumed as it is written (memory stays bounded by one row group). The file appears under its
 * name only once complete (written to `file.tmp-<pid>`, synced, renamed). All batches must share
 * one schema. Returns the rows and bytes written.
 */
export async function writeParquet(file: string, data: BatchSource, options: ParquetWriteOptions = {}): Promise<{ rows: number; bytes: number }> {
  const props = new pw.WriterPropertiesBuilder()
    .setCompression(CODECS[options.compression ?? 'snappy'])
    .setMaxRowGroupSize(options.rowGroupSize ?? 16384)
    .setDictionaryEnabled(options.dictionary ?? false)
    .setCreatedBy('lathe (parquet-wasm)');
  const withMeta = options.metadata ? props.setKeyValueMetadata(new Map(Object.entries(options.metadata))) : props;
  if (data instanceof arrow.Table && data.numRows === 0) return writeEmpty(file, data, withMeta.build());
  const source: Iterable<arrow.RecordBatch> | AsyncIterable<arrow.RecordBatch> = data instanceof arrow.Table ? data.batches : data;
  const it = Symbol.asyncIterator in source ? source[Symbol.asyncIterator]() : (source as Iterable<arrow.RecordBatch>)[Symbol.iterator]();
  let rows = 0;
  let schema: arrow.Schema | undefined;
  const pending: pw.RecordBatch[] = [];
  let failure: Error | null = null;
  const input = new ReadableStream<pw.RecordBatch>(
    {
    async pull(controller) {
      try {
        await fill(controller);
      } catch (e) {
        // Kept and rethrown after the pipe: parquet-wasm may end its output quietly on an input error.
        failure = e instanceof Error ? e : new Error(String(e));
        controller.error(failure);
      }
    },
    },
    { highWaterMark: 0 }, // pull only when the writer reads: nothing is queued ahead of it
  );
  const fill = async (controller: ReadableStreamDefaultController<pw.RecordBatch>) => {
    while (pending.length === 0) {
      const next = await it.next();
      if (next.done) {
        controller.close();
        return;
      }
      const b = next.value;
      if (!schema) schema = b.schema;
      else if (!sameSchema(schema, b.schema)) throw new Error(`${file}: record batch ${rows} rows in has schema ${describeSchema(b.schema)}, the first had ${describeSchema(schema)}`);
      if (b.numRows === 0) continue;
      rows += b.numRows;
      pending.push(...toWasmBatches([b]));
    }
    // The writer takes ownership of each batch (and frees it).
    controller.enqueue(pending.shift()!);
  };
  const tmp = `${file}.tmp-${process.pid}`;
  try {
    const output = await pw.transformParquetStream(input, withMeta.build());
    const out = await open(tmp, 'w');
    try {
      const reader = (output as ReadableStream<Uint8Array>).getReader();
      for (;;) {
        const { done, value } = await reader.read().catch((e: unknown) => {
          throw failure ?? e;
        });
        if (done) break;
        await out.write(value);
      }
      await out.sync();
    } finally {
      await out.close();
    }
    if (failure) throw failure;
    if (!schema) {
      // No batches at all: parquet-wasm needs one to know the schema.
      throw new Error(`${file}: nothing to write (no record batches; write an empty table with a schema instead)`);
    }
    const bytes = statSync(tmp).size;
    renameSync(tmp, file);
    return { rows, bytes };
  } catch (e) {
    if (existsSync(tmp)) rmSync(tmp, { force: true });
    const msg = e instanceof Error ? e.message : String(e);
    throw new Error(msg.startsWith(`${file}:`) ? msg : `${file}: cannot write Parquet (${msg})`);
  }
}

/** A table with a schema and no rows (the streaming writer needs a first batch to learn the schema). */
function writeEmpty(file: string, table: arrow.Table, props: pw.WriterProperties): { rows: number; bytes: number } {
  const tmp = `${file}.tmp-${process.pid}`;
  try {
    const bytes = pw.writeParquet(pw.Table.fromIPCStream(arrow.tableToIPC(table, 'stream')), props);
    writeFileSync(tmp, bytes);
    renameSync(tmp, file);
    return { rows: 0, bytes: bytes.length };
  } catch (e) {
    rmSync(tmp, { force: true });
    throw new Error(`${file}: cannot write Parquet (${e instanceof Error ? e.message : String(e)})`);
  }
}

function sameSchema(a: arrow.Schema, b: arrow.Schema): boolean {
  return a.fields.length === b.fields.length && a.fields.every((f, i) => f.name === b.fields[i].name && String(f.type) === String(b.fields[i].type));
}

function describeSchema(s: arrow.Schema): string {
  return `{${s.fields.map((f) => `${f.name}: ${String(f.type)}`).join(', ')}}`;
}

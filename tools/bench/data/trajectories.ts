/**
 * Trajectory Parquet throughput: writes N rows of the trajectory schema (prompt_idx int64, prompt
 * string, prompt_token_ids list<int32> of 64, output_token_ids list<int32> of 448–576 (mean 512),
 * correct float32) as a stream of record batches, then streams the file back and checks the sum of
 * every token id. Rows come from a pool of 8 pre-built batches of 8,192 rows (different random
 * tokens; prompt_idx renumbered per batch), so the timings are the write and read paths, not the
 * generator. Snappy, no dictionary, 16,384-row groups: the same settings as
 * tools/reference/data/pyarrow_bench.py, which does the same in pyarrow.
 *
 * Usage: npx tsx --conditions=lathe-source tools/bench/data/trajectories.ts [--rows 1000000] [--dir /tmp] [--keep]
 *        … trajectories.ts --read FILE   (stream another tool's file: rows, token-id sum, time)
 * Prints one JSON line.
 */
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as arrow from 'apache-arrow';
import { batchOf, listData, parquetInfo, readParquetBatches, scalarData, writeParquet } from '@lathe/data';
import { seededRandom } from '@lathe/models';
import { arg, flag } from '../argv';

const BATCH = 8192;
const POOL = 8;
const PROMPT_TOKENS = 64;


interface PoolBatch {
  prompt: arrow.Data;
  promptTokens: arrow.Data;
  outputTokens: arrow.Data;
  correct: arrow.Data;
  /** Token-id sum and data bytes of the first i rows (i = 0..BATCH). */
  sumUpTo: Float64Array;
  bytesUpTo: Float64Array;
}

function poolBatch(seed: number): PoolBatch {
  const rand = seededRandom(seed);
  const lens = Array.from({ length: BATCH }, () => 448 + Math.floor(rand() * 129));
  const offsets = new Int32Array(BATCH + 1);
  for (let i = 0; i < BATCH; i++) offsets[i + 1] = offsets[i] + lens[i];
  const out = Int32Array.from({ length: offsets[BATCH] }, () => Math.floor(rand() * 151_936));
  const pOffsets = Int32Array.from({ length: BATCH + 1 }, (_, i) => i * PROMPT_TOKENS);
  const pTokens = Int32Array.from({ length: BATCH * PROMPT_TOKENS }, () => Math.floor(rand() * 151_936));
  const prompts = Array.from({ length: BATCH }, (_, i) => `Solve problem ${seed * BATCH + i}: what is x?`);
  const correct = Array.from({ length: BATCH }, () => (rand() < 0.5 ? 0 : 1));
  const sumUpTo = new Float64Array(BATCH + 1);
  const bytesUpTo = new Float64Array(BATCH + 1);
  for (let i = 0; i < BATCH; i++) {
    let s = 0;
    for (let k = offsets[i]; k < offsets[i + 1]; k++) s += out[k];
    for (let k = i * PROMPT_TOKENS; k < (i + 1) * PROMPT_TOKENS; k++) s += pTokens[k];
    sumUpTo[i + 1] = sumUpTo[i] + s;
    // Token ids, two list offsets, the prompt's UTF-8 bytes and offset, prompt_idx, correct.
    bytesUpTo[i + 1] = bytesUpTo[i] + 4 * (lens[i] + PROMPT_TOKENS) + 8 + Buffer.byteLength(prompts[i]) + 4 + 8 + 4;
  }
  return {
    prompt: scalarData('string', prompts),
    promptTokens: listData({ values: pTokens, offsets: pOffsets }),
    outputTokens: listData({ values: out, offsets }),
    correct: scalarData('float32', correct),
    sumUpTo,
    bytesUpTo,
  };
}

/** Streams a file written elsewhere (e.g. by pyarrow) and sums its token ids. */
async function readOnly(file: string): Promise<void> {
  const t = performance.now();
  let rows = 0;
  let sum = 0;
  for await (const b of readParquetBatches(file, { batchSize: BATCH })) {
    rows += b.numRows;
    sum += tokenSum(b);
  }
  const s = (performance.now() - t) / 1000;
  const info = await parquetInfo(file);
  console.log(JSON.stringify({ tool: 'lathe (parquet-wasm 0.8.0)', read: file, rows, row_groups: info.rowGroups, token_sum: sum, read_s: Number(s.toFixed(2)), read_rows_per_s: Math.round(rows / s), peak_rss_mb: Math.round(process.resourceUsage().maxRSS / 1024) }));
}

function tokenSum(b: arrow.RecordBatch): number {
  let sum = 0;
  for (const col of ['prompt_token_ids', 'output_token_ids']) {
    for (const d of b.getChild(col)!.data) {
      const values = d.children[0].values as Int32Array;
      const offsets = d.valueOffsets;
      for (let i = offsets[0]; i < offsets[d.length]; i++) sum += values[i];
    }
  }
  return sum;
}

async function main(): Promise<void> {
  const other = process.argv.indexOf('--read');
  if (other >= 0) return readOnly(process.argv[other + 1]);
  const rows = Number(arg('rows', '1000000'));
  const dir = mkdtempSync(path.join(arg('dir', tmpdir()), 'lathe-bench-data-'));
  const file = path.join(dir, 'trajectories.parquet');
  const pool = Array.from({ length: POOL }, (_, k) => poolBatch(k + 1));
  const nBatches = Math.ceil(rows / BATCH);
  let expectedSum = 0;
  let logicalBytes = 0;
  function* batches(): Generator<arrow.RecordBatch> {
    for (let b = 0; b < nBatches; b++) {
      const p = pool[b % POOL];
      const n = Math.min(BATCH, rows - b * BATCH);
      const ids = scalarData('int64', Array.from({ length: BATCH }, (_, i) => b * BATCH + i));
      let batch = batchOf([
        { name: 'prompt_idx', data: ids },
        { name: 'prompt', data: p.prompt },
        { name: 'prompt_token_ids', data: p.promptTokens },
        { name: 'output_token_ids', data: p.outputTokens },
        { name: 'correct', data: p.correct },
      ]);
      if (n < BATCH) batch = batch.slice(0, n);
      expectedSum += p.sumUpTo[n];
      logicalBytes += p.bytesUpTo[n];
      yield batch;
    }
  }

  const t0 = performance.now();
  const w = await writeParquet(file, batches(), { compression: 'snappy', rowGroupSize: 16384, dictionary: false });
  const writeS = (performance.now() - t0) / 1000;

  const t1 = performance.now();
  let readRows = 0;
  let sum = 0;
  for await (const b of readParquetBatches(file, { batchSize: BATCH })) {
    readRows += b.numRows;
    sum += tokenSum(b);
  }
  const readS = (performance.now() - t1) / 1000;
  if (readRows !== rows || sum !== expectedSum) throw new Error(`read back ${readRows} rows, token sum ${sum}; expected ${rows}, ${expectedSum}`);
  const info = await parquetInfo(file);
  const fileBytes = statSync(file).size;
  if (!flag('keep')) rmSync(dir, { recursive: true, force: true });
  const mb = logicalBytes / 1e6;
  console.log(
    JSON.stringify({
      tool: 'lathe (parquet-wasm 0.8.0)',
      rows,
      row_groups: info.rowGroups,
      data_mb: Number(mb.toFixed(1)),
      file_mb: Number((fileBytes / 1e6).toFixed(1)),
      written_bytes: w.bytes,
      write_s: Number(writeS.toFixed(2)),
      write_rows_per_s: Math.round(rows / writeS),
      write_mb_per_s: Number((mb / writeS).toFixed(1)),
      read_s: Number(readS.toFixed(2)),
      read_rows_per_s: Math.round(rows / readS),
      read_mb_per_s: Number((mb / readS).toFixed(1)),
      token_sum_ok: true,
      peak_rss_mb: Math.round(process.resourceUsage().maxRSS / 1024),
      ...(flag('keep') ? { file } : {}),
    }),
  );
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.message : String(e));
  process.exit(1);
});

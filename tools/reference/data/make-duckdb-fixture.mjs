#!/usr/bin/env node
// Writes the independent-writer Parquet fixture of @lathe/data's tests with DuckDB (its own C++
// Parquet writer, unrelated to the arrow-rs code in parquet-wasm), plus DuckDB's JSON export of the
// same rows as the expected values. DuckDB is not a project dependency; run it from a scratch folder:
//
//   d=$(mktemp -d) && (cd $d && npm init -y >/dev/null && npm install --ignore-scripts @duckdb/node-api@1.5.6-r.1) \
//     && NODE_PATH=$d/node_modules node tools/reference/data/make-duckdb-fixture.mjs packages/data/test/fixtures
//
// Output: duckdb-trajectories.parquet (snappy) and duckdb-trajectories.json.
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';
import { readFileSync, writeFileSync, renameSync } from 'node:fs';

const require = createRequire(join(process.env.NODE_PATH ?? process.cwd(), 'x.js'));
const { DuckDBInstance } = require('@duckdb/node-api');
const out = resolve(process.argv[2] ?? '.');
const parquet = join(out, 'duckdb-trajectories.parquet');
const json = join(out, 'duckdb-trajectories.json');

// Rows: the trajectory schema with DuckDB's types (BIGINT, VARCHAR, INTEGER[], FLOAT, INTEGER[][], FLOAT[][]),
// including an empty list, a NULL optional value, non-ASCII text, negative and large token ids.
const sql = `
CREATE TABLE t AS
SELECT
  i::BIGINT AS prompt_idx,
  CASE WHEN i % 3 = 0 THEN 'Solve x² = ' || i::VARCHAR || ' — ¿ok? 🙂' ELSE 'prompt ' || i::VARCHAR END AS prompt,
  [151644, i::INTEGER, (i * 7)::INTEGER]::INTEGER[] AS prompt_token_ids,
  CASE WHEN i = 5 THEN []::INTEGER[] ELSE list_transform(range(i % 6 + 1), x -> (x * 1000 + i)::INTEGER) END AS output_token_ids,
  CASE WHEN i % 4 = 0 THEN NULL ELSE ((i % 2)::FLOAT) END AS correct,
  list_transform(range(i % 3), p -> list_transform(range(p + 1), c -> (c + p * 10 + i * 100)::INTEGER)) AS candidate_ids,
  list_transform(range(i % 3), p -> list_transform(range(p + 1), c -> (0.25 * c - p + i / 8.0)::FLOAT)) AS candidate_q_values,
  list_transform(range(i % 3), p -> list_transform(range(p + 1), c -> (-1.5 * c - 0.125 * p)::FLOAT)) AS candidate_ref_logprobs
FROM range(12) r(i);
`;
const db = await DuckDBInstance.create(':memory:');
const c = await db.connect();
await c.run(sql);
await c.run(`COPY (SELECT * FROM t ORDER BY prompt_idx) TO '${parquet}.tmp' (FORMAT PARQUET, COMPRESSION SNAPPY, ROW_GROUP_SIZE 8)`);
await c.run(`COPY (SELECT * FROM t ORDER BY prompt_idx) TO '${json}.tmp' (FORMAT JSON, ARRAY true)`);
const version = (await c.runAndReadAll('SELECT version()')).getRows()[0][0];
const types = (await c.runAndReadAll(`SELECT name, type FROM parquet_schema('${parquet}.tmp')`)).getRows();
renameSync(`${parquet}.tmp`, parquet);
renameSync(`${json}.tmp`, json);
console.log(JSON.stringify({ duckdb: version, parquet, json, rows: JSON.parse(readFileSync(json, 'utf8')).length, parquetSchema: types }));
writeFileSync(join(out, 'duckdb-trajectories.provenance.txt'), `Written by DuckDB ${version} (@duckdb/node-api) with tools/reference/data/make-duckdb-fixture.mjs on ${new Date().toISOString().slice(0, 10)}.\nThe .json file is DuckDB's own JSON export of the same rows: the expected values.\n`);

#!/usr/bin/env python3
"""pyarrow reference for tools/bench/data/trajectories.ts: the same trajectory rows, settings and checks.

Writes N rows (prompt_idx int64, prompt string, prompt_token_ids list<int32> of 64, output_token_ids
list<int32> of 448-576 tokens (mean 512), correct float32) as a stream of 8,192-row record batches
cycled from a pool of 8 pre-built batches, with snappy, no dictionary and 16,384-row groups; then
streams the file back in 8,192-row batches and checks the sum of every token id. Prints one JSON line
with the same keys as the Lathe benchmark. Optionally (--verify FILE) reads a Parquet file written by
Lathe and prints its schema and row count, as an independent check of Lathe's writer.

With --keep, the file stays and its path and token-id sum are printed (for the Lathe reader:
tools/bench/data/trajectories.ts --read FILE); --row-group-size sets pyarrow's row groups (default
16384; 0 leaves pyarrow's own default of 1Mi rows).

Usage: python3 tools/reference/data/pyarrow_bench.py [--rows 1000000] [--dir /tmp] [--keep] [--row-group-size N] [--verify FILE]
Exits with status 2 and a one-line JSON {"error": ...} when pyarrow is not installed.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

try:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError as e:  # pragma: no cover - reported, not raised
    print(json.dumps({"error": f"pyarrow (and numpy) are needed for this reference: {e}", "python": sys.version.split()[0]}))
    sys.exit(2)

BATCH = 8192
POOL = 8
PROMPT_TOKENS = 64


def pool_batch(seed):
    rng = np.random.default_rng(seed)
    lens = rng.integers(448, 577, size=BATCH)
    offsets = np.zeros(BATCH + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    out = rng.integers(0, 151_936, size=int(offsets[-1]), dtype=np.int32)
    p_offsets = np.arange(BATCH + 1, dtype=np.int32) * PROMPT_TOKENS
    p_tokens = rng.integers(0, 151_936, size=BATCH * PROMPT_TOKENS, dtype=np.int32)
    prompts = [f"Solve problem {seed * BATCH + i}: what is x?" for i in range(BATCH)]
    correct = (rng.random(BATCH) < 0.5).astype(np.float32)
    row_sums = np.add.reduceat(out.astype(np.int64), offsets[:-1]) + p_tokens.astype(np.int64).reshape(BATCH, PROMPT_TOKENS).sum(axis=1)
    row_bytes = 4 * (lens + PROMPT_TOKENS) + 8 + np.array([len(p.encode()) for p in prompts]) + 4 + 8 + 4
    return {
        "prompt": pa.array(prompts, pa.string()),
        "prompt_token_ids": pa.ListArray.from_arrays(pa.array(p_offsets), pa.array(p_tokens)),
        "output_token_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(out)),
        "correct": pa.array(correct),
        "sum_up_to": np.concatenate([[0], np.cumsum(row_sums)]),
        "bytes_up_to": np.concatenate([[0], np.cumsum(row_bytes)]),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--verify", help="a Parquet file written by Lathe to read and describe")
    ap.add_argument("--keep", action="store_true", help="keep the file; print its path and token-id sum")
    ap.add_argument("--row-group-size", type=int, default=16384)
    args = ap.parse_args()
    if args.verify:
        t = pq.read_table(args.verify)
        print(json.dumps({"verify": args.verify, "rows": t.num_rows, "schema": {f.name: str(f.type) for f in t.schema}, "first_row": {k: (v[:8] if isinstance(v, list) else v) for k, v in t.slice(0, 1).to_pylist()[0].items()}}))
        return
    work = tempfile.mkdtemp(prefix="pyarrow-bench-data-", dir=args.dir)
    path = os.path.join(work, "trajectories.parquet")
    pool = [pool_batch(k + 1) for k in range(POOL)]
    schema = pa.schema([
        ("prompt_idx", pa.int64()),
        ("prompt", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("output_token_ids", pa.list_(pa.int32())),
        ("correct", pa.float32()),
    ])
    n_batches = -(-args.rows // BATCH)
    expected = 0
    data_bytes = 0

    t0 = time.perf_counter()
    with pq.ParquetWriter(path, schema, compression="snappy", use_dictionary=False) as w:
        group = []  # two 8,192-row batches per 16,384-row group (each write_table call closes its row groups)
        for b in range(n_batches):
            p = pool[b % POOL]
            n = min(BATCH, args.rows - b * BATCH)
            ids = pa.array(np.arange(b * BATCH, b * BATCH + BATCH, dtype=np.int64))
            batch = pa.RecordBatch.from_arrays([ids, p["prompt"], p["prompt_token_ids"], p["output_token_ids"], p["correct"]], schema=schema)
            if n < BATCH:
                batch = batch.slice(0, n)
            expected += int(p["sum_up_to"][n])
            data_bytes += int(p["bytes_up_to"][n])
            group.append(batch)
            per = max(1, args.row_group_size // BATCH) if args.row_group_size else n_batches
            if len(group) == per or b == n_batches - 1:
                w.write_table(pa.Table.from_batches(group, schema=schema), row_group_size=args.row_group_size or None)
                group = []
    write_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    rows = 0
    total = 0
    f = pq.ParquetFile(path)
    for batch in f.iter_batches(batch_size=BATCH):
        rows += batch.num_rows
        for col in ("prompt_token_ids", "output_token_ids"):
            total += int(np.asarray(batch.column(col).flatten()).sum(dtype=np.int64))
    read_s = time.perf_counter() - t1
    if rows != args.rows or total != expected:
        print(json.dumps({"error": f"read back {rows} rows, token sum {total}; expected {args.rows}, {expected}"}))
        sys.exit(1)
    file_bytes = os.path.getsize(path)
    groups = f.metadata.num_row_groups
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    mb = data_bytes / 1e6
    print(json.dumps({
        "tool": f"pyarrow {pa.__version__}",
        "rows": args.rows,
        "row_groups": groups,
        "data_mb": round(mb, 1),
        "file_mb": round(file_bytes / 1e6, 1),
        "write_s": round(write_s, 2),
        "write_rows_per_s": round(args.rows / write_s),
        "write_mb_per_s": round(mb / write_s, 1),
        "read_s": round(read_s, 2),
        "read_rows_per_s": round(args.rows / read_s),
        "read_mb_per_s": round(mb / read_s, 1),
        "token_sum_ok": True,
        "cpus": os.cpu_count(),
        **({"file": path, "token_sum": total} if args.keep else {}),
    }))


if __name__ == "__main__":
    main()

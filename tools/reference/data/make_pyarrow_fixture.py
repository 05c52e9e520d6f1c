#!/usr/bin/env python3
"""Writes the pyarrow-made Parquet fixture of @lathe/data's tests, with pyarrow's own defaults
(dictionary encoding, snappy, list child named "element", pandas metadata), plus the same rows as
JSON (the expected values, made from the Python lists before writing).

Usage (on a machine with pyarrow): python3 tools/reference/data/make_pyarrow_fixture.py OUT_DIR
Writes OUT_DIR/pyarrow-trajectories.parquet, .json and .provenance.txt; exits 2 if pyarrow is missing.
"""
import datetime
import json
import os
import sys

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError as e:
    print(json.dumps({"error": f"pyarrow is needed: {e}"}))
    sys.exit(2)

out = sys.argv[1] if len(sys.argv) > 1 else "."
rows = []
for i in range(10):
    n = i % 4
    rows.append({
        "prompt_idx": i // 2,
        "prompt": ["Solve x² = 4 — ¿ok? 🙂", "plain prompt", ""][i % 3] + f" #{i}",
        "prompt_token_ids": [151644, 872, i],
        "output_token_ids": [] if i == 3 else [i * 100 + k for k in range(i + 1)],
        "correct": None if i == 7 else float(i % 2),
        "value": 0.125 * (i % 8),
        "candidate_ids": [[j * 10 + c for c in range(j + 1)] for j in range(n)],
        "candidate_q_values": [[0.5 * c - j + i / 4 for c in range(j + 1)] for j in range(n)],
        "candidate_ref_logprobs": [[-0.25 * c - j for c in range(j + 1)] for j in range(n)],
        "step": 3,
        "group_id": i // 2,
        "reward_math": float(i % 2),
        "old_logprobs": None if i == 3 else [-0.5 * k for k in range(i + 1)],
    })
schema = pa.schema([
    ("prompt_idx", pa.int64()), ("prompt", pa.string()),
    ("prompt_token_ids", pa.list_(pa.int32())), ("output_token_ids", pa.list_(pa.int32())),
    ("correct", pa.float32()), ("value", pa.float64()),
    ("candidate_ids", pa.list_(pa.list_(pa.int32()))),
    ("candidate_q_values", pa.list_(pa.list_(pa.float32()))),
    ("candidate_ref_logprobs", pa.list_(pa.list_(pa.float32()))),
    ("step", pa.int64()), ("group_id", pa.int64()), ("reward_math", pa.float32()),
    ("old_logprobs", pa.list_(pa.float32())),
])
table = pa.Table.from_pylist(rows, schema=schema)
path = os.path.join(out, "pyarrow-trajectories.parquet")
pq.write_table(table, path, row_group_size=4)  # 3 row groups; everything else pyarrow's defaults
with open(os.path.join(out, "pyarrow-trajectories.json"), "w") as f:
    json.dump(rows, f, ensure_ascii=False, indent=1)
with open(os.path.join(out, "pyarrow-trajectories.provenance.txt"), "w") as f:
    f.write(f"Written by pyarrow {pa.__version__} (Python {sys.version.split()[0]}) with tools/reference/data/make_pyarrow_fixture.py "
            f"on {datetime.date.today().isoformat()}: pq.write_table defaults (dictionary, snappy) with row_group_size=4.\n"
            "The .json file holds the same rows as written from Python (float32 columns hold these values rounded to float32).\n")
print(json.dumps({"pyarrow": pa.__version__, "file": path, "rows": len(rows), "row_groups": pq.ParquetFile(path).metadata.num_row_groups}))

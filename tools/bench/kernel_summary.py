"""Summarises a kernel-times CSV (index, kernel, us; from tools/bench/kernel-times.sh): total GPU
time, and time per kernel kind — ONNX Runtime's elementwise kernels by their op (Add, Cast, …),
cuBLAS/nvjet matmuls as one kind, anything else by its function name.
usage: python3 kernel_summary.py KERNELS.csv [--top 30]"""
import csv
import re
import sys
from collections import defaultdict


def kind(name):
    base = re.sub(r"^void ", "", name).split("(")[0].split("<")[0]
    if base.startswith("nvjet") or "gemm" in base.lower() or "cutlass" in base.lower():
        return "matmul (cuBLAS)"
    op = re.search(r"OP_(\w+?)<", name)
    if op:
        dtypes = re.search(r"<[^<]*?(float|double|half|BFloat16|MLFloat16|long|int|bool)", name)
        return f"{base.split('::')[-1]}:{op.group(1)}" + (f" ({dtypes.group(1)})" if dtypes else "")
    return base


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 30
    rows = list(csv.DictReader(open(path)))
    by = defaultdict(lambda: [0.0, 0])
    for r in rows:
        k = kind(r["kernel"])
        by[k][0] += float(r["us"])
        by[k][1] += 1
    total = sum(v[0] for v in by.values())
    print(f"kernels: {len(rows)}, GPU time {total / 1e3:.2f} ms")
    for k, (us, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{us / 1e3:10.2f} ms {100 * us / max(total, 1e-9):5.1f}% {n:7d} calls {us / n:9.1f} us/call  {k[:100]}")


if __name__ == "__main__":
    main()

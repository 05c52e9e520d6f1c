"""Summarises a kernel-times CSV (index, kernel, us; from tools/bench/kernel-times.sh or
tools/reference/train/torch_step_kernels.py): total GPU time, and time per kernel kind — ONNX
Runtime's elementwise kernels by their op (Add, Cast, …), PyTorch's generic elementwise, foreach
and reduction kernels by their functor, cuBLAS/nvjet matmuls as one kind, anything else by its
function name.
With --last-period, only the last repetition of a repeating sequence is summarised: the largest
K for which the last K kernel names equal the K before them — one step of a command that runs
the same step 3 times (2 would let a step's inner repeats, such as its layers, match instead), so
no launch count has to be known in advance.
usage: python3 kernel_summary.py KERNELS.csv [--top 30] [--last-period]"""
import csv
import re
import sys
from collections import defaultdict


def kind(name):
    base = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "").split("(")[0].split("<")[0]
    if base.startswith("nvjet") or "gemm" in base.lower() or "cutlass" in base.lower():
        return "matmul (cuBLAS)"
    if re.search(r"elementwise_kernel|multi_tensor_apply_kernel|reduce_kernel", base):
        # PyTorch's generic kernels: the innermost functor in the template arguments (MulFunctor
        # inside BinaryFunctor), or the kernel function a lambda belongs to (silu_kernel), names the op
        args = name.split(">(")[0]
        functors = re.findall(r"(\w*(?:Functor|functor)\w*)", args)
        lam = re.search(r"(\w+_kernel(?:_cuda)?)\(", args)
        what = functors[-1] if functors else lam.group(1) if lam else "?"
        dtype = "bf16" if "BFloat16" in args else "f32" if "float" in args else ""
        return f"{base.split('::')[-1]}:{what}" + (f" ({dtype})" if dtype else "")
    op = re.search(r"OP_(\w+?)<", name)
    if op:
        dtypes = re.search(r"<[^<]*?(float|double|half|BFloat16|MLFloat16|long|int|bool)", name)
        return f"{base.split('::')[-1]}:{op.group(1)}" + (f" ({dtypes.group(1)})" if dtypes else "")
    return base


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 30
    rows = list(csv.DictReader(open(path)))
    if "--last-period" in sys.argv:
        names = [r["kernel"] for r in rows]
        period = next((k for k in range(len(names) // 2, 99, -1) if names[-k:] == names[-2 * k:-k]), None)
        if period is None:
            sys.exit("no repeating sequence of ≥ 100 kernels at the end of the run")
        rows = rows[-period:]
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

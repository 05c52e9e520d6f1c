"""Summarises an ONNX Runtime profile (chrome-trace JSON): time per op type, node count, and the
share of wall time spent inside node calls (on CUDA a node call is the host-side launch, so a
large share with small per-call times means dispatch-bound; run with CUDA_LAUNCH_BLOCKING=1 to make
node times kernel times). With --by-scope, also the time per scope of the node names Lathe writes
(layerN/attn/…, layerN/mlp/…, grad/<forward node>/…, optimizer/…), layers merged as layer*, and the
top op types within each scope. --last-run counts only the nodes of the last model run (the first
runs of a session include the memory arena's growth and algorithm searches); --run K only those of
run K (0-based in time order, negative from the end).
usage: python3 profile_summary.py PROFILE.json [--top 25] [--by-scope] [--last-run | --run K]"""
import re
import json
import sys
from collections import defaultdict


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    events = json.load(open(path))
    by_op = defaultdict(lambda: [0.0, 0])
    by_scope = defaultdict(lambda: [0.0, 0])
    by_scope_op = defaultdict(lambda: defaultdict(float))
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    pick = -1 if "--last-run" in sys.argv else int(sys.argv[sys.argv.index("--run") + 1]) if "--run" in sys.argv else None
    if pick is not None and runs:
        one = sorted(runs, key=lambda e: e["ts"])[pick]
        events = [e for e in events if one["ts"] <= e.get("ts", -1) <= one["ts"] + one["dur"]]
        runs = [one]
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            by_op[op][0] += e["dur"]
            by_op[op][1] += 1
            if op not in ("Loop", "If", "Scan"):
                key = scope_of(e["name"][: -len("_kernel_time")])
                by_scope[key][0] += e["dur"]
                by_scope[key][1] += 1
                by_scope_op[key][op] += e["dur"]
    # A Loop/If node's time includes its body's nodes, which are listed separately.
    kernel_total = sum(v[0] for k, v in by_op.items() if k not in ("Loop", "If", "Scan"))
    run_us = sum(r["dur"] for r in runs)
    print(f"runs: {len(runs)}, model_run total {run_us/1e3:.1f} ms; node kernel time {kernel_total/1e3:.1f} ms "
          f"({100*kernel_total/max(1,run_us):.0f}% of run time); node launches {sum(v[1] for v in by_op.values())}")
    for op, (dur, n) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{op:32s} {dur/1e3:10.1f} ms {n:8d} calls {dur/max(1,n):8.1f} us/call")
    if "--by-scope" in sys.argv:
        print("\nby scope (layers merged):")
        for key, (dur, n) in sorted(by_scope.items(), key=lambda kv: -kv[1][0])[:top]:
            ops = sorted(by_scope_op[key].items(), key=lambda kv: -kv[1])[:4]
            detail = ", ".join(f"{o} {d/1e3:.1f}" for o, d in ops)
            print(f"{key:36s} {dur/1e3:10.1f} ms {n:8d} calls   {detail}")


def scope_of(node_name):
    """grad/layer3/attn/MatMul_7/Mul_12 -> grad/layer*/attn: the scope path without node names."""
    parts = node_name.split("/")[:-1]
    kept = [("layer*" if re.fullmatch(r"layer\d+", p) else p) for p in parts if not re.fullmatch(r"[A-Za-z]+_\d+", p)]
    return "/".join(kept[:3]) or "(top level)"


if __name__ == "__main__":
    main()

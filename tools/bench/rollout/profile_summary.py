"""Summarises an ONNX Runtime profile (chrome-trace JSON): time per op type, node count, and the
share of wall time spent inside node calls (on CUDA a node call is the host-side launch, so a
large share with small per-call times means dispatch-bound). usage: python3 profile_summary.py PROFILE.json [--top 25]"""
import json
import sys
from collections import defaultdict


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    events = json.load(open(path))
    by_op = defaultdict(lambda: [0.0, 0])
    runs = []
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            by_op[op][0] += e["dur"]
            by_op[op][1] += 1
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            runs.append(e["dur"])
    # A Loop/If node's time includes its body's nodes, which are listed separately.
    kernel_total = sum(v[0] for k, v in by_op.items() if k not in ("Loop", "If", "Scan"))
    print(f"runs: {len(runs)}, model_run total {sum(runs)/1e3:.1f} ms; node kernel time {kernel_total/1e3:.1f} ms "
          f"({100*kernel_total/max(1,sum(runs)):.0f}% of run time); node launches {sum(v[1] for v in by_op.values())}")
    for op, (dur, n) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{op:32s} {dur/1e3:10.1f} ms {n:8d} calls {dur/max(1,n):8.1f} us/call")


if __name__ == "__main__":
    main()

"""The runtime layer's training-shaped benchmark: a 4-layer MLP (4096 wide, batch 8192), forward +
backward + clipped AdamW, 100 steps, in PyTorch and in Lathe (Trainer with state bound on the GPU),
from the same initial weights and batch. Reports step times, their ratio, and the max relative
difference of the final parameters.

Runs on the GPU machine, in one call with the Lathe side:
  python3 tools/reference/runtime/mlp_bench.py [--steps 100] [--tf32] [--out DIR]
Needs .bundle/runtime-bench.js (esbuild of tools/bench/runtime/device-bench.ts).
"""
import argparse
import json
import os
import subprocess
import time

import numpy as np
import torch

NODE_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", ".bundle", "runtime-bench.js")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--skip-micro", action="store_true")
    ap.add_argument("--out", default="/tmp/lathe-mlp")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    W, B, layers = a.width, a.batch, a.layers
    meta = {"width": W, "layers": layers, "batch": B, "lr": 1e-4, "weight_decay": 0.01, "max_grad_norm": 1.0, "steps": a.steps}
    rng = np.random.default_rng(0)
    init = {}
    for l in range(layers):
        init[f"w{l}"] = (rng.standard_normal((W, W)) / np.sqrt(W)).astype(np.float32)
        init[f"b{l}"] = (rng.standard_normal(W) * 0.01).astype(np.float32)
    x = rng.standard_normal((B, W)).astype(np.float32)
    t = rng.standard_normal((B, W)).astype(np.float32)
    for k, v in {**init, "x": x, "t": t}.items():
        v.tofile(os.path.join(a.out, f"{k}.bin"))
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f)

    dev = "cuda"
    ps = {k: torch.tensor(v, device=dev, requires_grad=True) for k, v in init.items()}
    xs, ts = torch.tensor(x, device=dev), torch.tensor(t, device=dev)
    opt = torch.optim.AdamW([{"params": [ps[f"w{l}"] for l in range(layers)], "weight_decay": meta["weight_decay"]},
                             {"params": [ps[f"b{l}"] for l in range(layers)], "weight_decay": 0.0}],
                            lr=meta["lr"], betas=(0.9, 0.999), eps=1e-8, fused=True)
    losses, times = [], []
    torch.cuda.synchronize()
    for s in range(a.steps):
        t0 = time.perf_counter()
        h = xs
        for l in range(layers):
            h = h @ ps[f"w{l}"] + ps[f"b{l}"]
            if l < layers - 1:
                h = torch.tanh(h)
        loss = ((h - ts) ** 2).sum() / (B * W)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(ps.values()), meta["max_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # the loss comes back each step, as Lathe's does
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    torch_ms = 1000 * sum(times[5:]) / (a.steps - 5)
    peak = torch.cuda.max_memory_allocated() / 2**30
    final = {k: v.detach().cpu().numpy() for k, v in ps.items()}
    del ps, opt, xs, ts, h
    torch.cuda.empty_cache()

    cmd = ["node", NODE_SCRIPT, "--mlp", a.out, "--steps", str(a.steps)] + (["--tf32"] if a.tf32 else []) + (["--skip-micro"] if a.skip_micro else [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    for line in res.stdout.splitlines():
        print(line, flush=True)
    if res.returncode != 0:
        print(res.stderr[-4000:], flush=True)
        raise SystemExit(1)
    lathe = [json.loads(l) for l in res.stdout.splitlines() if l.startswith("{")]
    mlp = next(r for r in lathe if r.get("part") == "mlp")
    worst_rel, worst_norm = 0.0, 0.0
    for k, ref in final.items():
        got = np.fromfile(os.path.join(a.out, f"lathe_{k}.bin"), dtype=np.float32).reshape(ref.shape)
        worst_rel = max(worst_rel, float(np.abs(got - ref).max() / np.abs(ref).max()))
        worst_norm = max(worst_norm, float(np.linalg.norm(got - ref) / np.linalg.norm(ref)))
    lathe_losses = json.load(open(os.path.join(a.out, "lathe_losses.json")))
    print(json.dumps({
        "part": "mlp_vs_torch", "device": torch.cuda.get_device_name(0), "tf32": a.tf32, "steps": a.steps,
        "torch_step_ms": round(torch_ms, 2), "lathe_step_ms": mlp["step_ms_mean_after_5"],
        "lathe_over_torch_time": round(mlp["step_ms_mean_after_5"] / torch_ms, 3),
        "torch_peak_gib": round(peak, 2),
        "final_params_max_abs_diff_over_max_abs": worst_rel, "final_params_rel_norm_diff": worst_norm,
        "loss_first_last_torch": [losses[0], losses[-1]], "loss_first_last_lathe": [lathe_losses[0], lathe_losses[-1]],
        "lathe_host_share": mlp["host_share"],
    }), flush=True)


if __name__ == "__main__":
    main()

"""GPU time per kernel of one PyTorch eager training step — the reference side of step_speed.py
(same model, batch, autocast bf16, loss, clipping and AdamW) — so the two sides' kernel tables can
be set side by side. PyTorch's profiler (CUPTI) records each kernel's device time without
serialising launches; the step is timed once more without the profiler for its wall time.

Writes DIR/torch-step.csv (index, kernel, us: the format of tools/bench/kernel-times.sh) and prints
tools/bench/kernel_summary.py's table of it.

usage: python3 tools/reference/train/torch_step_kernels.py [--shape 0.6b] [--batch 8] [--seq 1024]
         [--lora R] [--out DIR]
"""
import argparse
import csv
import os
import subprocess
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from step_speed import SHAPES, add_lora, qwen3_config, torch_train_step  # noqa: E402  (the reference's model, step and LoRA)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="0.6b", choices=list(SHAPES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lora", type=int, default=0)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen3_config(a.shape), dtype=torch.float32)
    if a.lora:
        add_lora(model, a.lora, 2.0 * a.lora)
    model = model.cuda().train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-5, weight_decay=0.01)
    B, T = a.batch, a.seq
    ids = torch.randint(1, 151936, (B, T), device="cuda")
    mask = torch.ones(B, T, dtype=torch.long, device="cuda")
    w = torch.ones(B, T - 1, device="cuda")
    w[:, : T // 4 - 1] = 0

    def step():
        torch_train_step(model, ids, mask, w, trainable, opt)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    path = os.path.join(a.out, "torch-step.csv")
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["index", "kernel", "us"])
        for i, e in enumerate(sorted(kernels, key=lambda e: e.time_range.start)):
            out.writerow([i, e.name, e.time_range.elapsed_us()])
    print(f"PyTorch eager step, {B} x {T}: wall {wall * 1e3:.1f} ms (unprofiled)", flush=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "kernel_summary.py"), path, "--top", "40"], check=True)


if __name__ == "__main__":
    main()

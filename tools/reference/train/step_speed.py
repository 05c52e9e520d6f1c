"""Training-step speed on the Qwen3-0.6B shape: Lathe vs PyTorch eager, in one call.

Runs on the GPU machine. Both sides: float32 master weights and AdamW state, bfloat16 compute
(PyTorch: autocast), masked next-token loss, clip 1.0, AdamW; a random batch of B × T tokens.
Lathe's `--path bound` (default) keeps parameters and moments on the GPU (the Trainer);
`--path plain` passes them through onnxruntime-node's JavaScript API every step.

usage: python3 tools/reference/train/step_speed.py [--shape 0.6b|1.7b] [--batch 4] [--seq 512] [--steps 3]
         [--micro 1] [--path bound|plain] [--lathe-args "--recompute --cuda-graph"] [--torch-checkpointing]
         [--skip-torch] [--out DIR]
MFU counts 6·N FLOPs per token for the N parameters that multiply (the tied embedding once, as the
LM head) plus causal attention (6·layers·T·heads·head_dim), against the H100 SXM's 989 TFLOP/s
dense bf16. A side that fails (out of memory) is reported with its error; the other still runs.
Needs .bundle/lathe-step.js.
"""
import argparse
import json
import os
import subprocess
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

NODE_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", ".bundle", "lathe-step.js")


SHAPES = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144),
}
PEAK_BF16 = 989e12


def flops_per_token(cfg, T):
    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    h, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    per_layer = d * (h * hd) * 2 + d * (kv * hd) * 2 + 3 * d * f
    n = L * per_layer + cfg.vocab_size * d
    return 6 * n + 6 * L * T * h * hd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="0.6b", choices=list(SHAPES))
    ap.add_argument("--lathe-args", default="")
    ap.add_argument("--torch-checkpointing", action="store_true")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="/tmp/lathe-speed")
    ap.add_argument("--path", default="bound")
    ap.add_argument("--micro", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, **SHAPES[a.shape], num_hidden_layers=28,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                      rope_theta=1_000_000, max_position_embeddings=40960, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    path = os.path.join(a.out, f"qwen3-{a.shape}")
    model.save_pretrained(path, safe_serialization=True)
    model = model.cuda().train()
    if a.torch_checkpointing:
        model.gradient_checkpointing_enable()
    B, T = a.batch, a.seq
    ids = torch.randint(1, 151936, (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    loss_mask = torch.ones(B, T, dtype=torch.long)
    loss_mask[:, : T // 4] = 0
    batch_file = os.path.join(a.out, "batch.json")
    with open(batch_file, "w") as f:
        json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "loss_mask": loss_mask.tolist()}, f)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    ids_c, mask_c, w = ids.cuda(), mask.cuda(), loss_mask.cuda()[:, 1:].float()
    times = []
    torch.cuda.reset_peak_memory_stats()
    torch_error = None
    for _ in range(0 if a.skip_torch else a.steps + 1):
        try:
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=ids_c, attention_mask=mask_c).logits
            logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids_c[:, 1:, None])[..., 0]
            loss = -(logp * w).sum() / w.sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        except torch.cuda.OutOfMemoryError as e:
            torch_error = str(e)[:300]
            break
    torch_best = min(times[1:]) if len(times) > 1 and not torch_error else None
    peak = torch.cuda.max_memory_allocated() / 2**30
    del model, opt
    torch.cuda.empty_cache()
    res = subprocess.run(["node", NODE_SCRIPT, "--model", path, "--batch", batch_file, "--device", "cuda", "--compute", "bfloat16",
                          "--steps", str(a.steps), "--lr", "1e-5", "--allow-cpu-fallback",
                          "--path", a.path, "--micro-batches", str(a.micro), *a.lathe_args.split()], capture_output=True, text=True)
    fpt = flops_per_token(cfg, T)
    report = {"device": torch.cuda.get_device_name(0), "shape": a.shape, "batch": [B, T], "path": a.path, "micro_batches": a.micro,
              "lathe_args": a.lathe_args, "torch_checkpointing": a.torch_checkpointing, "flops_per_token": fpt}
    if torch_best:
        report.update(torch_step_s=round(torch_best, 3), torch_tokens_per_s=round(B * T / torch_best), torch_mfu=round(B * T / torch_best * fpt / PEAK_BF16, 3))
    if not a.skip_torch:
        report.update(torch_peak_gib=round(peak, 1), torch_error=torch_error)
    if res.returncode != 0:
        report["lathe_error"] = "\n".join(l for l in res.stderr.splitlines() if not l.startswith("    at"))[-1500:]
    else:
        info = json.loads(res.stdout.strip().splitlines()[-1])
        # a step is its runs plus binding the batch and scalars (host time), as a training loop sees it
        totals = [r + h for r, h in zip(info["run_ms"], info["host_ms"])]
        lathe_best = min(totals[1:] if len(totals) > 1 else totals) / 1000
        report.update(lathe_step_s=round(lathe_best, 3), lathe_tokens_per_s=round(B * T / lathe_best),
                      lathe_mfu=round(B * T / lathe_best * fpt / PEAK_BF16, 3),
                      host_share=round(min(info["host_ms"][1:] or info["host_ms"]) / (lathe_best * 1000), 4), lathe=info)
        if torch_best:
            report["ratio"] = round(torch_best / lathe_best, 3)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()

"""Training-step speed on the Qwen3-0.6B shape: Lathe vs PyTorch eager, in one call.

Runs on the GPU machine. Both sides: float32 master weights and AdamW state, bfloat16 compute
(PyTorch: autocast), masked next-token loss, clip 1.0, AdamW; a random batch of B × T tokens.
Lathe's `--path bound` (default) keeps parameters and moments on the GPU (the Trainer);
`--path plain` passes them through onnxruntime-node's JavaScript API every step.

usage: python3 tools/reference/train/step_speed.py [--shape 0.6b|1.7b] [--batch 4] [--seq 512] [--steps 3]
         [--micro 1] [--path bound|plain] [--lathe-args "--recompute --cuda-graph"] [--torch-checkpointing]
         [--lora R [--lora-alpha 2R]] [--lr 1e-5] [--skip-torch] [--skip-lathe] [--torch-compile] [--out DIR]
MFU counts 6·N FLOPs per token for the N parameters that multiply (the tied embedding once, as the
LM head) plus causal attention (6·layers·T·heads·head_dim), against the H100 SXM's 989 TFLOP/s
dense bf16. A side that fails (out of memory) is reported with its error; the other still runs.
Needs .bundle/lathe-step.js.

--torch-compile: the PyTorch side's model is wrapped in torch.compile (default mode, inductor)
before its first step; the first step, which compiles, is the warm-up the timing already drops.

--lora R: LoRA of rank R on q_proj, k_proj, v_proj and o_proj of every layer instead of full
fine-tuning. PyTorch side: hand-written (no peft) — each of those nn.Linear modules is wrapped as
y = base(x) + (alpha/R)·(x·Aᵀ)·Bᵀ, the base weight frozen (requires_grad False) and kept float32
(autocast casts it to bf16 in the matmul, as Lathe casts its float32 base), A [R, in] kaiming-uniform
with a=√5 (peft's default, i.e. U(±1/√in), Lathe's initialisation) and B [out, R] zeros, both float32
and the only parameters AdamW and clipping see (same loss, clip 1.0 and AdamW settings as full
fine-tuning). Lathe side: `--lora-rank R --lora-alpha A --lora-targets q_proj|k_proj|v_proj|o_proj`
(lathe sft's LoRA: the frozen base bound once as `base/<name>` inputs; each targeted matrix is used as
base + (alpha/R)·B·A, formed in float32 and cast to bf16 — merged per step, not applied as a side
branch; the B·A products cost ~2·R·in·out FLOPs per matrix per step, negligible beside the tokens).
With B = 0 at the start both sides' first loss is the base model's loss on the same batch.
LoRA MFU: 6·N would overcount — the backward pass through a frozen matrix needs only the input
gradient (2·N per token), not the weight gradient — so it counts 4·N_base (forward + input
gradient; N_base as above) + 6·N_adapters (N_adapters = R·(in + out) summed over the adapted
matrices, the unmerged side branch's FLOPs) + the same 6·layers·T·heads·head_dim for attention
(which has no weights: its backward needs the Q, K and V gradients either way). The same count is
used for both sides. The report has each side's trainable parameter count (they must agree).
"""
import argparse
import json
import math
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


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def flops_per_token(cfg, T, lora_rank=0):
    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    h, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    per_layer = d * (h * hd) * 2 + d * (kv * hd) * 2 + 3 * d * f
    n = L * per_layer + cfg.vocab_size * d
    attention = 6 * L * T * h * hd
    if not lora_rank:
        return 6 * n + attention
    # adapters on q, k, v, o: R·(in + out) each
    n_adapters = L * lora_rank * ((d + h * hd) + 2 * (d + kv * hd) + (h * hd + d))
    return 4 * n + 6 * n_adapters + attention


class LoraLinear(torch.nn.Module):
    """A frozen nn.Linear plus a trainable low-rank side branch: base(x) + scale·(x·Aᵀ)·Bᵀ."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.lora_A = torch.nn.Parameter(torch.empty(rank, base.in_features, dtype=torch.float32))
        self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, rank, dtype=torch.float32))
        torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale


def add_lora(model, rank, alpha):
    """Freezes every weight of `model` and wraps each q/k/v/o projection in LoraLinear."""
    for p in model.parameters():
        p.requires_grad_(False)
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in LORA_TARGETS]
    assert len(names) == len(LORA_TARGETS) * model.config.num_hidden_layers, f"LoRA: found {len(names)} target modules: {names[:8]}"
    for name in names:
        parent, child = name.rsplit(".", 1)
        holder = model.get_submodule(parent)
        setattr(holder, child, LoraLinear(getattr(holder, child), rank, alpha))


def qwen3_config(shape):
    """The benchmark's Qwen3 configuration at `shape` (a key of SHAPES)."""
    return Qwen3Config(vocab_size=151936, **SHAPES[shape], num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                       rope_theta=1_000_000, max_position_embeddings=40960, tie_word_embeddings=True)


def torch_train_step(model, ids, mask, w, trainable, opt):
    """One PyTorch step as the benchmark takes it: autocast bf16 forward, masked next-token loss
    over float32 log-softmax, backward, clip_grad_norm_(1.0), AdamW. Returns the loss tensor."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=ids, attention_mask=mask).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    loss = -(logp * w).sum() / w.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="0.6b", choices=list(SHAPES))
    ap.add_argument("--lathe-args", default="")
    ap.add_argument("--torch-checkpointing", action="store_true")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-lathe", action="store_true")
    ap.add_argument("--torch-compile", action="store_true", help="torch.compile the PyTorch model (inductor, default mode)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="/tmp/lathe-speed")
    ap.add_argument("--path", default="bound")
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--reuse-model", action="store_true", help="keep a model already saved in --out (same seed, so the same weights)")
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank on q,k,v,o (0: full fine-tuning)")
    ap.add_argument("--lora-alpha", type=float, default=None, help="default 2·rank")
    a = ap.parse_args()
    lora_alpha = a.lora_alpha if a.lora_alpha is not None else 2.0 * a.lora
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    cfg = qwen3_config(a.shape)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    path = os.path.join(a.out, f"qwen3-{a.shape}")
    if not (a.reuse_model and os.path.exists(os.path.join(path, "config.json"))):
        model.save_pretrained(path, safe_serialization=True)
    # the saved model is the plain one; LoRA wraps the projections after saving
    if a.lora:
        add_lora(model, a.lora, lora_alpha)
    model = model.cuda().train()
    if a.torch_compile:
        model = torch.compile(model)
    # full fine-tuning: every parameter; LoRA: the adapters' A and B only
    trainable = [p for p in model.parameters() if p.requires_grad]
    if a.torch_checkpointing:
        # non-reentrant: with a frozen base no checkpointed layer's inputs require grad, and the
        # reentrant variant would then give the adapters no gradients
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False} if a.lora else None)
    B, T = a.batch, a.seq
    ids = torch.randint(1, 151936, (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    loss_mask = torch.ones(B, T, dtype=torch.long)
    loss_mask[:, : T // 4] = 0
    batch_file = os.path.join(a.out, "batch.json")
    with open(batch_file, "w") as f:
        json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "loss_mask": loss_mask.tolist()}, f)
    opt = torch.optim.AdamW(trainable, lr=a.lr, weight_decay=0.01)
    ids_c, mask_c, w = ids.cuda(), mask.cuda(), loss_mask.cuda()[:, 1:].float()
    times = []
    torch_losses = []
    torch.cuda.reset_peak_memory_stats()
    torch_error = None
    for _ in range(0 if a.skip_torch else a.steps + 1):
        try:
            torch.cuda.synchronize()
            t = time.perf_counter()
            loss = torch_train_step(model, ids_c, mask_c, w, trainable, opt)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            torch_losses.append(loss.item())  # the first (warm-up) step's included: one more than Lathe's
        except torch.cuda.OutOfMemoryError as e:
            torch_error = str(e)[:300]
            break
    torch_best = min(times[1:]) if len(times) > 1 and not torch_error else None
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch_trainable = sum(p.numel() for p in trainable)
    del model, opt, trainable
    torch.cuda.empty_cache()
    lora_args = ["--lora-rank", str(a.lora), "--lora-alpha", f"{lora_alpha:g}", "--lora-targets", "|".join(LORA_TARGETS)] if a.lora else []
    if a.skip_lathe:
        res = None
    else:
        res = subprocess.run(["node", NODE_SCRIPT, "--model", path, "--batch", batch_file, "--device", "cuda", "--compute", "bfloat16",
                              "--steps", str(a.steps), "--lr", str(a.lr),
                              "--path", a.path, "--micro-batches", str(a.micro), *lora_args, *a.lathe_args.split()], capture_output=True, text=True)
    fpt = flops_per_token(cfg, T, a.lora)
    report = {"device": torch.cuda.get_device_name(0), "shape": a.shape, "batch": [B, T], "path": a.path, "micro_batches": a.micro,
              "lathe_args": a.lathe_args, "torch_checkpointing": a.torch_checkpointing, "torch_compile": a.torch_compile, "lr": a.lr,
              "lora": {"rank": a.lora, "alpha": lora_alpha, "targets": list(LORA_TARGETS)} if a.lora else None,
              "flops_per_token": fpt, "torch_trainable_params": torch_trainable}
    if torch_losses:
        report["torch_losses"] = [round(x, 5) for x in torch_losses]
    if torch_best:
        report.update(torch_step_s=round(torch_best, 3), torch_tokens_per_s=round(B * T / torch_best), torch_mfu=round(B * T / torch_best * fpt / PEAK_BF16, 3))
    if not a.skip_torch:
        report.update(torch_peak_gib=round(peak, 1), torch_error=torch_error)
    if res is None:
        pass
    elif res.returncode != 0:
        report["lathe_error"] = "\n".join(l for l in res.stderr.splitlines() if not l.startswith("    at"))[-1500:]
    else:
        info = json.loads(res.stdout.strip().splitlines()[-1])
        # a step is its runs plus binding the batch and scalars (host time), as a training loop sees it
        totals = [r + h for r, h in zip(info["run_ms"], info["host_ms"])]
        lathe_best = min(totals[1:] if len(totals) > 1 else totals) / 1000
        report.update(lathe_step_s=round(lathe_best, 3), lathe_tokens_per_s=round(B * T / lathe_best),
                      lathe_mfu=round(B * T / lathe_best * fpt / PEAK_BF16, 3),
                      host_share=round(min(info["host_ms"][1:] or info["host_ms"]) / (lathe_best * 1000), 4),
                      lathe_trainable_params=info.get("trainable_params"), lathe=info)
        if torch_best:
            report["ratio"] = round(torch_best / lathe_best, 3)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()

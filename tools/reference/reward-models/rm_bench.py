"""Reward-model training and scoring speed at the Qwen3-0.6B shape: Lathe vs PyTorch + transformers'
AutoModelForSequenceClassification, in one call, on the same checkpoint and the same pairs.

Runs on the GPU machine (.bundle/rm-bench.js from tools/bench/build-device-bundles.sh rm-bench).
A random Qwen3-0.6B-shape causal LM is saved; Lathe turns it into a reward model (score head drawn
N(0, 0.02²)), saves it, trains it and scores with it (tools/bench/reward-models/rm-bench.ts); then
transformers loads that same folder and does the same:
  - training: float32 master weights and AdamW (lr 1e-5, no weight decay), autocast bf16 forward,
    the Bradley-Terry loss −log σ(r_chosen − r_rejected) averaged over pairs, clip 1.0; chosen and
    rejected rows in one forward, as Lathe batches them; one warm-up step, then --steps timed;
  - scoring: the starting weights in bf16, no_grad, --score-rows rows per forward, every sequence of
    the batch, best of --score-repeats after a warm-up.
Both read each row's reward at its last token (rows are unpadded: ids never equal the pad id 0).
usage: python3 tools/reference/reward-models/rm_bench.py [--pairs 8] [--seq 1024] [--steps 5] [--out DIR]
Prints one JSON line: tokens/s of each side, their ratio (> 1: Lathe faster), and the first step's
losses of both (the same weights and batch, so they agree to bf16 rounding).
"""
import argparse
import json
import os
import subprocess
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, Qwen3Config

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", ".bundle", "rm-bench.js")


def qwen3_06b():
    return Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000, max_position_embeddings=40960,
                       tie_word_embeddings=True, pad_token_id=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--score-rows", type=int, default=16)
    ap.add_argument("--score-repeats", type=int, default=3)
    ap.add_argument("--out", default="/tmp/lathe-rm-bench")
    ap.add_argument("--kernels", action="store_true", help="Lathe through its own CUDA kernels (the fused AdamW update)")
    ap.add_argument("--attention-kernel", action="store_true", help="Lathe's attention through its own flash-attention kernels (implies --kernels)")
    ap.add_argument("--cuda-graph", action="store_true", help="Lathe's step captured as a CUDA graph and replayed")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    lm_dir, rm_dir = os.path.join(a.out, "lm"), os.path.join(a.out, "rm")
    AutoModelForCausalLM.from_config(qwen3_06b(), dtype=torch.float32).save_pretrained(lm_dir, safe_serialization=True)
    P, T, prompt_len = a.pairs, a.seq, a.seq // 2
    prompts = torch.randint(1, 151936, (P, prompt_len))
    chosen = torch.cat([prompts, torch.randint(1, 151936, (P, T - prompt_len))], 1)
    rejected = torch.cat([prompts, torch.randint(1, 151936, (P, T - prompt_len))], 1)
    batch_file = os.path.join(a.out, "batch.json")
    with open(batch_file, "w") as f:
        json.dump({"prompt_len": prompt_len, "chosen": chosen.tolist(), "rejected": rejected.tolist()}, f)

    res = subprocess.run(["node", SCRIPT, "--model", lm_dir, "--out", rm_dir, "--batch", batch_file, "--device", "cuda", "--compute", "bfloat16",
                          "--steps", str(a.steps), "--score-rows", str(a.score_rows), "--score-repeats", str(a.score_repeats)] + (["--kernels"] if a.kernels else []) + (["--cuda-graph"] if a.cuda_graph else []) + (["--attention-kernel"] if a.attention_kernel else []), capture_output=True, text=True)
    if res.returncode != 0:
        print(json.dumps({"lathe_error": res.stderr[-2000:]}), flush=True)
        return
    lathe = json.loads(res.stdout.strip().splitlines()[-1])

    model = AutoModelForSequenceClassification.from_pretrained(rm_dir, dtype=torch.float32, attn_implementation="sdpa").cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    ids = torch.cat([chosen, rejected]).cuda()
    mask = torch.ones_like(ids)
    losses, times = [], []
    torch.cuda.reset_peak_memory_stats()
    for _ in range(a.steps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            r = model(input_ids=ids, attention_mask=mask).logits[:, 0].float()
        loss = -F.logsigmoid(r[:P] - r[P:]).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    train_peak = torch.cuda.max_memory_allocated() / 2**30
    del opt, model
    torch.cuda.empty_cache()

    scorer = AutoModelForSequenceClassification.from_pretrained(rm_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    score_times = []
    with torch.no_grad():
        for _ in range(a.score_repeats + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for start in range(0, 2 * P, a.score_rows):
                part = ids[start:start + a.score_rows]
                scorer(input_ids=part, attention_mask=torch.ones_like(part)).logits[:, 0].float().cpu()
            torch.cuda.synchronize()
            score_times.append(time.perf_counter() - t0)

    tokens = 2 * P * T
    torch_step = min(times[1:])
    lathe_step = min(lathe["step_ms"][1:]) / 1000
    torch_score = min(score_times[1:])
    lathe_score = min(lathe["score_ms"][1:]) / 1000
    print(json.dumps({
        "device": torch.cuda.get_device_name(0), "shape": "qwen3-0.6b", "pairs": P, "seq": T, "step_tokens": tokens,
        "train": {"lathe_tokens_per_s": round(tokens / lathe_step), "torch_tokens_per_s": round(tokens / torch_step), "ratio": round(torch_step / lathe_step, 3),
                  "lathe_step_s": round(lathe_step, 4), "torch_step_s": round(torch_step, 4), "torch_peak_gib": round(train_peak, 1),
                  "first_loss": {"lathe": lathe["losses"][0], "torch": losses[0]}, "lathe_losses": lathe["losses"], "torch_losses": losses},
        "score": {"lathe_tokens_per_s": round(tokens / lathe_score), "torch_tokens_per_s": round(tokens / torch_score), "ratio": round(torch_score / lathe_score, 3),
                  "rows_per_run": a.score_rows},
    }), flush=True)


if __name__ == "__main__":
    main()

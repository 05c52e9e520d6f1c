"""One GRPO RL step in PyTorch + transformers: the reference for Lathe's RL device benchmark.

Measures the wall time of each phase of an RL step on a random-initialised Qwen3 (no hub access),
the same step Lathe's GrpoTrainer takes in tools/bench/grpo/grpo-step.ts:
  1. generation   policy.generate, sampling (temperature 1, no top-k/top-p), G completions per prompt,
                  exactly N new tokens per row (no stop tokens)
  2. rewards      on the host: share of even token ids in each completion (grpo-step.ts's reward),
                  then GRPO advantages (r - group mean) / (group std + 1e-6) (included in rewards_s)
  3. scoring      old log-probs (the policy) and reference log-probs (a frozen copy) of every
                  completion token, one forward over prompt + completion per chunk of rows
  4. training     one PPO epoch in --minibatches AdamW steps (rows shuffled): clipped surrogate
                  (clip 0.2 / 0.28), token-mean over completion tokens, + 0.001 * k3 KL to the
                  reference; gradient accumulation over --micro rows, grad-norm clip 1.0
Precision: the policy keeps float32 master weights (and float32 AdamW state); every forward,
generation included, runs under torch.autocast(bfloat16), as Lathe's `--compute bfloat16` does. No
separate bf16 copy for generation (under autocast the keys leave the fp32 q/k RMSNorm in float32,
so the KV cache holds fp32 keys and bf16 values). The reference is a deepcopy of the initial policy.
Positions follow the attention mask (cumsum - 1), as generate computes them for left-padded rows.
Only the completion positions' logits are computed in scoring and training (logits_to_keep).
If generation runs out of memory, the prompt batch is generated in halves (then quarters, ...);
the report says how many chunks were used (gen_chunks) and whether a step's generation time includes
failed attempts (gen_oom_retries; the chunk count is kept for later steps).
The first step is warm-up: the summary gives the fastest later step (or the only one) and its phases.

usage: python3 tools/reference/grpo/grpo_step.py [--shape tiny|qwen3-0.6b] [--prompts 64] [--group 8]
         [--prompt-len 256] [--new-tokens 512] [--steps 2] [--minibatches 2] [--micro 16]
         [--score-micro 32] [--gen-chunks 1] [--lr 1e-6] [--compile] [--out PATH]  (default $OUT/grpo-step-torch.json)
"""
import argparse
import copy
import gc
import json
import os
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen3Config

# The shapes of tools/bench/grpo/grpo-step.ts (SHAPES).
SHAPES = {
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000,
                 max_position_embeddings=1024, tie_word_embeddings=True),
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                       rope_theta=1_000_000, max_position_embeddings=40960, tie_word_embeddings=True),
}
CLIP_LOW, CLIP_HIGH, KL_COEF, PAD = 0.2, 0.28, 0.001, 0


def build_models(shape):
    shape = dict(SHAPES[shape])
    theta = shape.pop("rope_theta")
    cfg = Qwen3Config(**shape, rope_parameters={"rope_type": "default", "rope_theta": theta}, initializer_range=0.02)
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa").cuda().train()
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    return cfg, policy, ref


def positions(mask):
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill_(mask == 0, 1)


def completion_logprobs(model, seqs, mask, n_new):
    """log p(token) of the last n_new tokens of each row: [rows, n_new] float32."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=seqs, attention_mask=mask, position_ids=positions(mask), logits_to_keep=n_new + 1).logits
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, seqs[:, -n_new:, None]).squeeze(-1)


def generate(policy, ids, mask, group, n_new, chunks):
    out = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for ci, cm in zip(ids.chunk(chunks), mask.chunk(chunks)):
            out.append(policy.generate(ci, attention_mask=cm, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                       max_new_tokens=n_new, min_new_tokens=n_new, num_return_sequences=group,
                                       eos_token_id=None, pad_token_id=PAD))
    return torch.cat(out)  # [prompts * group, width + n_new], the G completions of a prompt adjacent


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-0.6b", choices=list(SHAPES))
    for name, default in [("prompts", 64), ("group", 8), ("prompt-len", 256), ("new-tokens", 512), ("steps", 2),
                          ("minibatches", 2), ("micro", 16), ("score-micro", 32), ("gen-chunks", 1)]:
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--compile", action="store_true", help="torch.compile the training forward")
    ap.add_argument("--out", default=os.path.join(os.environ["OUT"], "grpo-step-torch.json") if os.environ.get("OUT") else None)
    a = ap.parse_args()
    P, G, L, N = a.prompts, a.group, a.prompt_len, a.new_tokens
    cfg, policy, ref = build_models(a.shape)
    train_fwd = torch.compile(policy) if a.compile else policy
    try:
        opt = torch.optim.AdamW(policy.parameters(), lr=a.lr, betas=(0.9, 0.999), weight_decay=0.0, fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(policy.parameters(), lr=a.lr, betas=(0.9, 0.999), weight_decay=0.0)
    gen = torch.Generator().manual_seed(7)
    gen_chunks, lines = a.gen_chunks, []  # --gen-chunks 2 skips a known OOM attempt at 512 rows
    for step in range(a.steps):
        # Prompts: random ids in [1, vocab - 1), lengths uniform in [L/2, L], left-padded with PAD to L.
        lens = torch.randint(L // 2, L + 1, (P,), generator=gen)
        ids = torch.full((P, L), PAD, dtype=torch.long)
        mask = torch.zeros((P, L), dtype=torch.long)
        for i, n in enumerate(lens.tolist()):
            ids[i, L - n:] = torch.randint(1, cfg.vocab_size - 1, (n,), generator=gen)
            mask[i, L - n:] = 1
        ids, mask = ids.cuda(), mask.cuda()
        torch.cuda.reset_peak_memory_stats()
        t_step = time.perf_counter()

        # 1. generation (on OOM: halve the prompt chunks and start the phase again, inside its timing)
        torch.cuda.synchronize()
        t = time.perf_counter()
        oom_retries = 0
        while True:
            try:
                seqs = generate(policy, ids, mask, G, N, gen_chunks)
                break
            except torch.cuda.OutOfMemoryError:
                if gen_chunks >= P:
                    raise
            # outside the except block, so the failed attempt's tensors are gone
            gen_chunks, oom_retries = gen_chunks * 2, oom_retries + 1
            gc.collect()
            torch.cuda.empty_cache()
            print(json.dumps({"step": step + 1, "generation_oom": True, "gen_chunks": gen_chunks}), flush=True)
        torch.cuda.synchronize()
        generation_s = time.perf_counter() - t
        assert seqs.shape == (P * G, L + N), seqs.shape
        full_mask = torch.cat([mask.repeat_interleave(G, 0), torch.ones((P * G, N), dtype=torch.long, device="cuda")], 1)

        # 2. rewards on the host, then GRPO advantages per group
        def rewards():
            r = (seqs[:, -N:].cpu() % 2 == 0).float().mean(1)
            g = r.view(P, G)
            adv = (g - g.mean(1, keepdim=True)) / (g.std(1, unbiased=False, keepdim=True) + 1e-6)
            return r, adv.view(-1).cuda()
        (r, adv), rewards_s = timed(rewards)

        # 3. old (policy) and reference log-probs of the completion tokens, in chunks of rows
        def scoring():
            chunks = list(zip(seqs.split(a.score_micro), full_mask.split(a.score_micro)))
            with torch.no_grad():
                old = torch.cat([completion_logprobs(policy, s, m, N) for s, m in chunks])
                refp = torch.cat([completion_logprobs(ref, s, m, N) for s, m in chunks])
            return old, refp
        (old, refp), scoring_s = timed(scoring)

        # 4. one PPO epoch: --minibatches AdamW steps, each accumulated over micro-batches of --micro rows.
        # Every completion has exactly N tokens, so the token mean of a minibatch divides by rows * N.
        def training():
            losses, norms = [], []
            perm = torch.randperm(P * G, generator=torch.Generator().manual_seed(1000 + step)).cuda()
            for mb in perm.chunk(a.minibatches):
                total = torch.zeros((), device="cuda")
                for rows in mb.split(a.micro):
                    new = completion_logprobs(train_fwd, seqs[rows], full_mask[rows], N)
                    ratio = torch.exp(new - old[rows])
                    A = adv[rows, None]
                    pg = -torch.minimum(ratio * A, ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH) * A)
                    d = refp[rows] - new
                    kl = torch.exp(d) - d - 1
                    loss = (pg + KL_COEF * kl).sum() / (mb.numel() * N)
                    loss.backward()
                    total += loss.detach()
                norms.append(torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0))
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(total)
            return torch.stack(losses).mean().item(), torch.stack(norms).max().item()
        (loss, grad_norm), training_s = timed(training)

        step_s = time.perf_counter() - t_step
        line = {"step": step + 1, "step_s": step_s, "generation_s": generation_s, "rewards_s": rewards_s,
                "scoring_s": scoring_s, "training_s": training_s, "tokens_generated": P * G * N,
                "gen_tokens_per_s": P * G * N / generation_s, "gen_chunks": gen_chunks,
                "gen_oom_retries": oom_retries, "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
                "reward_mean": r.mean().item(), "loss": loss, "grad_norm_max": grad_norm}
        lines.append(line)
        print(json.dumps(line), flush=True)
        del seqs, full_mask, old, refp, adv

    best = min(lines[1:] if len(lines) > 1 else lines, key=lambda l: l["step_s"])
    summary = {"summary": True, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "transformers": transformers.__version__, "shape": a.shape, "prompts": P, "group": G, "prompt_len": L,
               "new_tokens": N, "steps": a.steps, "minibatches": a.minibatches, "micro": a.micro,
               "score_micro": a.score_micro, "lr": a.lr, "compile": a.compile, "fused_adamw": bool(opt.defaults.get("fused")),
               "precision": "fp32 master weights + AdamW state, bf16 autocast for every forward (generation included)",
               "best_step": best["step"], **{k: best[k] for k in ("step_s", "generation_s", "rewards_s", "scoring_s",
                                                                 "training_s", "gen_tokens_per_s", "gen_chunks")},
               "peak_memory_gib": max(l["peak_memory_gib"] for l in lines)}
    print(json.dumps(summary), flush=True)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"summary": summary, "steps": lines}, f, indent=1)


if __name__ == "__main__":
    main()

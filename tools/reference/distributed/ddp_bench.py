"""SFT tokens/s with PyTorch DDP on the Qwen3 shapes: the reference for tools/bench/distributed/dp-check.ts.

Same model shape (random weights, transformers' Qwen3 from a config), the same global batch layout
(--batch-per-gpu rows of --seq tokens on each rank, a quarter of each row prompt), float32 master
weights and AdamW state, bfloat16 autocast compute (or float32 with --compute float32), masked
next-token loss normalised by the global loss-token count, clip 1.0, AdamW(lr, wd 0.01). One process
per GPU, started by torchrun. Prints one JSON line from rank 0: the median step time after --warmup
steps and tokens/s of the global batch.

usage: NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node N tools/reference/distributed/ddp_bench.py
         [--shape 0.6b|1.7b] [--batch-per-gpu 8] [--seq 512] [--steps 10] [--warmup 2] [--compute bfloat16|float32]
         [--attn sdpa|flash_attention_2] [--checkpointing] [--bucket-mb 25]
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import AutoModelForCausalLM, Qwen3Config

SHAPES = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=16, num_key_value_heads=8),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="0.6b", choices=sorted(SHAPES))
    ap.add_argument("--batch-per-gpu", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compute", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--bucket-mb", type=int, default=25)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--bf16-compress", action="store_true", help="bf16_compress_hook: gradients all-reduced in bfloat16 (Lathe's --grad_reduce_dtype bfloat16)")
    a = ap.parse_args()
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "run with NCCL_NVLS_ENABLE=0 (NVLink multicast off)"

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    torch.manual_seed(1)
    cfg = Qwen3Config(vocab_size=151936, num_hidden_layers=28, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000,
                      max_position_embeddings=40960, tie_word_embeddings=True, **SHAPES[a.shape])
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=a.attn).cuda().train()
    if a.checkpointing:
        model.gradient_checkpointing_enable()
    ddp = DDP(model, device_ids=[local], bucket_cap_mb=a.bucket_mb)
    if a.bf16_compress:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
        ddp.register_comm_hook(dist.group.WORLD, bf16_compress_hook)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.999), eps=1e-8)

    B, T = a.batch_per_gpu, a.seq
    g = torch.Generator().manual_seed(rank + 7)
    times, losses = [], []
    for step in range(a.steps):
        ids = torch.randint(1, cfg.vocab_size, (B, T), generator=g).cuda()
        loss_mask = torch.zeros(B, T, device="cuda")
        loss_mask[:, T // 4:] = 1
        # the global batch's loss tokens (every rank has the same layout), as Lathe normalises
        global_tokens = loss_mask[:, 1:].sum() * world
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.compute == "bfloat16"):
            logits = ddp(input_ids=ids).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        # DDP averages gradients over ranks: scale by world so the update is that of the summed, globally normalised loss
        loss = -(logp * loss_mask[:, 1:]).sum() / global_tokens * world
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item() / world)
    timed = sorted(times[min(a.warmup, a.steps - 1):])
    median = timed[len(timed) // 2]
    if rank == 0:
        print(json.dumps({
            "impl": "torch-ddp", "bf16_compress": a.bf16_compress, "torch": torch.__version__, "world": world, "shape": a.shape, "compute": a.compute, "attn": a.attn,
            "batch_per_gpu": [B, T], "step_ms": [round(t * 1000, 1) for t in times],
            "tokens_per_s": round(world * B * T / median), "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

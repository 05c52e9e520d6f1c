"""`lathe eval` against transformers generate on the same problems x samples (issue 31's device run).

Runs on the GPU machine (PyTorch + transformers, no hub access):
1. Writes a random Qwen3-0.6B-shape model (bfloat16, std 0.02; norm weights from [0.5, 1.5]) with
   Qwen3's tokenizer files beside it (from .bundle/qwen3-tokenizer).
2. Runs .bundle/eval-bench.js on that folder: the benchmarks' problems under the qwen-boxed chat
   template, --n samples each, graded while generating; its JSON (generation, grading after the last
   completion, reference-solution grading cost) and the rendered prompt ids (--prompts-out).
3. transformers generate on the same prompt ids x samples: sampling at the same temperature, top-p
   and top-k, no stop token and min_new_tokens = max_new_tokens (every sample runs to the limit, as
   Lathe's side does without --stop-at-eos), rows left-padded in batches of --hf-batch in the same
   order, sdpa attention, its default dynamic cache. Timed after a one-batch warm-up.
Prints one JSON line: {"lathe": {...}, "hf": {...}, "speedup": hf generation s / lathe generation s,
"full_set_estimate": the seven full sets at this n and max_new, at the rates measured (generation on
each side; grading as the reference solutions' measured cost per completion)}.

usage: python3 tools/reference/eval/hf_generate_eval.py [--data-dir fixtures/eval] [--benchmarks all]
         [--limit 2] [--n 8] [--max-new 4096] [--batch 64] [--hf-batch 64] [--temperature 0.6]
         [--top-p 0.95] [--top-k 0] [--grade-workers 8] [--out DIR]
Needs .bundle/eval-bench.js and .bundle/qwen3-tokenizer (tools/bench/build-device-bundles.sh eval-bench).
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
BUNDLE = os.path.join(ROOT, ".bundle", "eval-bench.js")
TOKENIZER = os.path.join(ROOT, ".bundle", "qwen3-tokenizer")
# aime24 30 + aime25 30 + amc23 40 + math500 500 + minerva 272 + olympiadbench 675 + gsm8k 1319
FULL_PROBLEMS = 2866


def qwen3_06b():
    return Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                       rope_theta=1_000_000, max_position_embeddings=40960, tie_word_embeddings=True)


def save_random(path):
    torch.manual_seed(0)
    cfg = qwen3_06b()
    cfg.initializer_range = 0.02
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER, f), os.path.join(path, f))
    return model.cuda().eval()


def run_lathe(args, model_dir, prompts_file):
    cmd = ["node", BUNDLE, "--model", model_dir, "--tokenizer", TOKENIZER, "--data-dir", args.data_dir,
           "--benchmarks", args.benchmarks, "--limit", str(args.limit), "--n", str(args.n), "--max-new", str(args.max_new),
           "--batch", str(args.batch), "--temperature", str(args.temperature), "--top-p", str(args.top_p),
           "--top-k", str(args.top_k), "--grade-workers", str(args.grade_workers), "--grade-references",
           "--prompts-out", prompts_file, "--device", "cuda", "--dtype", "bfloat16"]
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-4000:])
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["process_s"] = round(time.perf_counter() - t, 2)
    return out


def hf_generate(model, rows, args):
    """Every row (prompt ids) sampled once to max_new tokens, in batches: (new tokens, generation s, warm-up s)."""
    kw = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
              max_new_tokens=args.max_new, min_new_tokens=args.max_new, eos_token_id=None, pad_token_id=0)

    def batch_tensors(chunk):
        P = max(len(r) for r in chunk)
        ids = torch.tensor([[0] * (P - len(r)) + r for r in chunk]).cuda()
        mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in chunk]).cuda()
        return ids, mask

    with torch.no_grad():
        ids, mask = batch_tensors(rows[:1])
        t = time.perf_counter()
        model.generate(ids, attention_mask=mask, **{**kw, "max_new_tokens": 16, "min_new_tokens": 16})
        torch.cuda.synchronize()
        warm_s = time.perf_counter() - t
        torch.manual_seed(args.seed)
        new_tokens = 0
        t = time.perf_counter()
        for i in range(0, len(rows), args.hf_batch):
            ids, mask = batch_tensors(rows[i:i + args.hf_batch])
            out = model.generate(ids, attention_mask=mask, **kw)
            new_tokens += (out.shape[1] - ids.shape[1]) * out.shape[0]
        torch.cuda.synchronize()
        gen_s = time.perf_counter() - t
    return new_tokens, gen_s, warm_s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=os.path.join(ROOT, "fixtures", "eval"))
    ap.add_argument("--benchmarks", default="all")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--grade-workers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    work = args.out or tempfile.mkdtemp(prefix="eval-ref-")
    os.makedirs(work, exist_ok=True)
    model_dir = os.path.join(work, "qwen3-0.6b-random")
    t = time.perf_counter()
    model = save_random(model_dir)
    model_s = time.perf_counter() - t
    prompts_file = os.path.join(work, "prompts.json")
    lathe = run_lathe(args, model_dir, prompts_file)
    with open(prompts_file) as f:
        problems = json.load(f)
    rows = [p["ids"] for p in problems for _ in range(p["samples"])]
    new_tokens, gen_s, warm_s = hf_generate(model, rows, args)
    hf = {"samples": len(rows), "new_tokens": new_tokens, "generation_s": round(gen_s, 2), "warmup_s": round(warm_s, 2),
          "new_tokens_per_s": round(new_tokens / gen_s), "batch": args.hf_batch, "cache": "dynamic", "attention": "sdpa",
          "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    # The full seven sets (2,866 problems) at this n and max_new, at the rates measured here.
    full = FULL_PROBLEMS * args.n
    grading = lathe.get("reference_grading", {})
    estimate = {"samples": full, "new_tokens": full * args.max_new,
                "lathe_generation_s": round(full * args.max_new / lathe["new_tokens_per_s"]),
                "hf_generation_s": round(full * args.max_new / hf["new_tokens_per_s"]),
                "grading_cpu_s": round(full * grading.get("ms_per_completion", 0) / 1000, 1)}
    result = {"model_s": round(model_s, 1), "lathe": lathe, "hf": hf,
              "speedup": round(gen_s / max(1e-9, lathe["generation_s"]), 2), "full_set_estimate": estimate}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Generation: Lathe (the KV-cache generator, or the in-graph decode loop) vs transformers generate.

Runs on the GPU machine (PyTorch + transformers, no hub access).
1. Agreement: a small Qwen3 (norm weights drawn from [0.5, 1.5], so they matter), greedy, 4 prompts
   x 48 new tokens. The in-graph engine runs in float32 and its tokens must equal transformers'. The
   KV engine runs in bfloat16, where near-ties flip, so besides where its rows first diverge from
   transformers' greedy rows, the log-probs it reports for its own tokens are compared with
   transformers' teacher-forced float32 log-probs of the same sequences, beside transformers' own
   bfloat16 error on them (its spread).
2. Throughput: the Qwen3-0.6B shape in bfloat16, greedy, B prompts of P tokens, N new tokens, no
   stop tokens (every row runs to N): new tokens/s for transformers generate (sdpa; its dynamic
   cache, and with --hf-cache also its static cache, which generate compiles with torch.compile)
   and for Lathe, timed the same way (best of repeats after a warm-up, which for transformers'
   static cache includes the compile). The ratio is against the fastest transformers set-up.

usage: python3 tools/reference/rollout/generate_bench.py [--out DIR] [--batch 32] [--prompt 128] [--prompt-kind ragged|unpadded] [--new 128]
         [--engine kv|graph] [--prev] [--hf-cache dynamic,static,static_eager] [--lathe-modes plain,cuda_graph,cuda_graph_fast]
         [--workloads 256:ragged,64:unpadded] [--hf-cache-for ragged=static,unpadded=dynamic]
Needs .bundle/lathe-generate.js or .bundle/lathe-kv-generate.js (tools/bench/build-device-bundles.sh);
--prev also times .bundle/lathe-kv-generate-prev.js (an earlier build, one that takes several prompt
files in one --prompts) with CUDA graphs in the same call.
"""
import argparse
import json
import os
import subprocess
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

NODE_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", ".bundle", "lathe-generate.js")
KV_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", ".bundle", "lathe-kv-generate.js")
KV_PREV_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", ".bundle", "lathe-kv-generate-prev.js")


def qwen3_06b():
    return Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                       rope_theta=1_000_000, max_position_embeddings=40960, tie_word_embeddings=True)


def qwen3_small():
    return Qwen3Config(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=32, rms_norm_eps=1e-6,
                       rope_theta=10000, max_position_embeddings=512, tie_word_embeddings=True)


def save_random(cfg, path, dtype, std):
    torch.manual_seed(0)
    cfg.initializer_range = std
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with torch.no_grad():  # norm weights other than 1, so a norm applied with the wrong weight shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path, safe_serialization=True)
    return model.cuda().eval()


def prompts(vocab, batch, length, seed, kind="ragged"):
    g = torch.Generator().manual_seed(seed)
    # Ragged prompts (left-padded by both sides) from length/2 to length tokens; unpadded: all of length.
    lens = torch.randint(length // 2, length + 1, (batch,), generator=g).tolist()
    lens[0] = length
    if kind == "unpadded":
        lens = [length] * batch
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lens]


HF_CACHES = {
    # transformers' default: a cache grown by concatenation every step, eager forward.
    "dynamic": {},
    # A preallocated cache: generate compiles the decode forward with torch.compile on its own
    # (transformers' auto-compile for compileable caches; CUDA graphs via "reduce-overhead").
    "static": {"cache_implementation": "static"},
    # The same preallocated cache with the auto-compile turned off, to show what each part buys.
    "static_eager": {"cache_implementation": "static", "disable_compile": True},
}


def hf_generate(model, rows, new, repeat, cache="dynamic"):
    """transformers generate on left-padded `rows`: (new tokens per row, best of `repeat` timed calls in s, the warm-up call in s)."""
    P = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (P - len(r)) + r for r in rows]).cuda()
    mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows]).cuda()
    kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=0,
              **HF_CACHES[cache])
    with torch.no_grad():
        t = time.perf_counter()
        # a whole call: after a short warm-up the dynamic cache's timed call ran slower
        out = model.generate(ids, **kw)  # warm-up; for the static cache, also torch.compile's compile
        torch.cuda.synchronize()
        warm_s = time.perf_counter() - t
        times = []
        for _ in range(repeat):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = model.generate(ids, **kw)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    return out[:, P:].tolist(), min(times), warm_s


def lathe_generate(path, rows, new, dtype, out_dir, repeat, engine="graph", extra=(), label="lathe", script=None):
    """Runs a Lathe engine on `rows`: each row's output as the script wrote it, and its report."""
    pfile = os.path.join(out_dir, "prompts.json")
    tfile = os.path.join(out_dir, f"{label}-samples.json")
    with open(pfile, "w") as f:
        json.dump(rows, f)
    script = script or (KV_SCRIPT if engine == "kv" else NODE_SCRIPT)
    cmd = ["node", script, "--model", path, "--prompts", pfile, "--max-new", str(new), "--dtype", dtype,
           "--repeat", str(repeat), "--out", tfile, *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "NVIDIA_TF32_OVERRIDE": "0"})
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-4000:])
    with open(tfile) as f:
        return json.load(f), json.loads(res.stdout.strip().splitlines()[-1])


def lathe_generate_sets(path, sets, new, dtype, out_dir, repeat, engine, extra, label, script=None):
    """Runs a Lathe engine once over several prompt sets: each set's report, in order (the KV engine's
    script takes them all in one process; the in-graph one runs once per set)."""
    if engine != "kv":
        return [lathe_generate(path, rows, new, dtype, out_dir, repeat, engine, extra, f"{label}-{k}", script)[1] for k, rows in enumerate(sets)]
    files = []
    for k, rows in enumerate(sets):
        files.append(os.path.join(out_dir, f"prompts-{k}.json"))
        with open(files[-1], "w") as f:
            json.dump(rows, f)
    cmd = ["node", script or KV_SCRIPT, "--model", path, "--prompts", ",".join(files), "--max-new", str(new), "--dtype", dtype,
           "--repeat", str(repeat), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "NVIDIA_TF32_OVERRIDE": "0"})
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-4000:])
    lines = [json.loads(l) for l in res.stdout.strip().splitlines() if l.startswith("{")]
    if len(lines) != len(sets):
        raise RuntimeError(f"expected {len(sets)} reports, got {len(lines)}: {res.stdout[-1000:]}")
    return lines


def tokens_of(samples):
    """Token lists from an engine's --out file: plain lists (in-graph engine) or {tokens, raw} (KV engine)."""
    return [s["tokens"] if isinstance(s, dict) else s for s in samples]


def teacher_forced(model, rows, samples):
    """transformers' log-prob of each sampled token given its prompt and the tokens before it."""
    out = []
    with torch.no_grad():
        for prompt, s in zip(rows, samples):
            ids = torch.tensor([prompt + s["tokens"]]).cuda()
            logp = torch.log_softmax(model(ids).logits.float()[0], -1)
            at = torch.arange(len(prompt) - 1, len(prompt) + len(s["tokens"]) - 1)
            out.append(logp[at, ids[0, at + 1]].tolist())
    return out


def abs_diff(a, b):
    d = [abs(x - y) for r, q in zip(a, b) for x, y in zip(r, q)]
    return {"max": round(max(d), 5), "mean": round(sum(d) / len(d), 6)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/lathe-generate")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-agreement", action="store_true")
    ap.add_argument("--engine", choices=["graph", "kv"], default="kv",
                    help="kv: the KV-cache generator (GroupQueryAttention, bf16/fp16 on CUDA), with and without CUDA graphs")
    ap.add_argument("--prev", action="store_true", help="kv: also time .bundle/lathe-kv-generate-prev.js (CUDA graphs)")
    ap.add_argument("--prompt-kind", choices=["ragged", "unpadded"], default="ragged",
                    help="ragged: lengths from prompt/2 to prompt, left-padded; unpadded: every prompt of --prompt tokens")
    ap.add_argument("--workloads", default="", help="several throughput runs in one process, e.g. 256:ragged,64:unpadded (batch:prompt kind)")
    ap.add_argument("--hf-cache-for", default="", help="transformers set-ups per prompt kind, or kind@batch, e.g. ragged=static,unpadded=dynamic,unpadded@64=static;dynamic (else --hf-cache)")
    ap.add_argument("--hf-cache", default="dynamic",
                    help="comma-separated transformers set-ups to time: " + ", ".join(HF_CACHES) + "; the ratio is against the fastest")
    ap.add_argument("--lathe-modes", default="plain,cuda_graph", help="kv: plain, cuda_graph and/or cuda_graph_fast (the opt-in kernels: lathe-kv-generate.js --fast)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}

    if not a.skip_agreement:
        path = os.path.join(a.out, "qwen3-small")
        # The KV-cache engine's GroupQueryAttention runs in half precision only: compare in bf16
        # against transformers in bf16, and report where each row first diverges (bf16 rounding
        # makes near-ties flip; an engine bug diverges at once).
        dtype = torch.bfloat16 if a.engine == "kv" else torch.float32
        model = save_random(qwen3_small(), path, dtype, 0.2)
        rows = prompts(1000, 4, 24, 1)
        ref, _, _ = hf_generate(model, rows, 48, 1)
        samples, info = lathe_generate(path, rows, 48, "bfloat16" if a.engine == "kv" else "float32", a.out, 1, a.engine)
        got = tokens_of(samples)
        same = sum(x == y for r, g in zip(ref, got) for x, y in zip(r, g))
        first = [next((i for i, (x, y) in enumerate(zip(r, g)) if x != y), len(r)) for r, g in zip(ref, got)]
        report["agreement"] = {"model": f"qwen3-small {dtype}", "engine": a.engine, "tokens_equal": same, "tokens": 4 * 48,
                               "rows_equal": sum(r == g for r, g in zip(ref, got)), "rows": 4, "first_divergence": first, "lathe": info}
        if a.engine == "kv":
            exact = teacher_forced(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval(), rows, samples)
            report["agreement"]["raw_logprob_vs_hf_fp32"] = abs_diff([s["raw"] for s in samples], exact)
            report["agreement"]["hf_bf16_vs_hf_fp32"] = abs_diff(teacher_forced(model, rows, samples), exact)
        print(json.dumps(report["agreement"]), flush=True)
        del model
        torch.cuda.empty_cache()

    if not a.skip_throughput:
        path = os.path.join(a.out, "qwen3-0.6b")
        model = save_random(qwen3_06b(), path, torch.bfloat16, 0.02)
        workloads = [(int(b), k) for b, k in (w.split(":") for w in a.workloads.split(","))] if a.workloads else [(a.batch, a.prompt_kind)]
        per_kind = dict(x.split("=") for x in a.hf_cache_for.split(",")) if a.hf_cache_for else {}
        report["workloads"] = []
        compiled_batch = None  # the static cache's compiled graphs serve every workload of one batch size
        all_rows = []
        for batch, kind in workloads:
            rows = prompts(151936, batch, a.prompt, 2, kind)
            all_rows.append(rows)
            hf = {}
            for cache in per_kind.get(f"{kind}@{batch}", per_kind.get(kind, a.hf_cache)).replace(";", ",").split(","):
                if cache not in HF_CACHES:
                    raise SystemExit(f"--hf-cache: unknown set-up {cache!r} (choose from {', '.join(HF_CACHES)})")
                if cache == "static" and compiled_batch not in (None, batch):
                    torch._dynamo.reset()
                _, hf_s, warm_s = hf_generate(model, rows, a.new, a.repeat, cache)
                compiled_batch = batch if cache == "static" else compiled_batch
                hf[cache] = {"new_tokens_per_s": round(batch * a.new / hf_s), "warm_up_s": round(warm_s, 1)}
                print(json.dumps({"hf": cache, "batch": batch, "prompt_kind": kind, **hf[cache]}), flush=True)
                torch.cuda.empty_cache()
            hf_tps = max(v["new_tokens_per_s"] for v in hf.values())
            report["workloads"].append({"model": "qwen3-0.6b shape, bf16", "batch": batch, "prompt_max": a.prompt, "prompt_kind": kind, "new": a.new,
                                        "hf": hf, "hf_new_tokens_per_s": hf_tps, "engine": a.engine})
        # Lathe after transformers, each mode in one process over every workload (one weight upload;
        # one generator per batch size).
        # cuda_graph_fast: the KV engine's opt-in kernels and options together (lathe-kv-generate.js --fast:
        # Lathe's decode attention over an e4m3 cache, packed projections, SwiGLU kernel, bf16 residual, greedy pick)
        kv_modes = {"plain": ("plain", (), None), "cuda_graph": ("cuda_graph", ("--cuda-graph",), None), "cuda_graph_fast": ("cuda_graph_fast", ("--cuda-graph", "--fast"), None)}
        modes = [kv_modes[m] for m in a.lathe_modes.split(",")] if a.engine == "kv" else [("graph", (), None)]
        if a.engine == "kv" and a.prev:
            modes.append(("cuda_graph_prev", ("--cuda-graph",), KV_PREV_SCRIPT))
        for label, extra, script in modes:
            try:
                infos = lathe_generate_sets(path, all_rows, a.new, "bfloat16", a.out, a.repeat, a.engine, extra, label, script)
            except RuntimeError as e:
                for tp in report["workloads"]:
                    tp[label] = {"error": str(e)[-1500:]}
                continue
            for tp, info in zip(report["workloads"], infos):
                tp[label] = {"lathe_new_tokens_per_s": info["new_tokens_per_s"], "ratio": round(info["new_tokens_per_s"] / tp["hf_new_tokens_per_s"], 3), "lathe": info}
        for tp in report["workloads"]:
            print(json.dumps(tp), flush=True)
        report["throughput"] = report["workloads"][0]
        del model
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, f"generate-{a.engine}-{'suite' if a.workloads else a.batch}.json"), "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()

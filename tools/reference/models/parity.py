"""Logit parity and scoring throughput: Lathe vs transformers on random-initialised models.

Runs on the GPU machine (PyTorch + transformers, no hub access). For each model it builds a random
transformers model, saves it as a Hugging Face folder, runs the same left-padded batch through
transformers (fp32 eager; bf16 and fp16 sdpa, the spreads) and through Lathe in fp32, bf16 (composed
and GroupQueryAttention) and fp16 (tools/bench/models/lathe-logits.ts, bundled to
.bundle/lathe-logits.js), and compares the logits at non-pad positions. Then it times
scoring (per-token log-probs) on the Qwen3-0.6B shape, 16 x 1024, bf16, both ways.

--save-check: after Lathe's runs on each model, Lathe also writes the model with its own saver
(lathe-logits --save, i.e. saveHfModel); transformers must load that folder with no missing,
unexpected or mismatched weights and give fp32 logits within 1e-5 of the original model's.

usage: python3 tools/reference/models/parity.py [--out DIR] [--skip-throughput] [--seeds 1] [--save-check]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

NODE_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", ".bundle", "lathe-logits.js")

MODELS = {
    # The Qwen3-0.6B shape (tied embeddings, QK-norm, GQA 16/8, head_dim 128).
    "qwen3-0.6b": lambda: Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        rope_theta=1_000_000, max_position_embeddings=40960, tie_word_embeddings=True),
    # A small Qwen2 with q/k/v biases, GQA 8/2.
    "qwen2-small": lambda: Qwen2Config(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000,
        max_position_embeddings=512, tie_word_embeddings=False),
    # A small Llama with llama3 RoPE scaling, GQA 8/4.
    "llama-small": lambda: LlamaConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, rms_norm_eps=1e-5, rope_theta=500000,
        max_position_embeddings=512, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
}


def make_model(name, root, seed=0):
    torch.manual_seed(seed)
    cfg = MODELS[name]()
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # transformers initialises Linear biases to zero, which would leave Qwen2's bias loading and
    # adds untested (and their rounding invisible): give them values of a trained model's size.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(".bias"):
                p.normal_(0.0, 0.5)
    path = os.path.join(root, name if seed == 0 else f"{name}-seed{seed}")
    model.save_pretrained(path, safe_serialization=True)
    return model, path


def make_batch(vocab, batch, length, pads, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row, p in enumerate(pads):
        ids[row, :p] = 0
        mask[row, :p] = 0
    return ids, mask


def hf_logits(model, ids, mask, dtype, attn):
    model = model.to(dtype)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(attn)
    else:
        model.config._attn_implementation = attn
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids.cuda(), attention_mask=mask.cuda(), position_ids=pos.cuda()).logits
    return out.float().cpu()


def lathe_logits(path, batch_file, dtype, out_file, log_dir, extra=()):
    env = dict(os.environ)
    env["NVIDIA_TF32_OVERRIDE"] = "0"  # fp32 parity: no TF32 inside cuBLAS (torch has TF32 off too)
    cmd = ["node", NODE_SCRIPT, "--model", path, "--batch", batch_file, "--dtype", dtype, "--device", "cuda", "--out", out_file, *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode == 0:
        out = json.loads(res.stdout.strip().splitlines()[-1])
        out["cpu_fallback"] = False
        return out
    if "fallback to CPU EP has been explicitly disabled" not in res.stderr:
        raise RuntimeError(f"lathe-logits failed for {path} {dtype}:\n{res.stderr[-3000:]}")
    # Some node has no CUDA kernel (or ORT prefers the CPU for it): record where nodes went.
    log = os.path.join(log_dir, f"placement-{os.path.basename(path)}-{dtype}.log")
    res = subprocess.run(cmd + ["--allow-cpu-fallback", "--log", "0"], capture_output=True, text=True, env=env)
    with open(log, "w") as f:
        f.write(res.stderr)
    if res.returncode != 0:
        raise RuntimeError(f"lathe-logits failed for {path} {dtype} even with CPU fallback:\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["cpu_fallback"] = True
    out["cpu_nodes"] = sorted({l.split("node: ")[-1].split(" ")[0] for l in res.stderr.splitlines() if "Force fallback to CPU execution for node" in l})
    return out


SAVE_CHECK_TOL = 1e-5


def save_check(path, ids, mask, ref32):
    """Lathe saves the model at `path`; transformers loads Lathe's folder; fp32 logits vs `ref32`."""
    saved = path.rstrip("/") + "-lathe-saved"
    res = subprocess.run(["node", NODE_SCRIPT, "--model", path, "--save", saved], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"lathe-logits --save failed for {path}:\n{res.stderr[-3000:]}")
    model, info = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    # Weights transformers had to initialise itself (missing) or drop (unexpected) would make the
    # logits differ too, but naming them says what the saver got wrong.
    loading = {k: sorted(str(x) for x in v) for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    model.cuda()
    logits = hf_logits(model, ids, mask, torch.float32, "eager")
    row = compare(logits, ref32, mask)
    row.update(loading)
    row["ok"] = row["max_abs"] <= SAVE_CHECK_TOL and not any(loading.values())
    del model
    torch.cuda.empty_cache()
    return row


def compare(lathe, ref, mask):
    valid = mask.bool()
    d = (lathe - ref)[valid]
    r = ref[valid]
    a = d.abs().double()
    return {
        "max_abs": a.max().item(),
        # a max over a few thousand logits is noisy; the mean and the 99.9th percentile are not
        "mean_abs": a.mean().item(),
        "p999_abs": torch.quantile(a.flatten()[:: max(1, a.numel() // 8_000_000)], 0.999).item(),
        "rel_to_max": (d.abs().max() / r.abs().max()).item(),
        "rel_fro": (d.norm() / r.norm()).item(),
    }


def parity(root, out, seeds=1, check_save=False):
    results = {}
    # the small models again with other weights: how much of a gap to the spread is one draw's luck
    runs = [(name, 0) for name in MODELS] + [(name, s) for s in range(1, seeds) for name in MODELS if name != "qwen3-0.6b"]
    for name, seed in runs:
        model, path = make_model(name, root, seed)
        model.cuda()
        vocab = model.config.vocab_size
        B, T = (4, 128) if name == "qwen3-0.6b" else (8, 24)
        pads = [0, 7, 0, 30] if name == "qwen3-0.6b" else [0, 7, 13, 0, 3, 5, 0, 11]
        ids, mask = make_batch(vocab, B, T, pads, seed=1)
        batch_file = os.path.join(root, f"{name}-batch.json")
        name = name if seed == 0 else f"{name}@seed{seed}"
        with open(batch_file, "w") as f:
            json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist()}, f)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        ref32 = hf_logits(model, ids, mask, torch.float32, "eager")
        ref16 = hf_logits(model, ids, mask, torch.bfloat16, "sdpa")
        ref_half = hf_logits(model, ids, mask, torch.float16, "sdpa")
        row = {"hf_bf16_vs_hf_fp32": compare(ref16, ref32, mask), "hf_fp16_vs_hf_fp32": compare(ref_half, ref32, mask)}
        # GroupQueryAttention (flash attention) runs in half precision only on CUDA.
        for dtype, extra, label in (("float32", (), "float32"), ("bfloat16", (), "bfloat16"), ("bfloat16", ("--gqa",), "bfloat16_gqa"), ("float16", (), "float16")):
            out_file = os.path.join(root, f"{name}-{label}.bin")
            timing = lathe_logits(path, batch_file, dtype, out_file, out, extra)
            lathe = torch.frombuffer(bytearray(open(out_file, "rb").read()), dtype=torch.float32).reshape(B, T, vocab)
            row[f"lathe_{label}_vs_hf_fp32"] = compare(lathe, ref32, mask)
            row[f"lathe_{label}_timing"] = timing
        if check_save:
            row["lathe_saved_hf_fp32_vs_hf_fp32"] = save_check(path, ids, mask, ref32)
            print(f"{name}: save check {row['lathe_saved_hf_fp32_vs_hf_fp32']}", flush=True)
        results[name] = row
        print(f"{name}: fp32 max_abs={row['lathe_float32_vs_hf_fp32']['max_abs']:.2e} "
              f"rel={row['lathe_float32_vs_hf_fp32']['rel_to_max']:.2e} | "
              f"bf16 lathe={row['lathe_bfloat16_vs_hf_fp32']['max_abs']:.3e} "
              f"bf16 lathe gqa={row['lathe_bfloat16_gqa_vs_hf_fp32']['max_abs']:.3e} "
              f"hf-bf16 spread={row['hf_bf16_vs_hf_fp32']['max_abs']:.3e} | mean abs: "
              f"lathe={row['lathe_bfloat16_vs_hf_fp32']['mean_abs']:.3e} gqa={row['lathe_bfloat16_gqa_vs_hf_fp32']['mean_abs']:.3e} "
              f"spread={row['hf_bf16_vs_hf_fp32']['mean_abs']:.3e} | rel_fro: lathe={row['lathe_bfloat16_vs_hf_fp32']['rel_fro']:.3e} "
              f"gqa={row['lathe_bfloat16_gqa_vs_hf_fp32']['rel_fro']:.3e} spread={row['hf_bf16_vs_hf_fp32']['rel_fro']:.3e} "
              f"| fp16 lathe max={row['lathe_float16_vs_hf_fp32']['max_abs']:.3e} mean={row['lathe_float16_vs_hf_fp32']['mean_abs']:.3e} "
              f"hf-fp16 spread max={row['hf_fp16_vs_hf_fp32']['max_abs']:.3e} mean={row['hf_fp16_vs_hf_fp32']['mean_abs']:.3e} "
              f"cpu_fallback={[row[f'lathe_{d}_timing']['cpu_fallback'] for d in ('float32', 'bfloat16', 'float16')]}", flush=True)
        del model
        torch.cuda.empty_cache()
    return results


def throughput(root, B=16, T=1024, repeat=5):
    path = os.path.join(root, "qwen3-0.6b")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    ids, mask = make_batch(model.config.vocab_size, B, T, [0] * B, seed=2)
    ids, mask = ids.cuda(), mask.cuda()
    res = {}
    with torch.no_grad():
        for label, logprobs in (("hf_logits", False), ("hf_logprobs", True)):
            times = []
            for i in range(repeat + 1):
                torch.cuda.synchronize()
                t = time.perf_counter()
                logits = model(input_ids=ids, attention_mask=mask).logits
                if logprobs:
                    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])
                torch.cuda.synchronize()
                if i:
                    times.append(time.perf_counter() - t)
                del logits
            res[label] = {"best_s": min(times), "tokens_per_s": B * T / min(times)}
    del model
    torch.cuda.empty_cache()
    batch_file = os.path.join(root, "throughput-batch.json")
    with open(batch_file, "w") as f:
        json.dump({"input_ids": ids.cpu().tolist(), "attention_mask": mask.cpu().tolist()}, f)
    for label, extra in (("lathe_logprobs", []), ("lathe_logprobs_gqa", ["--gqa"])):
        proc = subprocess.run(["node", NODE_SCRIPT, "--model", path, "--batch", batch_file, "--dtype", "bfloat16",
                               "--device", "cuda", "--logprobs", "--repeat", str(repeat), *extra], capture_output=True, text=True)
        if proc.returncode != 0:
            res[label] = {"error": proc.stderr[-3000:]}
            continue
        res[label] = json.loads(proc.stdout.strip().splitlines()[-1])
        res[f"ratio_{label}_vs_hf_logprobs"] = res[label]["tokens_per_s"] / res["hf_logprobs"]["tokens_per_s"]
    print(json.dumps(res), flush=True)
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/lathe-parity-out"))
    p.add_argument("--root", default="/tmp/lathe-parity")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--only-throughput", action="store_true")
    p.add_argument("--seeds", type=int, default=1, help="weight seeds for the small models (1 = seed 0 only)")
    p.add_argument("--save-check", action="store_true",
                   help="also save each model with Lathe's saver and check transformers loads it to the same fp32 logits (1e-5)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.root, exist_ok=True)
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "transformers": __import__("transformers").__version__}
    if not a.only_throughput:
        report["parity"] = parity(a.root, a.out, a.seeds, a.save_check)
        failed = [n for n, r in report["parity"].items() if not r.get("lathe_saved_hf_fp32_vs_hf_fp32", {"ok": True})["ok"]]
        if failed:
            print(f"save check FAILED for {failed}", flush=True)
    if not a.skip_throughput:
        try:
            report["throughput"] = throughput(a.root)
        except Exception as e:  # keep the parity results when the timing run fails
            report["throughput"] = {"error": str(e)[-2000:]}
            print("throughput failed:", str(e)[-1500:], flush=True)
    with open(os.path.join(a.out, "models-parity.json"), "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())

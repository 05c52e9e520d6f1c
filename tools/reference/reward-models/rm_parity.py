"""Reward-model checkpoints against transformers: Lathe turns a random Qwen3 causal LM into a reward
model (score head N(0, 0.02²)), saves it as a sequence-classification folder, loads it back and
scores token rows; transformers' AutoModelForSequenceClassification loads the same folder and
scores the same rows (fp32, sdpa). Right- and left-padded rows; left-padded rows get transformers
the positions Lathe uses (cumsum(mask) − 1), since its forward counts positions from column 0.

Runs on the GPU machine (.bundle/rm-parity.js from tools/bench/build-device-bundles.sh rm-parity).
usage: python3 tools/reference/reward-models/rm_parity.py [--out DIR]
Prints one JSON line per model shape and padding side: the max |Lathe − transformers| and whether
it is within 1e-4.
"""
import argparse
import json
import os
import subprocess

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, Qwen3Config

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", ".bundle", "rm-parity.js")
SHAPES = {
    # the Qwen3-0.6B widths with 4 of its 28 layers: every per-layer shape of the real model
    "qwen3-0.6b-widths": dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_hidden_layers=4, vocab_size=151936),
    "small": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_hidden_layers=2, vocab_size=1000),
}


def rows(vocab, side, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = [17, 5, 32, 1, 24, 9]
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for r, n in enumerate(lengths):
        toks = torch.randint(1, vocab, (n,), generator=g)  # never the pad id 0
        cols = slice(0, n) if side == "right" else slice(T - n, T)
        ids[r, cols] = toks
        mask[r, cols] = 1
    return ids, mask


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/lathe-rm-parity")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ok = True
    for name, shape in SHAPES.items():
        torch.manual_seed(0)
        cfg = Qwen3Config(**shape, max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False, pad_token_id=0)
        lm_dir = os.path.join(a.out, name, "lm")
        AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(lm_dir, safe_serialization=True)
        for side in ("right", "left"):
            ids, mask = rows(shape["vocab_size"], side, 1)
            batch = os.path.join(a.out, name, f"batch-{side}.json")
            with open(batch, "w") as f:
                json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist()}, f)
            rm_dir = os.path.join(a.out, name, "rm")
            res = subprocess.run(["node", SCRIPT, "--model", lm_dir, "--out", rm_dir, "--batch", batch, "--device", "cuda", "--dtype", "float32"],
                                 capture_output=True, text=True, env={**os.environ, "NVIDIA_TF32_OVERRIDE": "0"})
            if res.returncode != 0:
                print(json.dumps({"shape": name, "padding": side, "error": res.stderr[-2000:]}), flush=True)
                ok = False
                continue
            lathe = torch.tensor(json.loads(res.stdout.strip().splitlines()[-1])["scores"], dtype=torch.float64)
            model = AutoModelForSequenceClassification.from_pretrained(rm_dir, dtype=torch.float32, attn_implementation="sdpa").cuda().eval()
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                hf = model(input_ids=ids.cuda(), attention_mask=mask.cuda(), position_ids=pos.cuda()).logits[:, 0].double().cpu()
            diff = (lathe - hf).abs().max().item()
            ok = ok and diff <= 1e-4
            print(json.dumps({"shape": name, "padding": side, "rows": len(ids), "max_abs": diff, "scale": hf.abs().max().item(),
                              "architecture": model.config.architectures, "num_labels": model.config.num_labels, "within_1e-4": diff <= 1e-4}), flush=True)
            del model
            torch.cuda.empty_cache()
    print(json.dumps({"rm_parity": "pass" if ok else "FAIL"}), flush=True)


if __name__ == "__main__":
    main()

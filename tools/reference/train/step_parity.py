"""One AdamW step of SFT: Lathe's compiled train step vs PyTorch, on a random-initialised Qwen3.

Runs on the GPU machine. Builds a small Qwen3 in float32 with transformers, saves it, makes a
right-padded batch with a response-only loss mask, and takes one optimizer step both ways with the
same hyperparameters: masked next-token NLL summed and divided by the number of loss tokens,
clip_grad_norm_(1.0), AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01 on matrices
and embeddings, 0 on norms). Reports the loss difference and each parameter's update error
(norm-wise ‖Δ_lathe − Δ_torch‖ / ‖Δ_torch‖, and element-wise max |Δ_lathe − Δ_torch| / max |Δ_torch|).

usage: python3 tools/reference/train/step_parity.py [--out DIR]
Needs .bundle/lathe-step.js (esbuild of tools/bench/train/lathe-step.ts).
"""
import argparse
import json
import os
import subprocess

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen3Config

NODE_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", ".bundle", "lathe-step.js")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/lathe-step")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                      rope_theta=10000, max_position_embeddings=256, tie_word_embeddings=True,
                      initializer_range=0.1)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    path = os.path.join(a.out, "qwen3-small")
    model.save_pretrained(path, safe_serialization=True)
    model = model.cuda().train()

    g = torch.Generator().manual_seed(1)
    B, T = 4, 48
    lens = [48, 40, 33, 20]
    prompt = [10, 12, 8, 5]
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T, dtype=torch.long)
    for r in range(B):
        ids[r, :lens[r]] = torch.randint(1, 512, (lens[r],), generator=g)
        mask[r, :lens[r]] = 1
        loss_mask[r, prompt[r]:lens[r]] = 1
    batch_file = os.path.join(a.out, "batch.json")
    with open(batch_file, "w") as f:
        json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "loss_mask": loss_mask.tolist()}, f)

    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    decay = [p for n, p in model.named_parameters() if "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if "norm" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    logits = model(input_ids=ids.cuda(), attention_mask=mask.cuda()).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids.cuda()[:, 1:, None])[..., 0]
    w = loss_mask.cuda()[:, 1:].float()
    loss = -(logp * w).sum() / w.sum()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

    updated = os.path.join(a.out, "lathe-updated.safetensors")
    res = subprocess.run(["node", NODE_SCRIPT, "--model", path, "--batch", batch_file, "--device", "cuda", "--lr", "1e-3",
                          "--out", updated, "--allow-cpu-fallback"], capture_output=True, text=True, env={**os.environ, "NVIDIA_TF32_OVERRIDE": "0"})
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-4000:])
    info = json.loads(res.stdout.strip().splitlines()[-1])
    lathe = load_file(updated)
    worst = ("", 0.0)
    worst_elem = 0.0
    errors = {}
    for name, p in model.named_parameters():
        d_torch = (p.detach() - before[name]).cpu()
        d_lathe = lathe[name] - before[name].cpu()
        err = ((d_lathe - d_torch).abs().max() / d_torch.abs().max()).item()
        # Norm-wise: AdamW's first update is lr·g/(|g|+eps), so elements with |g| near eps amplify
        # float32 rounding of the gradient; the norm-wise error is the well-conditioned measure.
        norm_err = ((d_lathe - d_torch).norm() / d_torch.norm()).item()
        errors[name] = {"max_elementwise": err, "normwise": norm_err}
        if norm_err > worst[1]:
            worst = (name, norm_err)
        worst_elem = max(worst_elem, err)
    report = {
        "device": torch.cuda.get_device_name(0),
        "loss_torch": loss.item(), "loss_lathe": info["losses"][0],
        "loss_rel_diff": abs(info["losses"][0] - loss.item()) / abs(loss.item()),
        "grad_norm_torch": norm.item(), "grad_norm_lathe": info["grad_norms"][0],
        "params": len(errors), "max_update_rel_error_normwise": worst[1], "worst_param": worst[0],
        "params_over_1e-3_normwise": sum(e["normwise"] > 1e-3 for e in errors.values()),
        "max_update_rel_error_elementwise": worst_elem,
    }
    print(json.dumps(report), flush=True)
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump({"summary": report, "per_param": errors, "lathe": info}, f, indent=2)


if __name__ == "__main__":
    main()

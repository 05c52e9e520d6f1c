#!/usr/bin/env bash
# One RL step at the Qwen3-0.6B shape on the GPU machine: PyTorch + transformers (the reference,
# tools/reference/grpo/grpo_step.py) and Lathe's GrpoTrainer (.bundle/grpo-step.js) in one call,
# Lathe with composed and with flash attention in the scoring and training graphs. The settings are
# those of docs/benchmarks.md ("RL: one GRPO step"): 64 prompts × G 8, prompt 256, 512 new tokens,
# bf16 compute, fp32 master weights and AdamW state. Lines of $OUT/rl-suite.jsonl: each run's
# summary. Needs .bundle/grpo-step.js and the device runtime sourced (/opt/device-rt/env.sh).
#
# usage: bash tools/bench/grpo/rl-suite.sh [variant ...]
#   variants: torch composed4 flash4 flash8 flash16 (default: torch flash4 flash16)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-/tmp}/rl-suite.jsonl"
log="${OUT:-/tmp}/rl-suite.log"
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=(torch flash4 flash16)
common=(--device cuda --compute bfloat16 --shape qwen3-0.6b --prompts 64 --group 8 --prompt-len 256 --new-tokens 512 --prompts-per-run 8)
lathe() { # $1: sequences per micro-batch (2 minibatches of 256 rows, each in 256/$1 micro-batches), the rest: extra flags
  local per=$1; shift
  echo "== grpo-step.js micro-batches of $per $*" | tee -a "$log"
  timeout 420 node .bundle/grpo-step.js "${common[@]}" --steps 2 --micro-batches $((256 / per)) "$@" 2>>"$log" | tail -1 | tee -a "$out" \
    || echo "{\"failed\": \"lathe $per $*\"}" | tee -a "$out"
}
for v in "${variants[@]}"; do
  case $v in
    torch)
      echo "== grpo_step.py" | tee -a "$log"
      timeout 420 python3 tools/reference/grpo/grpo_step.py --shape qwen3-0.6b --prompts 64 --group 8 --prompt-len 256 \
        --new-tokens 512 --steps 1 --gen-chunks 2 --out "${OUT:-/tmp}/grpo-step-torch.json" 2>>"$log" | tail -1 | tee -a "$out" \
        || echo '{"failed": "torch"}' | tee -a "$out" ;;
    composed4) lathe 4 ;;
    flash4) lathe 4 --attention flash ;;
    flash8) lathe 8 --attention flash ;;
    flash16) lathe 16 --attention flash --shared-arena ;;
    *) echo "unknown variant $v" >&2; exit 2 ;;
  esac
done

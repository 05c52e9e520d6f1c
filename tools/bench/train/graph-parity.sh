#!/usr/bin/env bash
# CUDA-graph replay against the plain path, per build, in one call: each variant's train step runs
# STEPS steps plain and with --cuda-graph on the model and batch step_speed.py saved last
# ($MODEL_DIR, default /tmp/lathe-speed), full fine-tuning and LoRA r=16 (q/k/v/o), flash attention, shared arena.
# Prints one JSON line per run: variant, mode, kind, every step's loss, and the median step (run +
# host ms over steps 2…); lines go to $OUT/graph-parity.jsonl too. Variant "new" is
# .bundle/lathe-step.js; any other name V is .bundle/lathe-step-V.js, built from another commit.
# KINDS may also name "frozen": full fine-tuning with the embedding frozen (--freeze embed_tokens).
# ROUNDS repeats every run, to see how far two runs of one build part.
# usage: [VARIANTS="new prev"] [KINDS="lora full frozen"] [STEPS=20] [ROUNDS=1] bash tools/bench/train/graph-parity.sh
set -uo pipefail
d=${MODEL_DIR:-/tmp/lathe-speed}; m=$d/qwen3-0.6b; b=$d/batch.json
out="${OUT:-/tmp}/graph-parity.jsonl"
lora=(--lora-rank 16 --lora-alpha 32 --lora-targets 'q_proj|k_proj|v_proj|o_proj')
for round in $(seq "${ROUNDS:-1}"); do for kind in ${KINDS:-lora full}; do for v in ${VARIANTS:-new prev}; do for mode in plain graph; do
  s=.bundle/lathe-step.js; [ "$v" = new ] || s=.bundle/lathe-step-$v.js
  extra=(); [ "$mode" = graph ] && extra+=(--cuda-graph); [ "$kind" = lora ] && extra+=("${lora[@]}"); [ "$kind" = frozen ] && extra+=(--freeze embed_tokens)
  node $s --model $m --batch $b --device cuda --compute bfloat16 --steps "${STEPS:-20}" --lr 1e-5 --path bound --shared-arena --flash-attention "${extra[@]}" 2>&1 | tail -1 |
    python3 -c "import json,sys,statistics
t=sys.stdin.read()
try:
    r=json.loads(t); ms=[a+h for a,h in zip(r['run_ms'],r['host_ms'])][1:]
    print(json.dumps({'variant':'$v','mode':'$mode','kind':'$kind','step_ms':round(statistics.median(ms),1),'run_ms':round(statistics.median(r['run_ms'][1:]),1),'losses':r['losses']}))
except Exception: print(json.dumps({'variant':'$v','mode':'$mode','kind':'$kind','failed':t[-600:]}))" | tee -a "$out"
done; done; done; done

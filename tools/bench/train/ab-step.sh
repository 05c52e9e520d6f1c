#!/usr/bin/env bash
# A/B of two lathe-step builds in one call, alternating (prev, new, prev, new), on the model and batch
# step_speed.py saved last (/tmp/lathe-speed): full fine-tuning, CUDA graph, best steps 3–5 printed.
# Build the older bundle as .bundle/lathe-step-prev.js first (build-device-bundles.sh on a checkout of
# that commit). usage: [EXTRA="--lora-rank 16 ..."] bash tools/bench/train/ab-step.sh
m=/tmp/lathe-speed/qwen3-0.6b; b=/tmp/lathe-speed/batch.json
for i in 1 2; do for v in prev new; do
  s=.bundle/lathe-step.js; [ $v = prev ] && s=.bundle/lathe-step-prev.js
  node $s --model $m --batch $b --device cuda --compute bfloat16 --steps 5 --lr 1e-5 --path bound --micro-batches 1 --shared-arena --flash-attention --cuda-graph $EXTRA 2>/dev/null | tail -1 | python3 -c "import json,sys; r=json.load(sys.stdin); print('$v', '$EXTRA', 'run', r['run_ms'][2:], 'host', r['host_ms'][2:], 'loss', r['losses'][-1])"
done; done

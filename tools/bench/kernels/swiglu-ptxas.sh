#!/usr/bin/env bash
# Compiles Lathe's SwiGLU source with nvcc (no GPU needed) and prints each kernel's registers, spills
# and stack from ptxas: the check to run after editing packages/kernels/src/swiglu-source.ts.
# usage: bash tools/bench/kernels/swiglu-ptxas.sh [sm_90]   (NVCC=/path/to/nvcc to pick the compiler)
set -euo pipefail
arch="${1:-sm_90}"
nvcc="${NVCC:-$(command -v nvcc || ls -d /usr/local/cuda*/bin/nvcc 2>/dev/null | sort -V | tail -1)}"
[ -x "$nvcc" ] || { echo "swiglu-ptxas: no nvcc found (install the CUDA toolkit or set NVCC)" >&2; exit 2; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$(dirname "$0")/../../.."
npx tsx -e "import('./packages/kernels/src/swiglu-source.ts').then((m) => require('fs').writeFileSync('$dir/swiglu.cu', (m.swigluSource ?? m.default.swigluSource)))"
"$nvcc" -arch="$arch" -std=c++17 --ptxas-options=-v -c "$dir/swiglu.cu" -o "$dir/swiglu.o" 2> "$dir/log" || { cat "$dir/log" >&2; exit 1; }
# one line a kernel: name, registers, spill stores/loads, stack
awk '/Compiling entry function/ { match($0, /function \047[^\047]+\047/); name = substr($0, RSTART + 10, RLENGTH - 11) }
     /bytes stack frame/ { stack = $1; st = $5; ld = $9 }
     /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") regs = $(i + 1); printf "%-24s %3s registers  %3s B spill stores  %3s B spill loads  %3s B stack\n", name, regs, st, ld, stack }' "$dir/log"

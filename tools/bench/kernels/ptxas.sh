#!/usr/bin/env bash
# Compiles one of Lathe's kernel sources with nvcc (no GPU needed) and prints each kernel's registers,
# spills and stack from ptxas: the check to run after editing its packages/kernels/src/<name>-source.ts.
# usage: bash tools/bench/kernels/ptxas.sh flash|decode|ce|rope|swiglu|w4a16|w4a16wg [sm_90]   (NVCC=/path/to/nvcc to pick the compiler)
set -euo pipefail
case "${1:-}" in
  flash) file=flash-attention-source export=flashAttentionSource ;;
  decode) file=decode-attention-source export=decodeAttentionSource ;;
  ce) file=cross-entropy-source export=crossEntropySource ;;
  rope) file=rope-source export=ropeSource ;;
  swiglu) file=swiglu-source export=swigluSource ;;
  w4a16) file=w4a16-source export=w4a16Source ;;
  w4a16wg) file=w4a16-wgmma-source export=w4a16WgSource default_arch=sm_90a ;;
  *) echo "usage: ptxas.sh flash|decode|ce|rope|swiglu|w4a16|w4a16wg [sm_90]" >&2; exit 2 ;;
esac
arch="${2:-${default_arch:-sm_90}}"
nvcc="${NVCC:-$(command -v nvcc || ls -d /usr/local/cuda*/bin/nvcc 2>/dev/null | sort -V | tail -1)}"
[ -x "$nvcc" ] || { echo "ptxas.sh: no nvcc found (install the CUDA toolkit or set NVCC)" >&2; exit 2; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$(dirname "$0")/../../.."
npx tsx -e "import('./packages/kernels/src/$file.ts').then((m) => require('fs').writeFileSync('$dir/k.cu', (m.$export ?? m.default.$export)))"
"$nvcc" -arch="$arch" -std=c++17 --ptxas-options=-v -c "$dir/k.cu" -o "$dir/k.o" 2> "$dir/log" || { cat "$dir/log" >&2; exit 1; }
# one line a kernel: name, registers, spill stores/loads, stack
awk '/Compiling entry function/ { match($0, /function \047[^\047]+\047/); name = substr($0, RSTART + 10, RLENGTH - 11) }
     /bytes stack frame/ { stack = $1; st = $5; ld = $9 }
     /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") regs = $(i + 1); printf "%-28s %3s registers  %3s B spill stores  %3s B spill loads  %3s B stack\n", name, regs, st, ld, stack }' "$dir/log"

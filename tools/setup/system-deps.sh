#!/usr/bin/env bash
# Installs the Debian packages Lathe's tests need (the code sandbox's OS isolation: bubblewrap for
# namespaces, prlimit for resource limits, python3 as a sandboxed language). Idempotent;
# does nothing when everything is already present or when not running as root.
set -euo pipefail
need=()
for bin in bwrap:bubblewrap python3:python3 prlimit:util-linux; do
  command -v "${bin%%:*}" >/dev/null 2>&1 || need+=("${bin##*:}")
done
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "missing system packages: ${need[*]} (install them as root)" >&2; exit 0; fi
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null

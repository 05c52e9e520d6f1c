#!/usr/bin/env bash
# Installs the Debian packages Lathe's tests need: the code sandbox's OS isolation (bubblewrap for
# namespaces, prlimit from util-linux for resource limits) and python3 as a sandboxed language, at
# the absolute paths the sandbox runs them from (packages/graders/src/code/sandbox.ts), and
# Chromium, in which the studio's pages are tested (apps/studio/test/browser.slow.test.ts). Idempotent:
# does nothing when everything is present. As root with apt-get it installs what is missing;
# otherwise, or with --check, it exits 1 with the one command that fixes it.
# usage: bash tools/setup/system-deps.sh [--check]
set -euo pipefail
need=()
for entry in /usr/bin/bwrap:bubblewrap /usr/bin/prlimit:util-linux /usr/bin/python3:python3 /usr/bin/chromium:chromium; do
  [ -x "${entry%%:*}" ] || need+=("${entry##*:}")
done
[ ${#need[@]} -eq 0 ] && exit 0
fix="apt-get install -y ${need[*]}"
if [ "${1:-}" != --check ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: installing ${need[*]} for the code sandbox and the studio's browser tests (apt-get)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  exec bash "$0" --check
fi
[ "$(id -u)" = 0 ] || fix="sudo $fix"
echo "missing system packages for the code sandbox and the studio's browser tests: ${need[*]} — install them with: $fix (or run: sudo bash tools/setup/system-deps.sh)" >&2
exit 1

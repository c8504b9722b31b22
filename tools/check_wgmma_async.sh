#!/usr/bin/env bash
# Fails when ptxas serializes the wgmma of a Hopper kernel (its info C7514, "wgmma.mma_async instructions are
# serialized"). ptxas does that, silently and for the whole function, when it cannot prove that no other
# instruction reads or writes an accumulator before the wait that retires it: the kernel still computes the
# right result, only without the overlap it was written for (attention_flash_fwd_sm90.cu's header says how
# that went unseen for a day). Recompiles each CUDA source that issues wgmma with the build's own command
# (compile_commands.json) plus -Xptxas -v, output thrown away.
#   tools/check_wgmma_async.sh [build-dir]      (default build/cuda-release, configured)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/cuda-release}
db="$build/compile_commands.json"
[ -f "$db" ] || { echo "check_wgmma_async: no $db (configure $build first)" >&2; exit 1; }
obj=$(mktemp --suffix=.o)
trap 'rm -f "$obj"' EXIT
status=0
for source in $(grep -l "wgmma\.mma_async\|wgmma_ss\|wgmma_rs" src/backend/cuda/*.cu); do
  command=$(grep -o "\"command\": \"[^\"]* -c $PWD/$source [^\"]*\"" "$db" | sed 's/^"command": "//; s/"$//' || true)
  [ -n "$command" ] || { echo "check_wgmma_async: $source is not in $db" >&2; exit 1; }
  # The build's command, writing into a scratch object instead of the build's.
  command=$(sed "s| -o [^ ]*| -o $obj|" <<< "$command")
  log=$(cd "$build" && eval "$command -Xptxas -v" 2>&1) || { echo "$log" >&2; exit 1; }
  if grep -q "C7514" <<< "$log"; then
    echo "check_wgmma_async: ptxas serializes wgmma in $source:" >&2
    grep "C7514" <<< "$log" >&2
    status=1
  else
    echo "check_wgmma_async: $source: wgmma asynchronous ($(grep -c "Compiling entry" <<< "$log") kernels)"
  fi
done
exit $status

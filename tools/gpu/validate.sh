#!/usr/bin/env bash
# One device call that checks a change end to end when GPU time is short: the CUDA cases of the test suites staged
# in .device/bin (VALIDATE_FILTER narrows ops_tests), the serving load (run.sh infer-serve: 64 streaming clients,
# then a third of them leaving requests half-way), and the whole-build A/B of microllm bench (tools/gpu/ab.sh
# bench) against the builds in .device/ab/. Each part writes its results under $OUT as it ends.
#   device run, carry [".device"]: bash tools/gpu/validate.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/logs"
export LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
start=$SECONDS
for suite in .device/bin/*_tests; do
  name=$(basename "$suite")
  filter='*cuda*:*Cuda*'
  [ "$name" = ops_tests ] && filter=${VALIDATE_FILTER:-$filter}
  timeout "${VALIDATE_SUITE_SECONDS:-240}" "$suite" --gtest_filter="$filter" --gtest_brief=1 > "$OUT/logs/$name.log" 2>&1
  echo "== $name (cuda): exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/logs/$name.log" | tr '\n' ' ') ($((SECONDS - start)) s)"
  grep -E '^\[  FAILED  \]' "$OUT/logs/$name.log" | head -20
done | tee "$OUT/tests.md"
OUT="$OUT/serve" bash tools/gpu/run.sh infer-serve 2>&1 | tail -60 | tee "$OUT/serve.md"
echo "== serve done ($((SECONDS - start)) s)"
bash tools/gpu/ab.sh bench > /dev/null 2>&1
cat "$OUT/ab.md"
echo "== all done ($((SECONDS - start)) s)"

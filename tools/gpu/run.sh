#!/usr/bin/env bash
# The one script for the GPU machine (device tool): CUDA tests, compute-sanitizer, benchmarks against
# PyTorch, writing logs and tables under $OUT. Run tools/gpu/stage.sh here first, then:
#   device run, carry [".device"], command: bash tools/gpu/run.sh [tests|sanitize|bench|all]...
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
bin=.device/bin
steps=${*:-all}
has() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

if has tests; then
  for suite in "$bin"/*_tests; do
    name=$(basename "$suite")
    timeout 300 "$suite" --gtest_filter='*cuda*:*Cuda*' --gtest_brief=1 > "$OUT/$name.cuda.log" 2>&1 || status=1
    echo "== $name (cuda): $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.cuda.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$OUT/$name.cuda.log" | head -20
  done
fi

if has sanitize; then
  for tool in memcheck racecheck; do
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/ops_tests" \
      --gtest_filter='Dtypes/CudaParityTest.*/cuda_bf16:Dtypes/CudaParityTest.*/cuda_f32' --gtest_brief=1 \
      > "$OUT/sanitizer_$tool.log" 2>&1
    echo "== compute-sanitizer $tool: exit $? ($(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$OUT/sanitizer_$tool.log") clean summaries)"
    grep -E 'SUMMARY' "$OUT/sanitizer_$tool.log" | head -3
  done
fi

if has bench; then
  timeout 400 python3 benchmarks/cuda_vs_torch.py --bench "$bin/cuda_ops_bench" --reps 20 --out "$OUT/cuda_ops.md" \
    > "$OUT/bench.log" 2>&1 || status=1
  tail -60 "$OUT/bench.log"
fi
exit $status

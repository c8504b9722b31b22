#!/usr/bin/env bash
# The one script for the GPU machine (device tool): CUDA tests, compute-sanitizer, benchmarks against
# PyTorch in the same run, and the oracles (golden files from PyTorch / transformers / tokenizers).
# Everything lands in $OUT/results.tgz (the device tool returns at most 8 files) and a summary prints.
# Prepare here with tools/gpu/stage.sh, then:
#   device run, carry [".device"], command: bash tools/gpu/run.sh [tests] [sanitize] [bench] [oracle] | all
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
RES=$(mktemp -d)
mkdir -p "$OUT" "$RES/logs" "$RES/fixtures"
bin=.device/bin
steps=${*:-all}
has() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }
finish() { tar czf "$OUT/results.tgz" -C "$RES" . ; }
trap finish EXIT

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$RES/logs/gpu.txt" 2>&1
cat "$RES/logs/gpu.txt"

if has oracle; then
  if [ -f .device/tokenizers.tar.xz ]; then mkdir -p data && tar xJf .device/tokenizers.tar.xz -C data; fi
  timeout 300 python3 tools/oracle/tokenizer_golden.py > "$RES/logs/oracle_tokenizer.log" 2>&1
  echo "== oracle tokenizer: exit $?"; tail -3 "$RES/logs/oracle_tokenizer.log"
  timeout 200 python3 tools/oracle/train_golden.py > "$RES/logs/oracle_train.log" 2>&1
  echo "== oracle train: exit $?"; tail -3 "$RES/logs/oracle_train.log"
  for extra in tools/oracle/*.py; do
    case "$extra" in *tokenizer_golden.py|*train_golden.py) continue ;; esac
    timeout 300 python3 "$extra" > "$RES/logs/oracle_$(basename "$extra" .py).log" 2>&1
    echo "== oracle $(basename "$extra"): exit $?"
  done
  cp -r tests/fixtures/. "$RES/fixtures/"
fi

if has tests; then
  for suite in "$bin"/*_tests; do
    name=$(basename "$suite")
    timeout 400 "$suite" --gtest_filter='*cuda*:*Cuda*' --gtest_brief=1 > "$RES/logs/$name.cuda.log" 2>&1
    echo "== $name (cuda): exit $? $(grep -E '^\[  (PASSED|FAILED)' "$RES/logs/$name.cuda.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$RES/logs/$name.cuda.log" | head -30
  done
fi

if has sanitize; then
  for tool in memcheck racecheck; do
    timeout 400 compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/ops_tests" \
      --gtest_filter='Dtypes/CudaParityTest.*/cuda_bf16:Dtypes/CudaParityTest.*/cuda_f32:-*AttentionEdgeCases*' --gtest_brief=1 \
      > "$RES/logs/sanitizer_$tool.log" 2>&1
    echo "== compute-sanitizer $tool: exit $?"
    grep -E 'SUMMARY|PASSED|FAILED' "$RES/logs/sanitizer_$tool.log" | head -5
  done
fi

if has bench; then
  timeout 500 python3 benchmarks/cuda_vs_torch.py --bench "$bin/cuda_ops_bench" --reps 20 --out "$RES/cuda_ops.md" \
    > "$RES/logs/bench.log" 2>&1
  echo "== bench: exit $?"
  grep -E '^\|' "$RES/cuda_ops.md" 2>/dev/null || tail -20 "$RES/logs/bench.log"
fi

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

# Training on the GPU (issue 4): prepare the corpora, then one of:
#   train-throughput: benchmarks/train_vs_torch.py (Qwen2.5-0.5B config, B8 T1024, bf16 mixed) vs PyTorch
#   train-kjv / train-austen: model-s for TRAIN_SECONDS (default 270) on one corpus, curve and checkpoint
if has train-throughput || has train-kjv || has train-austen; then
  mkdir -p data && tar xJf .device/corpora.tar.xz -C data
  for corpus in kjv austen; do
    "$bin/microllm" prepare --input "data/corpora/$corpus.txt" --output "/tmp/$corpus" > "$RES/logs/prepare_$corpus.log" 2>&1
  done
fi
if has train-throughput; then
  timeout 500 python3 benchmarks/train_vs_torch.py --microllm "$bin/microllm" \
    --config tests/fixtures/configs/qwen2.5-0.5b.json --data /tmp/kjv --out "$RES/train_throughput.md" \
    > "$RES/logs/train_throughput.log" 2>&1
  echo "== train throughput: exit $?"; cat "$RES/train_throughput.md" 2>/dev/null || tail -30 "$RES/logs/train_throughput.log"
fi
for corpus in kjv austen; do
  if has "train-$corpus"; then
    timeout 560 "$bin/microllm" train --preset model-s --data "/tmp/$corpus" --device cuda --precision bf16-mixed \
      --batch-size 64 --seq-len 512 --steps 20000 --lr 2e-3 --warmup 200 --eval-interval 250 \
      --set max_seconds="${TRAIN_SECONDS:-270}" --set eval_batches=32 --set log_interval=50 \
      --out "$RES/model_s_$corpus" --set checkpoint_dir="/tmp/ckpt_$corpus" > "$RES/logs/train_$corpus.log" 2>&1
    echo "== model-s on $corpus: exit $?"; tail -4 "$RES/logs/train_$corpus.log"
  fi
done

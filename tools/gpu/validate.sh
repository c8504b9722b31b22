#!/usr/bin/env bash
# One device call that checks a change end to end when GPU time is short. Steps, in the order given (default: all
# but align), each writing its results under $OUT as it ends:
#   align     tools/oracle/align_reference.py --fixtures: transformers' values and gradients at every tap point of
#             the fixture models (tests/fixtures/align/, copied to $OUT/align/ to commit), before the tests read them
#   tests     the CUDA cases of the suites staged in .device/bin (VALIDATE_FILTER narrows ops_tests;
#             VALIDATE_SUITE_SECONDS bounds each suite)
#   serve     run.sh infer-serve: 64 streaming clients, then a third of them leaving requests half-way; with
#             SERVE_TRACE=1 the first server also writes a trace of its first SERVE_TRACE_SECONDS (30)
#   trace     a trace of Qwen2.5-0.5B-config training steps (B8 x T1024, bf16-mixed) and of a B1 decode bench,
#             each summarized by `microllm trace summarize`
#   goldens   tools/oracle/model_golden.py for GOLDEN_NAMES (default: the windowed and Phi-3 cases), the folders
#             in $OUT/models.tar.gz to commit under tests/fixtures/models/ (HfGoldenTest skips them until then)
#   explain   `microllm bench --explain` on the Qwen2.5-0.5B config: each decode batch's and context's kernels
#   python    the Python extension built there (tools/gpu/python_ext.sh) and pytest python/tests: the torch
#             operators (test_torch_ops.py) and DLPack with torch on CUDA run only there
#   python-bench  benchmarks/python_bench.py: Model.generate from Python against `microllm generate`, and a
#             transformers Qwen2 training step with microllm.torch's ops against sdpa (after the python step)
#   ab        tools/gpu/ab.sh bench (AB_RUNS, AB_PASSES) against the builds in .device/ab/
#   ab-train  tools/gpu/ab.sh train (AB_TRAIN_STEPS)
#   device run, carry [".device"]: [VALIDATE_PACK=1] bash tools/gpu/validate.sh [STEP...]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/logs"
export LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1 MICROLLM_BIN="$PWD/.device/bin/microllm"
bin=.device/bin
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
# The test programs look for fixtures where they were built (MICROLLM_SOURCE_DIR): point that path here.
source_dir=${VALIDATE_SOURCE_DIR:-/work/main}
if [ ! -e "$source_dir" ]; then mkdir -p "$(dirname "$source_dir")" && ln -s "$PWD" "$source_dir"; fi
start=$SECONDS
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests serve ab)

step_align() {
  timeout 120 python3 tools/oracle/align_reference.py --fixtures > "$OUT/logs/align_reference.log" 2>&1
  echo "== align_reference.py --fixtures: exit $?"
  tail -5 "$OUT/logs/align_reference.log"
  mkdir -p "$OUT/align" && cp tests/fixtures/align/*.safetensors "$OUT/align/" 2>/dev/null
}

step_tests() {
  for suite in "$bin"/*_tests; do
    name=$(basename "$suite")
    filter='*cuda*:*Cuda*'
    [ "$name" = ops_tests ] && filter=${VALIDATE_FILTER:-$filter}
    timeout "${VALIDATE_SUITE_SECONDS:-240}" "$suite" --gtest_filter="$filter" --gtest_brief=1 > "$OUT/logs/$name.log" 2>&1
    echo "== $name (cuda): exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/logs/$name.log" | tr '\n' ' ') ($((SECONDS - start)) s)"
    grep -E '^\[  FAILED  \]' "$OUT/logs/$name.log" | head -20
  done | tee "$OUT/tests.md"
}

step_goldens() {
  local names=(${GOLDEN_NAMES:-mistral_window qwen2_window phi3}) args=()
  for n in "${names[@]}"; do args+=(--name "$n"); done
  timeout 300 python3 tools/oracle/model_golden.py "${args[@]}" > "$OUT/logs/model_golden.log" 2>&1
  echo "== model_golden.py ${names[*]}: exit $?"
  grep -E "^[a-z0-9_]+:$|parameters,|warning|FAILED|failed|Error" "$OUT/logs/model_golden.log" | head -60
  tar czf "$OUT/models.tar.gz" -C tests/fixtures/models "${names[@]}"  # one file: $OUT returns few
  # The new goldens, read at once by the C++ side on the CPU and the GPU.
  timeout 300 "$bin/models_tests" --gtest_filter='*HfGolden*' --gtest_brief=1 > "$OUT/logs/hf_golden.log" 2>&1
  echo "== models_tests HfGolden*: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/logs/hf_golden.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/logs/hf_golden.log" | head -40
}

step_python() {
  bash tools/gpu/python_ext.sh /tmp/pyext > "$OUT/logs/python_ext.log" 2>&1
  echo "== python_ext.sh: exit $?"
  tail -3 "$OUT/logs/python_ext.log"
  PYTHONPATH=/tmp/pyext MICROLLM_SOURCE_DIR="$PWD" MICROLLM_BIN="$PWD/$bin/microllm" timeout 400 \
    python3 -m pytest -q -p no:cacheprovider -rs python/tests > "$OUT/logs/pytest.log" 2>&1
  echo "== pytest python/tests: exit $?"
  grep -E "passed|failed|FAILED|SKIPPED|Error" "$OUT/logs/pytest.log" | tail -40
}

step_python_bench() {
  ls /tmp/pyext/microllm/_microllm*.so > /dev/null 2>&1 || bash tools/gpu/python_ext.sh /tmp/pyext > "$OUT/logs/python_ext.log" 2>&1
  mkdir -p /tmp/tok && tar xJf .device/tokenizers.tar.xz -C /tmp/tok
  PYTHONPATH=/tmp/pyext timeout 300 python3 benchmarks/python_bench.py --microllm "$bin/microllm" \
    --config tests/fixtures/configs/qwen2.5-0.5b.json --tokenizer /tmp/tok/tokenizers/qwen3 \
    --out "$OUT/python_bench.md" > "$OUT/logs/python_bench.log" 2>&1
  echo "== python_bench.py: exit $?"
  cat "$OUT/python_bench.md" 2>/dev/null || tail -20 "$OUT/logs/python_bench.log"
}

step_explain() {
  timeout 180 "$bin/microllm" bench --config tests/fixtures/configs/qwen2.5-0.5b.json --device cuda --dtype bf16 \
    -p 0 -n 32 -b 1,2,8 -r 1 --workload 4000:1:32,4000:2:32 --explain > "$OUT/explain.md" 2>&1
  echo "== bench --explain: exit $?"
  cat "$OUT/explain.md"
}

step_serve() {
  OUT="$OUT/serve" bash tools/gpu/run.sh infer-serve 2>&1 | tail -60 | tee "$OUT/serve.md"
}

step_trace() {
  python3 -c "import random; random.seed(0); open('/tmp/trace_corpus.txt','w').write(''.join(chr(random.randrange(32, 127)) for _ in range(2_000_000)))"
  "$bin/microllm" prepare --input /tmp/trace_corpus.txt --output /tmp/trace_tokens > "$OUT/logs/trace_prepare.log" 2>&1
  timeout 150 "$bin/microllm" train --preset tests/fixtures/configs/qwen2.5-0.5b.json --data /tmp/trace_tokens \
    --device cuda --precision bf16-mixed --batch-size 8 --seq-len 1024 --steps "${TRACE_TRAIN_STEPS:-4}" --warmup 1 \
    --lr 3e-4 --eval-interval 0 --out /tmp/trace_train --set log_interval=1 --set eval_batches=1 --overwrite \
    --trace "$OUT/train.trace.json" > "$OUT/logs/trace_train.log" 2>&1
  echo "== train --trace: exit $?"
  "$bin/microllm" trace summarize "$OUT/train.trace.json" --rows 15 > "$OUT/train_trace_summary.md" 2>&1
  cat "$OUT/train_trace_summary.md"
  timeout 120 "$bin/microllm" bench --config tests/fixtures/configs/qwen2.5-0.5b.json --device cuda --dtype bf16 \
    -p 512 -n 32 -b 1 -r 1 --workload none --trace "$OUT/bench.trace.json" > "$OUT/logs/trace_bench.log" 2>&1
  echo "== bench --trace: exit $?"
  "$bin/microllm" trace summarize "$OUT/bench.trace.json" --rows 15 > "$OUT/bench_trace_summary.md" 2>&1
  cat "$OUT/bench_trace_summary.md"
  xz -T0 -6 "$OUT"/*.trace.json 2>/dev/null
}

for step in "${steps[@]}"; do
  case $step in
    align) step_align ;;
    tests) step_tests ;;
    serve) step_serve ;;
    goldens) step_goldens ;;
    explain) step_explain ;;
    python) step_python ;;
    python-bench) step_python_bench ;;
    trace) step_trace ;;
    ab) bash tools/gpu/ab.sh bench > /dev/null 2>&1; cat "$OUT/ab.md" ;;
    ab-train) OUT="$OUT/ab-train" bash tools/gpu/ab.sh train > /dev/null 2>&1; cat "$OUT/ab-train/ab.md" ;;
    *) echo "unknown step $step" ;;
  esac
  echo "== $step done ($((SECONDS - start)) s)"
done
# VALIDATE_PACK=1: everything under $OUT as one archive (the device tool returns a few files only).
if [ "${VALIDATE_PACK:-0}" = 1 ]; then
  tar czf /tmp/validate-out.tar.gz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/validate-out.tar.gz "$OUT/"
fi

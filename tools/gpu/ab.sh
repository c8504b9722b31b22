#!/usr/bin/env bash
# Whole-build A/B on the GPU machine: the staged build (.device/lib and .device/bin/microllm, tools/gpu/stage.sh)
# against each build staged by tools/gpu/stage_ab.sh (.device/ab/NAME.tar.xz: its libraries and its microllm),
# alternated pass by pass in one call, so that every build sees the same card, clocks and temperature:
#   bench   microllm bench rows (AB_RUNS: "config|flags;...", default Qwen2.5-0.5B tg128 at B1, B8, B32 and the
#           2048:2:64 workload; R1-Distill-1.5B tg128 B1 and pp2048), AB_PASSES (2) passes of -r 3
#   train   microllm train's tokens/s on the Qwen2.5-0.5B config, B8 x T1024, bf16-mixed, random byte tokens
#           (AB_TRAIN_STEPS, 20; the mean of the logged steps after the first)
# Usage (device run, carry [".device"]): bash tools/gpu/ab.sh bench train. Results in $OUT/ab.md and $OUT/logs/.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/logs"
builds=(staged)
declare -A libs bins
libs[staged]="$PWD/.device/lib"
bins[staged]="$PWD/.device/bin/microllm"
for archive in .device/ab/*.tar.xz; do
  [ -f "$archive" ] || continue
  name=$(basename "$archive" .tar.xz)
  mkdir -p /tmp/ab && tar xJf "$archive" -C /tmp/ab
  builds+=("$name")
  libs[$name]="/tmp/ab/$name/lib"
  bins[$name]="/tmp/ab/$name/microllm"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/logs/gpu.txt"
for b in "${builds[@]}"; do echo "build $b: $(cat "/tmp/ab/$b/COMMIT" 2>/dev/null || git rev-parse --short HEAD)"; done

run_in() {  # BUILD COMMAND...: the command with that build's libraries and microllm
  local build=$1
  shift
  LD_LIBRARY_PATH="${libs[$build]}:${LD_LIBRARY_PATH:-}" MICROLLM="${bins[$build]}" "$@"
}

bench() {
  local pass run config args build
  IFS=';' read -r -a runs <<< "${AB_RUNS:-qwen2.5-0.5b|-p 0 -n 128 -b 1,8,32 --workload 2048:2:64;deepseek-r1-distill-qwen-1.5b|-p 2048 -n 128 -b 1 --workload none}"
  for pass in $(seq "${AB_PASSES:-2}"); do
    for build in "${builds[@]}"; do
      for run in "${runs[@]}"; do
        config=${run%%|*} args=${run#*|}
        echo "== pass $pass, $build, $config $args"
        # shellcheck disable=SC2086  # args: words for microllm bench
        run_in "$build" sh -c "timeout 300 \"\$MICROLLM\" bench --config tests/fixtures/configs/$config.json \
          --device cuda --dtype bf16 -r 3 $args --json $OUT/logs/bench_${pass}_${build}_${config}.json" \
          > "$OUT/logs/bench_${pass}_${build}_${config}.log" 2>&1
        grep -E "\| (tg|pp)[0-9]" "$OUT/logs/bench_${pass}_${build}_${config}.log"
      done
    done
  done
}

train() {
  local pass build
  python3 -c "import random; random.seed(0); open('/tmp/ab_corpus.txt','w').write(''.join(chr(random.randrange(32, 127)) for _ in range(4_000_000)))"
  run_in staged sh -c '"$MICROLLM" prepare --input /tmp/ab_corpus.txt --output /tmp/ab_tokens' > "$OUT/logs/ab_prepare.log" 2>&1
  for pass in $(seq "${AB_PASSES:-2}"); do
    for build in "${builds[@]}"; do
      rm -rf /tmp/ab_train
      run_in "$build" sh -c "timeout 300 \"\$MICROLLM\" train --preset tests/fixtures/configs/qwen2.5-0.5b.json \
        --data /tmp/ab_tokens --device cuda --precision bf16-mixed --batch-size 8 --seq-len 1024 \
        --steps ${AB_TRAIN_STEPS:-20} --warmup 5 --lr 3e-4 --eval-interval 0 --out /tmp/ab_train \
        --set log_interval=1 --set eval_batches=1 --overwrite" > "$OUT/logs/train_${pass}_${build}.log" 2>&1
      python3 - "$pass" "$build" <<'PY'
import json, sys
steps = [json.loads(l) for l in open("/tmp/ab_train/metrics.jsonl") if '"tokens_per_second"' in l]
steady = [s["tokens_per_second"] for s in steps[1:]]
print(f"== pass {sys.argv[1]}, {sys.argv[2]}, train tokens/s {sum(steady) / max(len(steady), 1):,.0f} "
      f"(mean of {len(steady)} steps)")
PY
    done
  done
}

for step in "$@"; do
  case $step in
    bench) bench ;;
    train) train ;;
    *) echo "unknown step $step" ;;
  esac
done 2>&1 | tee "$OUT/ab.md"

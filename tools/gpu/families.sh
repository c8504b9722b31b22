#!/usr/bin/env bash
# The newer families on the GPU machine, in one call: tools/oracle/parity_full.py over the Gemma 3 configs (random
# weights at full size, f32 and bf16 against transformers), then decode speed beside Qwen2.5-0.5B and SmolLM2-135M
# (microllm bench, same call, bf16, tg128 at B1 and B8) and `bench --explain` of Gemma 3 270M at a 2,048-token
# context (its sliding layers' kernels). Results in $OUT/families.md; logs in $OUT/logs/.
#   device run, carry [".device"]: bash tools/gpu/families.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/logs" /tmp/family_configs
export LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}"
bin=.device/bin
cp tests/fixtures/configs/gemma-3-*.json /tmp/family_configs/
{
  echo "# Newer families on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F)"
  echo
  echo "## parity_full.py (gemma-3-270m, gemma-3-1b)"
  timeout 300 python3 tools/oracle/parity_full.py --microllm "$bin/microllm" --configs /tmp/family_configs \
    --out "$OUT/parity_families.md" > "$OUT/logs/parity_families.log" 2>&1
  echo "exit $?"
  cat "$OUT/parity_families.md" 2>/dev/null || tail -20 "$OUT/logs/parity_families.log"
  echo
  echo "## decode speed, bf16, tg128 (microllm bench -r 3)"
  for config in gemma-3-270m qwen2.5-0.5b smollm2-135m; do
    timeout 120 "$bin/microllm" bench --config "tests/fixtures/configs/$config.json" --device cuda --dtype bf16 \
      -p 0 -n 128 -b 1,8 -r 3 --workload none > "$OUT/logs/bench_$config.log" 2>&1
    grep -E "^\| $config" "$OUT/logs/bench_$config.log"
  done
  echo
  echo "## bench --explain, gemma-3-270m, a 2,048-token prompt then 32 tokens"
  timeout 120 "$bin/microllm" bench --config tests/fixtures/configs/gemma-3-270m.json --device cuda --dtype bf16 \
    -p 0 -n 32 -b 1 -r 1 --workload 2048:1:32 --explain 2>&1 | sed -n '/^| model/,$p'
} | tee "$OUT/families.md"

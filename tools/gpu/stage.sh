#!/usr/bin/env bash
# Stages what the GPU machine needs into .device/ (git-ignored), for the device tool's `carry`:
# the cuda-release libraries and programs built here (the GPU machine's image runs them), so the GPU's
# time goes to tests and benchmarks, not to compiling.
#   tools/gpu/stage.sh [build-dir]      (default build/cuda-release)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/cuda-release}
rm -rf .device
mkdir -p .device/lib .device/bin
cp -a "$build"/src/libmicrollm_*.so* .device/lib/
for program in tests/core_tests tests/ops_tests benchmarks/cuda_ops_bench benchmarks/allreduce_bench \
               benchmarks/persistent_mlp_bench benchmarks/cublaslt_algos_bench apps/microllm; do
  [ -f "$build/$program" ] && cp "$build/$program" .device/bin/
done
for program in "$build"/tests/*_tests; do cp "$program" .device/bin/; done
# Libraries the GPU machine's image lacks (its Ubuntu has no utf8proc, no cpp-httplib).
cp -L /usr/lib/x86_64-linux-gnu/libutf8proc.so.2 /usr/lib/x86_64-linux-gnu/libcpp-httplib.so.0.11 .device/lib/
# gperftools' CPU profiler for run.sh host-profile, where this machine has it (apt-get install libgoogle-perftools4).
if [ -f /usr/lib/x86_64-linux-gnu/libprofiler.so.0 ]; then
  mkdir -p .device/gperf
  cp -L /usr/lib/x86_64-linux-gnu/libprofiler.so.0 /usr/lib/x86_64-linux-gnu/libunwind.so.8 .device/gperf/
fi
strip --strip-debug .device/bin/* .device/lib/*.so.* 2>/dev/null || true
# Headers the GPU machine lacks for tools/gpu/python_ext.sh (the Python extension built there).
mkdir -p .device/include && cp -r /usr/include/nlohmann /usr/include/dlpack .device/include/
du -sh .device
# The tokenizer files for the oracles, compressed (they are 30 MB as JSON).
if [ -d data/tokenizers ]; then tar cJf .device/tokenizers.tar.xz -C data tokenizers; fi
du -sh .device
# The training corpora (scripts/fetch-corpora.sh), compressed.
if [ -d data/corpora ]; then tar cJf .device/corpora.tar.xz -C data corpora; fi
du -sh .device

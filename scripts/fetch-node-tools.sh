#!/usr/bin/env bash
# Installs the Node.js packages some tests use as outside oracles into data/node/ (git-ignored), pinned:
#   openai             the official OpenAI SDK: tests/serve/openai_sdk_client.mjs speaks to `microllm serve` through it
#   @huggingface/jinja  transformers.js's Jinja: tools/oracle/chat_template_golden.mjs cross-checks the chat
#                       template goldens with it
# Tests that need them skip, saying so, when they are absent. Safe to run again.
# Usage: scripts/fetch-node-tools.sh [destination]   (default: data/node)
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-data/node}"
command -v npm >/dev/null || { echo "fetch-node-tools: npm is needed (apt-get install npm)" >&2; exit 1; }
packages=(openai@7.60.0 @huggingface/jinja@0.5.13)
mkdir -p "$dest"
for package in "${packages[@]}"; do
  name=${package%@*}
  if [ "$(node -p "try { require('$PWD/$dest/node_modules/$name/package.json').version } catch { '' }" 2>/dev/null)" = "${package##*@}" ]; then
    echo "fetch-node-tools: $package is there"
    continue
  fi
  echo "fetch-node-tools: $package -> $dest/node_modules/$name"
  npm install --silent --no-audit --no-fund --save-exact --prefix "$dest" "$package" >/dev/null
done

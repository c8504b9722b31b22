#!/usr/bin/env bash
# Drives `microllm serve` over loopback with real clients: curl (MODE curl) or a Python client speaking the
# OpenAI wire format with the standard library only (MODE python: tests/serve/openai_client.py). Starts the
# server on a free port, runs the checks, stops it with SIGTERM. Exit 77 when the client program is missing
# (the calling test skips). Run by serve_clients_test.cpp over a tiny model directory; by hand:
#   tests/serve/serve_clients.sh build/apps/microllm /path/to/model-dir curl
# MODE openai-sdk drives it with the official OpenAI SDK for Node.js (tests/serve/openai_sdk_client.cjs, from
# $MICROLLM_NODE_DIR, default data/node: scripts/fetch-node-tools.sh), and ends by sending SIGTERM mid-stream:
# the SDK must raise the server's shutdown as an APIError.
set -uo pipefail

bin=${1:?usage: serve_clients.sh MICROLLM MODEL_DIR curl|python|openai-sdk}
model=${2:?usage: serve_clients.sh MICROLLM MODEL_DIR curl|python|openai-sdk}
mode=${3:?usage: serve_clients.sh MICROLLM MODEL_DIR curl|python|openai-sdk}
here=$(cd "$(dirname "$0")" && pwd)

node_dir=${MICROLLM_NODE_DIR:-$here/../../data/node}
case $mode in
  curl) command -v curl >/dev/null || { echo "curl is not installed: skipped"; exit 77; } ;;
  python) command -v python3 >/dev/null || { echo "python3 is not installed: skipped"; exit 77; } ;;
  openai-sdk)
    command -v node >/dev/null || { echo "node is not installed: skipped"; exit 77; }
    [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ] ||
      { echo "node $(node --version) is older than the SDK's 20: skipped"; exit 77; }
    [ -d "$node_dir/node_modules/openai" ] ||
      { echo "no OpenAI SDK in $node_dir (scripts/fetch-node-tools.sh): skipped"; exit 77; } ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac

out=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    wait "$server_pid"
  fi
  rm -rf "$out"
}
trap cleanup EXIT

"$bin" serve --model "$model" --model-name tiny --port 0 --max-body-bytes 65536 --threads 1 2>"$out/server.log" &
server_pid=$!
port=""
for _ in $(seq 1 200); do
  port=$(sed -n 's|.*http://127\.0\.0\.1:\([0-9][0-9]*\).*|\1|p' "$out/server.log" | head -n 1)
  [ -n "$port" ] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.05
done
if [ -z "$port" ]; then
  echo "FAIL: the server did not start"; cat "$out/server.log"; exit 1
fi
base="http://127.0.0.1:$port"
echo "server on $base"

failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

if [ "$mode" = python ]; then
  python3 "$here/openai_client.py" "$base" || failures=$((failures + 1))
elif [ "$mode" = openai-sdk ]; then
  node "$here/openai_sdk_client.cjs" "$base" "$node_dir" "$out/streaming" &
  client_pid=$!
  for _ in $(seq 1 600); do [ -f "$out/streaming" ] || ! kill -0 "$client_pid" 2>/dev/null && break; sleep 0.05; done
  if [ -f "$out/streaming" ]; then
    kill -TERM "$server_pid"
    wait "$server_pid" || fail "the server did not exit cleanly on SIGTERM"
    server_pid=""
    echo "ok   SIGTERM sent mid-stream"
  fi
  wait "$client_pid" || failures=$((failures + 1))
else
  # check NAME EXPECTED_STATUS EXPECTED_TEXT CURL_ARGS...: the status and a fragment of the body.
  check() {
    local name=$1 status=$2 expected=$3
    shift 3
    local got
    got=$(curl -sS -o "$out/$name.body" -w '%{http_code}' "$@")
    if [ "$got" != "$status" ]; then fail "$name: status $got, expected $status: $(head -c 300 "$out/$name.body")"; return; fi
    if ! grep -qF -- "$expected" "$out/$name.body"; then fail "$name: the body lacks '$expected': $(head -c 300 "$out/$name.body")"; return; fi
    echo "ok   $name: $(head -c 200 "$out/$name.body" | tr '\n' ' ')"
  }
  json=(-H 'Content-Type: application/json')
  check health 200 '"ok"' "$base/health"
  check models 200 '"id":"tiny"' "$base/v1/models"
  check completion 200 '"object":"text_completion"' "${json[@]}" \
    -d '{"model": "tiny", "prompt": "Once upon", "max_tokens": 8, "temperature": 0}' "$base/v1/completions"
  grep -qF '"total_tokens"' "$out/completion.body" || fail "completion: no usage"
  check chat 200 '"role":"assistant"' "${json[@]}" \
    -d '{"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 8, "temperature": 0.7, "seed": 3}' \
    "$base/v1/chat/completions"
  check stream 200 'data: [DONE]' -N "${json[@]}" \
    -d '{"prompt": "abc", "max_tokens": 6, "stream": true, "stream_options": {"include_usage": true}, "temperature": 0}' \
    "$base/v1/completions"
  grep -q '^data: {' "$out/stream.body" || fail "stream: no data chunks"
  grep -qF '"finish_reason":"' "$out/stream.body" || fail "stream: no finish_reason"
  grep -qF '"choices":[],' "$out/stream.body" || fail "stream: no usage chunk"
  check chat-stream 200 'chat.completion.chunk' -N "${json[@]}" \
    -d '{"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 6, "stream": true}' "$base/v1/chat/completions"
  tail -n 2 "$out/chat-stream.body" | grep -qF 'data: [DONE]' || fail "chat-stream: [DONE] is not last"
  check bad-json 400 '"type":"invalid_request_error"' "${json[@]}" -d '{"prompt": ' "$base/v1/completions"
  check bad-type 400 '"param":"max_tokens"' "${json[@]}" -d '{"prompt": "x", "max_tokens": "ten"}' "$base/v1/completions"
  head -c 100000 /dev/zero | tr '\0' ' ' >"$out/big"
  check too-large 413 '"error"' "${json[@]}" --data-binary "@$out/big" "$base/v1/completions"
  check too-long 400 'context_length_exceeded' "${json[@]}" \
    -d "{\"prompt\": \"$(head -c 600 /dev/zero | tr '\0' a)\"}" "$base/v1/completions"
  check not-found 404 '"error"' "$base/v1/engines"
  check model-by-id 200 '"id":"tiny"' "$base/v1/models/tiny"
  check unknown-field 400 '"code":"unknown_parameter"' "${json[@]}" -d '{"prompt": "x", "foo": 1}' "$base/v1/completions"
  check refused-field 400 '"param":"n"' "${json[@]}" -d '{"prompt": "x", "n": 3}' "$base/v1/completions"
  check metrics 200 'microllm_requests_total{endpoint="/v1/completions",status="200"}' "$base/metrics"
  grep -qF 'microllm_time_to_first_token_seconds_bucket' "$out/metrics.body" || fail "metrics: no TTFT histogram"
fi

if [ -n "$server_pid" ]; then
  kill -TERM "$server_pid"
  if ! wait "$server_pid"; then fail "the server did not exit cleanly on SIGTERM"; cat "$out/server.log"; fi
  server_pid=""
fi

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"

#!/usr/bin/env bash
# Smoke test of the microllm commands over a model directory: inspect, generate --model (plain, --chat,
# with --stop), and chat with two user turns piped to stdin. Checks exit codes and that each prints
# something. Run by the CliSmoke test (cli_smoke_test.cpp), which builds a tiny random model directory with
# a byte-level tokenizer and a ChatML template; by hand:
#   tests/generate/cli_smoke.sh build/apps/microllm /path/to/model-dir
set -uo pipefail

bin=${1:?usage: cli_smoke.sh MICROLLM MODEL_DIR}
model=${2:?usage: cli_smoke.sh MICROLLM MODEL_DIR}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failures=0

# check NAME EXPECTED_TEXT COMMAND...: the command exits 0 and its stdout is non-empty (and holds
# EXPECTED_TEXT when given).
check() {
  local name=$1 expected=$2
  shift 2
  "$@" >"$out/$name.out" 2>"$out/$name.err"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL $name: exit code $rc"; cat "$out/$name.err"; failures=$((failures + 1)); return
  fi
  if [ ! -s "$out/$name.out" ]; then
    echo "FAIL $name: no output"; cat "$out/$name.err"; failures=$((failures + 1)); return
  fi
  if [ -n "$expected" ] && ! grep -qF -- "$expected" "$out/$name.out"; then
    echo "FAIL $name: the output lacks '$expected'"; cat "$out/$name.out"; failures=$((failures + 1)); return
  fi
  echo "ok   $name: $(head -c 160 "$out/$name.out" | tr '\n' ' ')"
}

check inspect "model.embed_tokens.weight" "$bin" inspect "$model"
check inspect-filter "parameters" "$bin" inspect "$model" --filter layers.1. --files
check generate "Once upon" "$bin" generate --model "$model" --prompt "Once upon" --max-tokens 12 --seed 3
check generate-checkpoint-alias "" "$bin" generate --checkpoint "$model" --prompt "abc" --max-tokens 4 --temperature 0
check generate-chat "" "$bin" generate --model "$model" --prompt "Hi there" --chat --system "Be brief." \
  --max-tokens 8 --temperature 0.9 --top-k 40 --top-p 0.95 --min-p 0.01 --repetition-penalty 1.1 --seed 1
check generate-stop "" "$bin" generate --model "$model" --prompt "x" --max-tokens 16 --stop a --stop "\n" \
  --temperature 0 --dtype bf16 --device cpu

# The same greedy text twice (seeded, deterministic), and --stop leaves no stop string in the output.
"$bin" generate --model "$model" --prompt "zz" --max-tokens 10 --temperature 1 --seed 5 --no-echo >"$out/a" 2>&1
"$bin" generate --model "$model" --prompt "zz" --max-tokens 10 --temperature 1 --seed 5 --no-echo >"$out/b" 2>&1
if ! cmp -s "$out/a" "$out/b"; then echo "FAIL seed: the same seed gave different text"; failures=$((failures + 1)); fi

# A stop string taken from the middle of a greedy continuation: the text ends right before it.
export LC_ALL=C  # substrings and patterns over bytes
full=$("$bin" generate --model "$model" --prompt "stop test" --max-tokens 24 --temperature 1 --seed 11 --no-echo 2>&1)
stop=${full:6:2}
if [ ${#full} -ge 8 ] && [[ "$stop" != *\\* ]]; then
  expected=${full%%"$stop"*}
  got=$("$bin" generate --model "$model" --prompt "stop test" --max-tokens 24 --temperature 1 --seed 11 --no-echo \
        --stop="$stop" 2>&1)
  if [ "$got" != "$expected" ]; then
    echo "FAIL stop: with --stop '$stop' got '$got', expected '$expected' (of '$full')"; failures=$((failures + 1))
  else
    echo "ok   stop: '$full' with --stop '$stop' -> '$got'"
  fi
fi

printf 'Hello!\nTell me more.\n' >"$out/turns"
check chat "" "$bin" chat --model "$model" --system "You are terse." --max-tokens 6 --temperature 0 <"$out/turns"
lines=$(wc -l <"$out/chat.out")
if [ "$lines" -lt 2 ]; then
  echo "FAIL chat: expected a reply line per turn, got $lines lines"; failures=$((failures + 1))
fi
printf 'one\n/reset\ntwo\n/exit\nnever sent\n' >"$out/turns2"
check chat-commands "" "$bin" chat --model "$model" --max-tokens 4 --seed 2 <"$out/turns2"

# Errors are reported with a non-zero exit code.
if "$bin" generate --model "$out/missing" --prompt x >/dev/null 2>&1; then
  echo "FAIL generate on a missing directory exited 0"; failures=$((failures + 1))
fi

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"

#!/usr/bin/env bash
# Data-parallel training on a multi-GPU machine (issue 8), with the binaries staged by tools/gpu/stage.sh:
#   device run, kind nvidia-h200-x2 (or x4/x8), carry [".device"], command: bash tools/gpu/multi_gpu.sh
# Ranks are launched torchrun-style (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; NCCL through
# the TCP rendezvous). Steps, in order of value, each with its own time limit; results in $OUT/multi.tgz,
# rewritten after every step:
#   1. correctness: tiny fp32, 20 steps, 1 GPU vs N GPUs on the same global batch (per-parameter relative
#      error), and model-s bf16-mixed loss curves
#   2. scaling: Qwen2.5-0.5B config, bf16 mixed, B8 T1024 per GPU: tokens/s on 1 and on N GPUs
#   3. ZeRO-1 at N: peak memory per rank against plain DDP
#   4. failure: kill one rank mid-run; how long the others take to exit
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
OUT=${OUT:-/tmp/out}
RES=$(mktemp -d)
mkdir -p "$OUT" "$RES/logs"
bin=.device/bin/microllm
N=${GPUS:-$(nvidia-smi -L | wc -l)}
save() { tar czf "$OUT/multi.tgz.tmp" -C "$RES" . && mv "$OUT/multi.tgz.tmp" "$OUT/multi.tgz"; }
nvidia-smi -L | tee "$RES/logs/gpus.txt"
nvidia-smi topo -m > "$RES/logs/topo.txt" 2>&1
echo "world size N=$N"

mkdir -p data && tar xJf .device/corpora.tar.xz -C data
"$bin" prepare --input data/corpora/kjv.txt --output /tmp/kjv > "$RES/logs/prepare.log" 2>&1

port=29500
# launch NAME SECONDS ARGS...: N ranks of `microllm train ARGS`, logs in $RES/logs/NAME.rank*.log
launch() {
  local name=$1 limit=$2; shift 2
  port=$((port + 2))
  local pids=()
  for ((r = 0; r < N; ++r)); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$N MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout "$limit" "$bin" train --distributed nccl --device cuda "$@" > "$RES/logs/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  local status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  echo "== $name (N=$N): exit $status"; tail -2 "$RES/logs/$name.rank0.log"
}
single() {
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$bin" train --device cuda:0 "$@" > "$RES/logs/$name.log" 2>&1
  echo "== $name (1 GPU): exit $?"; tail -2 "$RES/logs/$name.log"
}

# 1. correctness
common=(--data /tmp/kjv --steps 20 --eval-interval 0 --set log_interval=1 --set eval_batches=2 --warmup 2)
single tiny1 60 --preset tiny --batch-size 16 --seq-len 128 --precision fp32 "${common[@]}" --out "$RES/tiny1" \
  --set checkpoint_dir=/tmp/tiny1
launch tinyN 90 --preset tiny --batch-size 16 --seq-len 128 --precision fp32 "${common[@]}" --out "$RES/tinyN" \
  --set checkpoint_dir=/tmp/tinyN
python3 - "$RES" <<'EOF' | tee "$RES/correctness.txt"
import json, sys
from safetensors.torch import load_file
res = sys.argv[1]
a, b = load_file("/tmp/tiny1/model.safetensors"), load_file("/tmp/tinyN/model.safetensors")
worst = max(((x - b[k]).norm() / b[k].norm()).item() for k, x in a.items())
print(f"tiny fp32, 20 steps: max per-parameter relative error, 1 GPU vs N GPUs: {worst:.3e} (limit 1e-5) over {len(a)} tensors")
EOF
save
single models1 90 --preset model-s --batch-size 32 --seq-len 256 --precision bf16-mixed --lr 2e-3 "${common[@]}" \
  --out "$RES/models1" --set checkpoint_dir=/tmp/models1
launch modelsN 120 --preset model-s --batch-size 32 --seq-len 256 --precision bf16-mixed --lr 2e-3 "${common[@]}" \
  --out "$RES/modelsN" --set checkpoint_dir=/tmp/modelsN
python3 - "$RES" <<'EOF' | tee -a "$RES/correctness.txt"
import json, sys
res = sys.argv[1]
def losses(run):
    return {m["step"]: m["loss"] for m in map(json.loads, open(f"{res}/{run}/metrics.jsonl")) if m.get("type") == "train"}
one, many = losses("models1"), losses("modelsN")
diff = max(abs(one[s] - many[s]) for s in one if s in many)
print(f"model-s bf16-mixed, 20 steps: max |loss(1 GPU) - loss(N GPUs)| over {len(one)} logged steps: {diff:.2e} (limit 1e-3)")
EOF
save

# 2. scaling and 3. ZeRO-1
qwen=(--preset tests/fixtures/configs/qwen2.5-0.5b.json --data /tmp/kjv --precision bf16-mixed --seq-len 1024 \
  --steps 25 --warmup 5 --lr 3e-4 --eval-interval 0 --set log_interval=5 --set eval_batches=1)
single qwen1 150 "${qwen[@]}" --batch-size 8 --out "$RES/qwen1" --set checkpoint_dir=/tmp/qwen1
launch qwenN 200 "${qwen[@]}" --batch-size $((8 * N)) --out "$RES/qwenN" --set checkpoint_dir=/tmp/qwenN
save
launch qwenN_zero1 200 "${qwen[@]}" --batch-size $((8 * N)) --zero1 --out "$RES/qwenN_zero1" \
  --set checkpoint_dir=/tmp/qwenN_zero1
python3 - "$RES" "$N" <<'EOF' | tee "$RES/scaling.txt"
import json, re, sys
res, n = sys.argv[1], int(sys.argv[2])
def tps(run):
    steps = [m for m in map(json.loads, open(f"{res}/{run}/metrics.jsonl")) if m.get("type") == "train"]
    steady = [m["tokens_per_second"] for m in steps[1:]] or [steps[-1]["tokens_per_second"]]
    return sum(steady) / len(steady)
def peaks(log):
    return re.findall(r"peak device memory[^\n]*", open(f"{res}/logs/{log}").read())
one, many = tps("qwen1"), tps("qwenN")
print(f"Qwen2.5-0.5B bf16-mixed, B8 T1024 per GPU: 1 GPU {one:,.0f} tok/s; {n} GPUs {many:,.0f} tok/s; "
      f"efficiency {many / (n * one):.3f}")
print("peak memory, plain DDP:", peaks("qwenN.rank0.log"))
print("peak memory, ZeRO-1:   ", peaks("qwenN_zero1.rank0.log"))
EOF
save

# 4. failure: kill rank N-1 after 10 s of a long run; the others must exit with an error within 60 s
port=$((port + 2))
pids=()
for ((r = 0; r < N; ++r)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$N MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 120 "$bin" train \
    --distributed nccl --device cuda --preset model-s --data /tmp/kjv --batch-size $((8 * N)) --seq-len 256 \
    --steps 100000 --eval-interval 0 --out "$RES/fail" --set checkpoint_dir=/tmp/fail > "$RES/logs/fail.rank$r.log" 2>&1 &
  pids+=($!)
done
sleep 10
# The pid is timeout's: kill the microllm process under it (killing timeout alone leaves the rank running).
pkill -9 -P "${pids[$((N - 1))]}"
killed=$EPOCHREALTIME
for ((r = 0; r < N - 1; ++r)); do
  wait "${pids[$r]}"; status=$?
  echo "failure: rank $r exited with status $status $(python3 -c "print(round($EPOCHREALTIME - $killed, 1))") s after rank $((N - 1)) was killed" \
    | tee -a "$RES/failure.txt"
done
tail -3 "$RES/logs/fail.rank0.log" | tee -a "$RES/failure.txt"
save

#!/usr/bin/env bash
# Data-parallel training on a multi-GPU machine (issue 8), with the binaries staged by tools/gpu/stage.sh:
#   device run, kind nvidia-h200-x2 (or x4/x8), carry [".device"], command: bash tools/gpu/multi_gpu.sh
# Ranks are launched torchrun-style (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; NCCL through
# the TCP rendezvous). Steps, in order of value, each with its own time limit; results in $OUT/multi.tgz,
# rewritten after every step:
#   1. correctness: tiny fp32 and model-s bf16-mixed, 20 steps, 1 GPU (on the ranks' micro-batches:
#      grad_accum N) vs N GPUs on the same global batches: worst per-parameter relative error, max loss
#      difference
#   2. scaling: Qwen2.5-0.5B config, bf16 mixed, B8 T1024 per GPU: tokens/s on 1 and on N GPUs, and the
#      share of all-reduce time hidden behind backward (time_collectives: CUDA events)
#   3. ZeRO-1 at N: peak memory per rank against plain DDP
#   4. failure: kill one rank mid-run; how long the others take to exit (collective timeout 30 s)
# MULTI_STEPS picks some of them: "correctness scaling failure" (the default; scaling includes ZeRO-1).
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
# launch NAME SECONDS ARGS...: N ranks of `microllm train --overwrite ARGS`, logs in $RES/logs/NAME.rank*.log
launch() {
  local name=$1 limit=$2; shift 2
  port=$((port + 2))
  local pids=()
  for ((r = 0; r < N; ++r)); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$N MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout "$limit" "$bin" train --distributed nccl --device cuda --overwrite "$@" > "$RES/logs/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  local status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  echo "== $name (N=$N): exit $status"; tail -2 "$RES/logs/$name.rank0.log"
}
single() {
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$bin" train --device cuda:0 --overwrite "$@" > "$RES/logs/$name.log" 2>&1
  echo "== $name (1 GPU): exit $?"; tail -2 "$RES/logs/$name.log"
}

steps=" ${MULTI_STEPS:-correctness scaling failure} "
if [[ $steps == *" correctness "* ]]; then
# 1. correctness. The 1-GPU reference trains on the same global batches split the way the N ranks split
# them: batch_size / N rows per micro-batch, grad_accum N (the sampler draws rows in order, so micro-batch r
# holds rank r's rows), hence the ranks' GEMM shapes and the same per-pass sums; autograd adds each pass's
# gradient once, so with N = 2 the reference's g0/2 + g1/2 is the all-reduce's (g0 + g1)/2 wherever the
# kernels are deterministic. The one-pass run (all rows in one micro-batch) is kept for comparison only.
common=(--data /tmp/kjv --steps 20 --eval-interval 0 --set log_interval=1 --set eval_batches=2 --warmup 2)
tiny=(--preset tiny --seq-len 128 --precision fp32 "${common[@]}")
single tiny1 60 "${tiny[@]}" --batch-size $((16 / N)) --grad-accum "$N" --out "$RES/tiny1" \
  --set checkpoint_dir=/tmp/tiny1
single tiny1pass 60 "${tiny[@]}" --batch-size 16 --out "$RES/tiny1pass" --set checkpoint_dir=/tmp/tiny1pass
launch tinyN 90 "${tiny[@]}" --batch-size 16 --out "$RES/tinyN" --set checkpoint_dir=/tmp/tinyN
models=(--preset model-s --seq-len 256 --precision bf16-mixed --lr 2e-3 "${common[@]}")
single models1 90 "${models[@]}" --batch-size $((32 / N)) --grad-accum "$N" --out "$RES/models1" \
  --set checkpoint_dir=/tmp/models1
single models1pass 90 "${models[@]}" --batch-size 32 --out "$RES/models1pass" --set checkpoint_dir=/tmp/models1pass
launch modelsN 120 "${models[@]}" --batch-size 32 --out "$RES/modelsN" --set checkpoint_dir=/tmp/modelsN
# Per parameter: microllm::testing::relative_error, ||a - b||_2 / ||b||_2 per tensor in f64, against rank 0's
# parameters after N GPUs (ranks are bit-identical by construction; only rank 0 writes a checkpoint).
python3 - "$RES" <<'EOF' | tee "$RES/correctness.txt"
import json, sys
from safetensors.torch import load_file
res = sys.argv[1]
def losses(run):
    return {m["step"]: m["loss"] for m in map(json.loads, open(f"{res}/{run}/metrics.jsonl")) if m.get("type") == "train"}
def compare(model, run_n, run_1, what, limit_name, limit):
    b, a = load_file(f"/tmp/{run_n}/model.safetensors"), load_file(f"/tmp/{run_1}/model.safetensors")
    errs = {k: ((x.double() - b[k].double()).norm() / b[k].double().norm()).item() for k, x in a.items()}
    name = max(errs, key=errs.get)
    one, many = losses(run_1), losses(run_n)
    steps = [s for s in one if s in many]
    worst = max(steps, key=lambda s: abs(one[s] - many[s]))
    print(f"{model}, 20 steps, {what} vs N GPUs: worst per-parameter relative error {errs[name]:.3e} ({name}; "
          f"{sum(e == 0 for e in errs.values())} of {len(errs)} tensors bit-identical); max |loss difference| "
          f"{abs(one[worst] - many[worst]):.2e} at step {worst} of {len(steps)}" + (f" (limit: {limit_name} {limit})" if limit else " (for comparison)"))
compare("tiny fp32", "tinyN", "tiny1", "1 GPU on the ranks' micro-batches", "relative error", "1e-5")
compare("tiny fp32", "tinyN", "tiny1pass", "1 GPU in one pass", "", "")
compare("model-s bf16-mixed", "modelsN", "models1", "1 GPU on the ranks' micro-batches", "loss difference", "1e-3")
compare("model-s bf16-mixed", "modelsN", "models1pass", "1 GPU in one pass", "", "")
EOF
save

fi

if [[ $steps == *" scaling "* ]]; then
# 2. scaling and 3. ZeRO-1
qwen=(--preset tests/fixtures/configs/qwen2.5-0.5b.json --data /tmp/kjv --precision bf16-mixed --seq-len 1024 \
  --steps 25 --warmup 5 --lr 3e-4 --eval-interval 0 --set log_interval=5 --set eval_batches=1)
single qwen1 150 "${qwen[@]}" --batch-size 8 --out "$RES/qwen1" --set checkpoint_dir=/tmp/qwen1
# time_collectives: CUDA events around each bucket's all-reduce and at the end of backward (rank 0's
# share of all-reduce time hidden behind backward; two events per bucket, no extra synchronization).
launch qwenN 200 "${qwen[@]}" --batch-size $((8 * N)) --out "$RES/qwenN" --set checkpoint_dir=/tmp/qwenN \
  --set time_collectives=true
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
timed = [m for m in map(json.loads, open(f"{res}/qwenN/metrics.jsonl")) if m.get("type") == "train"][1:]
if timed and "comm_ms" in timed[0]:
    comm = sum(m["comm_ms"] for m in timed) / len(timed)
    hidden = sum(m["comm_hidden_ms"] for m in timed) / len(timed)
    exposed = sum(m["comm_exposed_ms"] for m in timed) / len(timed)
    print(f"all-reduce per step (rank 0, steady state): {comm:.2f} ms, {hidden:.2f} ms of it before backward ended: "
          f"hidden share {hidden / comm if comm else 0:.3f}; exposed wait after backward {exposed:.2f} ms")
else:
    print("all-reduce timing: not in metrics.jsonl")
print("peak memory, plain DDP:", peaks("qwenN.rank0.log"))
print("peak memory, ZeRO-1:   ", peaks("qwenN_zero1.rank0.log"))
EOF
save

fi

if [[ $steps == *" failure "* ]]; then
# 4. failure: kill rank N-1 (SIGKILL) once rank 0 has logged a training step; the others must exit with an
# error within 60 s. No launcher watches these ranks (torchrun or mpirun would end them at once): they must
# notice by themselves, through NCCL's asynchronous error or the collective timeout, set to 30 s here.
port=$((port + 2))
pids=()
for ((r = 0; r < N; ++r)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$N MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 150 "$bin" train \
    --distributed nccl --device cuda --preset model-s --data /tmp/kjv --batch-size $((8 * N)) --seq-len 256 \
    --steps 100000 --eval-interval 0 --set log_interval=1 --set comm_timeout_seconds=30 --out "$RES/fail" \
    --set checkpoint_dir=/tmp/fail --overwrite > "$RES/logs/fail.rank$r.log" 2>&1 &
  pids+=($!)  # timeout's pid: the rank is its child
done
for ((i = 0; i < 120; ++i)); do  # up to 60 s for the first logged step
  grep -q "^step " "$RES/logs/fail.rank0.log" 2>/dev/null && break
  sleep 0.5
done
grep -q "^step " "$RES/logs/fail.rank0.log" || echo "failure: rank 0 logged no step within 60 s" | tee -a "$RES/failure.txt"
victim=$(pgrep -P "${pids[$((N - 1))]}")
killed=$EPOCHREALTIME
kill -9 $victim
echo "failure: killed rank $((N - 1)) (pid $victim) after $(grep -c '^step ' "$RES/logs/fail.rank0.log") logged steps" \
  | tee -a "$RES/failure.txt"
for ((r = 0; r < N - 1; ++r)); do
  wait "${pids[$r]}"; status=$?
  elapsed=$(python3 -c "print(round($EPOCHREALTIME - $killed, 1))")
  verdict=$([[ $status -ne 0 && $status -ne 124 && $status -ne 137 ]] && python3 -c "exit(0 if $elapsed <= 60 else 1)" \
    && echo "ok: an error within 60 s" || echo "FAILED (124: still running at the 150 s limit)")
  echo "failure: rank $r exited with status $status $elapsed s after rank $((N - 1)) was killed: $verdict" \
    | tee -a "$RES/failure.txt"
done
wait "${pids[$((N - 1))]}"
tail -3 "$RES/logs/fail.rank0.log" | tee -a "$RES/failure.txt"
save
fi

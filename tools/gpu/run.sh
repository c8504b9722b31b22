#!/usr/bin/env bash
# The one script for the GPU machine (device tool): CUDA tests, compute-sanitizer, benchmarks against
# PyTorch in the same run, the oracles (golden files from PyTorch / transformers / tokenizers), model
# parity and training runs. Prepare here with tools/gpu/stage.sh, then:
#   device run, carry [".device"], command: bash tools/gpu/run.sh STEP... | all
# Steps run in the order given:
#   tests            every *_tests program, CUDA cases only (and the fused attention's one-cluster paths, forced)
#   sanitize         compute-sanitizer memcheck + racecheck (SANITIZE_TOOLS) on the CUDA op suite (SANITIZE_FILTER: a gtest
#                    filter), memcheck on the runtime and the engine, then sanitize-decode
#   sanitize-decode  racecheck + synccheck on the decode GEMV's and the paged decode attention's tests
#   sanitize-projected  memcheck, racecheck, synccheck on the fused decode attention + o projection's test
#   long-decode-ab   Qwen2.5-0.5B long-context workloads: head clusters on / off, token clusters on / off
#   sanitize-flash   memcheck + racecheck + synccheck on the Hopper flash attention forward's test (its TMA ring,
#                    mbarriers and the consumers' named barriers), bf16
#   bench            benchmarks/cuda_vs_torch.py (ops vs torch, same run)
#   oracle           tokenizer, training and model golden files (tests/fixtures/...); or one of
#                    oracle-tokenizer (ORACLE_TOKENIZERS=gpt2,...: a subset), oracle-train, oracle-models
#   allreduce        benchmarks/allreduce_bench: bucketed NCCL all-reduce of a Qwen2.5-0.5B-sized gradient
#   parity           tools/oracle/parity_full.py: full-size configs, transformers vs microllm
#   train-throughput benchmarks/train_vs_torch.py (Qwen2.5-0.5B config, B8 T1024, bf16 mixed) vs PyTorch
#   train-kjv, train-austen   model-s for TRAIN_SECONDS (default 270) per corpus, run at the same time
#   rms-sweep        cuda_ops_bench rms_norm rows for each MICROLLM_RMS_NORM_TPR (threads per row) and copy
#   decode-ab        microllm bench decode (tg128 B1/B8, the 2048:2:64, 1024:2:64 and 1024:1:64 workloads) on Qwen2.5-0.5B
#                    and R1-1.5B with every decode path on, then MICROLLM_DISABLE=pdl, gemv, attention-o,
#                    attention-cluster (and DECODE_AB_EXTRA's: path names, or VAR=value settings such as
#                    MICROLLM_ATTENTION_O_REPLICAS=1); cuda_ops_bench's
#                    decode_linear and decode_norm_linear (GEMV vs cuBLASLt / the separate kernels, weights
#                    from DRAM) and decode_step rows
#   lib-ab           backend libraries built here from other commits (.device/exp/NAME/) against the staged one,
#                    alternated under microllm bench (LIB_AB_RUNS, LIB_AB_PASSES)
#   gemm-algos       benchmarks/cublaslt_algos_bench: every cuBLASLt candidate for the models' prefill and training GEMMs
#                    against the heuristic's first answer (what gemm_tuning.cu chooses among)
#   persistent-mlp   benchmarks/persistent_mlp_bench: a decode layer's MLP half as one persistent kernel against the
#                    chained GEMV kernels
#   prefill-profile  microllm bench --op-times, pp2048 B1 on the R1-Distill-1.5B config; then every kernel of pp2048
#                    timed alone by Nsight Compute, grouped by tools/gpu/ncu_kernel_table.py (PREFILL_PROFILE_CONFIGS)
#   host-profile     the host's time in microllm bench (HOST_PROFILE_ARGS, default 1,500 eager 128-token forwards of
#                    Qwen2.5-0.5B, --path plain) under gperftools' CPU profiler (libprofiler staged from this machine's
#                    libgoogle-perftools4), read by tools/gpu/host_profile.py
#   gemv-profile     Nsight Compute sections of the decode GEMV and of cuBLASLt on one cuda_ops_bench row
#                    (GEMV_PROFILE_OP, default Qwen2.5-0.5B's folded gate_up)
#   engine-bench     microllm bench on the Qwen2.5-0.5B config, bf16, --path engine and --path plain
#   workload-profile every kernel of the target's workload (WORKLOAD_PROFILE, default 2048:2:6: the batched prefill
#                    and 5 decode steps over 2K keys, one run) timed alone by Nsight Compute, grouped
#                    by tools/gpu/ncu_kernel_table.py
#   engine-profile   microllm bench --op-times (per-op CUDA event times) and, when nsys exists, its kernel table;
#                    when ncu exists, every kernel of a few B1 decode steps timed alone (NCU_KERNELS, NCU_BATCH)
#   infer            infer-bench then infer-serve (an estimate of 5-8 min together, not measured yet; each is
#                    bounded by its timeouts, so give them one device call each when in doubt):
#   infer-bench      benchmarks/inference_vs_transformers.py, microllm bench vs transformers (pp512, pp2048,
#                    tg128 at B1/8/32, the 2048:2:64 workload) on the Qwen2.5-0.5B and DeepSeek-1.5B configs
#                    (INFER_REPS, default 3)
#   infer-serve      microllm serve --device cuda on a random-weight Qwen2.5-0.5B directory
#                    (tools/gpu/random_model_dir.py, Qwen3's tokenizer from .device/tokenizers.tar.xz) under
#                    benchmarks/serve_load.py: SERVE_CLIENTS (64) streaming clients for SERVE_SECONDS (60),
#                    --max-batch SERVE_MAX_BATCH (64); then SERVE_DISCONNECT_SECONDS (30) with a third of the clients
#                    leaving their requests half-way (--disconnect-fraction): every KV block must be free after it;
#                    SERVE_TRACE=1: the first server writes a trace of its first SERVE_TRACE_SECONDS (30)
# Results land in $OUT/results.tgz, rewritten after every step (the device tool returns few files, and a
# call cut short by its time limit still returns what finished).
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
RES=$(mktemp -d)
mkdir -p "$OUT" "$RES/logs" "$RES/fixtures"
bin=.device/bin
steps=("$@")
[ ${#steps[@]} -eq 0 ] || [ "${steps[0]}" = all ] &&
  steps=(tests sanitize bench oracle parity allreduce train-throughput infer train-kjv train-austen)
save_results() { tar czf "$OUT/results.tgz.tmp" -C "$RES" . && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$RES/logs/gpu.txt" 2>&1
cat "$RES/logs/gpu.txt"

step_tests() {
  for suite in "$bin"/*_tests; do
    name=$(basename "$suite")
    timeout 400 "$suite" --gtest_filter='*cuda*:*Cuda*' --gtest_brief=1 > "$RES/logs/$name.cuda.log" 2>&1
    echo "== $name (cuda): exit $? $(grep -E '^\[  (PASSED|FAILED)' "$RES/logs/$name.cuda.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$RES/logs/$name.cuda.log" | head -30
  done
  # The fused attention + o projection's one-cluster paths (rows streamed through L2), which the replica
  # policies leave to GPUs with fewer SMs: forced here.
  MICROLLM_ATTENTION_O_REPLICAS=1 timeout 200 "$bin/ops_tests" --gtest_filter='*DecodeAttentionProjected*/cuda*' \
    --gtest_brief=1 > "$RES/logs/ops_tests.one_cluster.log" 2>&1
  echo "== ops_tests (cuda, MICROLLM_ATTENTION_O_REPLICAS=1): exit $? $(grep -E '^\[  (PASSED|FAILED)' \
    "$RES/logs/ops_tests.one_cluster.log" | tr '\n' ' ')"
}

# One compute-sanitizer run: sanitize_run LOG TOOL PROGRAM GTEST_FILTER SECONDS, its summary printed.
sanitize_run() {
  timeout "$5" compute-sanitizer --tool "$2" --error-exitcode 9 "$bin/$3" --gtest_filter="$4" --gtest_brief=1 \
    > "$RES/logs/sanitizer_$1.log" 2>&1
  echo "== compute-sanitizer $2, $1: exit $?"
  grep -E 'SUMMARY|PASSED|FAILED' "$RES/logs/sanitizer_$1.log" | head -5
}

step_sanitize() {
  local tool
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    sanitize_run "$tool" "$tool" ops_tests \
      "${SANITIZE_FILTER:-Dtypes/CudaParityTest.*/cuda_bf16:Dtypes/CudaParityTest.*/cuda_f32:-*AttentionEdgeCases*}" 400
  done
  # The runtime's own tests, minus the one that provokes cudaMalloc failures on purpose (memcheck reports
  # each failed API call as an error).
  sanitize_run core memcheck core_tests '*Cuda*:*cuda*:-*OutOfMemoryIsAnErrorNotACrash*' 200
  # The serving engine on CUDA: graph replays, the step buffers' asynchronous copies, steps in flight.
  sanitize_run engine memcheck generate_tests '*Engine*cuda*' 300
  step_sanitize_decode
}

# The decode kernels' shared memory (the GEMV's cp.async rings and staged rows, the paged attention's staged
# K/V) under racecheck, and their barriers under synccheck: tests that launch only these kernels (a test that
# also runs cuBLASLt shows racecheck hazards inside NVIDIA's nvjet kernels, which are not ours to judge).
step_sanitize_decode() {
  local tool tests='Dtypes/DecodeGemvCudaTest.FoldsTheRmsNormsAndTheGate/cuda_bf16'
  tests+=':Dtypes/DecodeGemvCudaTest.ReplaysInsideACudaGraph/cuda_bf16'
  tests+=':Dtypes/PagedAttentionCudaTest.DecodeAttentionMatchesTheCpu/cuda_bf16'
  tests+=':Dtypes/PagedAttentionCudaTest.QwenAndR1DecodeShapes/cuda_bf16'
  for tool in racecheck synccheck; do sanitize_run "decode_$tool" "$tool" ops_tests "$tests" 200; done
}

# The fused decode attention + o projection past one split (paged_token_cluster_kernel, both cluster shapes; the
# splits and their projected merge): distributed shared memory, cluster barriers, the head clusters' counters.
step_sanitize_projected() {
  local tool
  for tool in memcheck racecheck synccheck; do
    sanitize_run "projected_$tool" "$tool" ops_tests '*DecodeAttentionProjected*/cuda*' 400
  done
}

# Long-context decode on Qwen2.5-0.5B: head clusters (a 4,096-key graph's attention and projection in one kernel)
# against the splits and their merge, alternated twice; then head clusters against a token's cluster up to 2,048
# keys (MICROLLM_DISABLE=attention-cluster hands those contexts to head clusters).
step_long_decode_ab() {
  local config=tests/fixtures/configs/qwen2.5-0.5b.json pass disable
  for pass in 1 2; do
    for disable in none attention-head-cluster; do
      echo "== pass $pass, MICROLLM_DISABLE=$disable"
      env MICROLLM_DISABLE=${disable#none} timeout 200 "$bin/microllm" bench --config $config --device cuda \
        --dtype bf16 -r 3 -p 0 -n 0 --workload ${LONG_DECODE_WORKLOADS:-2048:2:64,2048:1:64,3072:2:64} 2>&1 |
        tee "$RES/logs/long_decode_${pass}_${disable}.log" | grep -E "pp[0-9]+\+tg"
    done
    for disable in none attention-cluster; do
      echo "== pass $pass, MICROLLM_DISABLE=$disable"
      env MICROLLM_DISABLE=${disable#none} timeout 200 "$bin/microllm" bench --config $config --device cuda \
        --dtype bf16 -r 3 -p 0 -n 0 --workload 1024:2:64,1024:1:64,512:2:64 2>&1 |
        tee "$RES/logs/mid_decode_${pass}_${disable}.log" | grep -E "pp[0-9]+\+tg"
    done
  done
}

# Backend libraries against each other in one call: .device/lib's libmicrollm_backend.so (as "staged") and every
# .device/exp/NAME/libmicrollm_backend.so.0[.xz] (built here from another commit; xz keeps the carry small),
# alternated LIB_AB_PASSES (2) times under `microllm bench -r 3 -p 0` with each of LIB_AB_RUNS ("config|arguments"
# separated by ";"; default Qwen2.5-0.5B tg128 B1/2/8 and the 2048:2:64, 1024:2:64 workloads, R1-1.5B tg128 B1).
# Every library runs with the same environment: set no switch here (a library built before MICROLLM_DISABLE reads
# the variables it replaced, MICROLLM_GEMV=0 and so on, and ignores it; a newer one refuses those).
step_lib_ab() {
  local name dir pass run config args
  local -a libs=(staged) runs
  for dir in .device/exp/*/; do
    [ -d "$dir" ] || continue
    [ -f "$dir/libmicrollm_backend.so.0.xz" ] && xz -d -f "$dir/libmicrollm_backend.so.0.xz"
    [ -f "$dir/libmicrollm_backend.so.0" ] && libs+=("$(basename "$dir")")
  done
  IFS=';' read -r -a runs <<< "${LIB_AB_RUNS:-qwen2.5-0.5b|-n 128 -b 1,2,8 --workload 2048:2:64,1024:2:64;deepseek-r1-distill-qwen-1.5b|-n 128 -b 1 --workload none}"
  for pass in $(seq "${LIB_AB_PASSES:-2}"); do
    for name in "${libs[@]}"; do
      local path=$LD_LIBRARY_PATH
      [ "$name" = staged ] || path="$PWD/.device/exp/$name:$LD_LIBRARY_PATH"
      for run in "${runs[@]}"; do
        config=${run%%|*} args=${run#*|}
        echo "== pass $pass, $name, $config $args"
        # shellcheck disable=SC2086  # args: words for microllm bench
        LD_LIBRARY_PATH=$path timeout 300 "$bin/microllm" bench --config "tests/fixtures/configs/$config.json" \
          --device cuda --dtype bf16 -r 3 -p 0 $args 2>&1 | tee "$RES/logs/lib_ab_${pass}_${name}_${config}.log" |
          grep -E "tg[0-9]+|pp[0-9]+\+tg"
      done
    done
  done
}

# The Hopper flash forward (attention_flash_fwd_sm90.cu): a producer warpgroup, mbarriers and named barriers.
step_sanitize_flash() {
  local tool
  for tool in memcheck racecheck synccheck; do
    sanitize_run "flash_$tool" "$tool" ops_tests 'Dtypes/FlashForwardCudaTest.*/cuda_bf16' 300
  done
}

step_bench() {
  timeout 500 python3 benchmarks/cuda_vs_torch.py --bench "$bin/cuda_ops_bench" --reps 20 --out "$RES/cuda_ops.md" \
    > "$RES/logs/bench.log" 2>&1
  echo "== bench: exit $?"
  grep -E '^\|' "$RES/cuda_ops.md" 2>/dev/null || tail -20 "$RES/logs/bench.log"
}

step_oracle_tokenizer() {
  if [ -f .device/tokenizers.tar.xz ]; then mkdir -p data && tar xJf .device/tokenizers.tar.xz -C data; fi
  timeout 300 python3 tools/oracle/tokenizer_golden.py ${ORACLE_TOKENIZERS:+--names $ORACLE_TOKENIZERS} \
    > "$RES/logs/oracle_tokenizer.log" 2>&1
  echo "== oracle tokenizer: exit $?"; tail -3 "$RES/logs/oracle_tokenizer.log"
  mkdir -p "$RES/fixtures/tokenizer" && cp -r tests/fixtures/tokenizer/. "$RES/fixtures/tokenizer/"
}

step_oracle_train() {
  timeout 200 python3 tools/oracle/train_golden.py > "$RES/logs/oracle_train.log" 2>&1
  echo "== oracle train: exit $?"; tail -3 "$RES/logs/oracle_train.log"
  mkdir -p "$RES/fixtures/train" && cp -r tests/fixtures/train/. "$RES/fixtures/train/"
}

step_oracle_models() {
  timeout 300 python3 tools/oracle/model_golden.py > "$RES/logs/oracle_model.log" 2>&1
  echo "== oracle models: exit $?"; tail -5 "$RES/logs/oracle_model.log"
  mkdir -p "$RES/fixtures/models" && cp -r tests/fixtures/models/. "$RES/fixtures/models/"
  # The model goldens just written, checked at once by the C++ side (CPU and CUDA).
  [ -x "$bin/models_tests" ] && timeout 200 "$bin/models_tests" --gtest_brief=1 > "$RES/logs/models_tests.log" 2>&1
  echo "== models_tests on the new goldens: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$RES/logs/models_tests.log" | tr '\n' ' ')"
}

step_allreduce() {
  timeout 200 "$bin/allreduce_bench" > "$RES/allreduce.md" 2> "$RES/logs/allreduce.log"
  echo "== allreduce bench: exit $?"; cat "$RES/allreduce.md"; tail -5 "$RES/logs/allreduce.log"
}

step_parity() {
  timeout 400 python3 tools/oracle/parity_full.py --microllm "$bin/microllm" --configs tests/fixtures/configs \
    --out "$RES/parity.md" > "$RES/logs/parity.log" 2>&1
  echo "== parity: exit $?"; cat "$RES/parity.md" 2>/dev/null || tail -30 "$RES/logs/parity.log"
}

prepare_corpora() {
  [ -f /tmp/kjv.train.bin ] && return
  mkdir -p data && tar xJf .device/corpora.tar.xz -C data
  for corpus in kjv austen; do
    "$bin/microllm" prepare --input "data/corpora/$corpus.txt" --output "/tmp/$corpus" > "$RES/logs/prepare_$corpus.log" 2>&1
  done
}

step_train_throughput() {
  prepare_corpora
  timeout 500 python3 benchmarks/train_vs_torch.py --microllm "$bin/microllm" \
    --config tests/fixtures/configs/qwen2.5-0.5b.json --data /tmp/kjv --out "$RES/train_throughput.md" \
    > "$RES/logs/train_throughput.log" 2>&1
  echo "== train throughput: exit $?"; cat "$RES/train_throughput.md" 2>/dev/null || tail -30 "$RES/logs/train_throughput.log"
}

# model-s on each corpus named, at the same time (two processes): model-s does not fill an H200, so two
# runs take little more wall time than one. Then transformers loads each checkpoint strictly.
step_train_corpora() {
  prepare_corpora
  local corpus
  for corpus in "$@"; do
    timeout $((${TRAIN_SECONDS:-270} + 120)) "$bin/microllm" train --preset model-s --data "/tmp/$corpus" --device cuda \
      --precision bf16-mixed --batch-size 64 --seq-len 512 --steps 20000 --lr 2e-3 --warmup 200 --eval-interval 250 \
      --set max_seconds="${TRAIN_SECONDS:-270}" --set eval_batches=32 --set log_interval=50 \
      --out "$RES/model_s_$corpus" --set checkpoint_dir="/tmp/ckpt_$corpus" --overwrite > "$RES/logs/train_$corpus.log" 2>&1 &
  done
  wait
  for corpus in "$@"; do
    echo "== model-s on $corpus:"; tail -4 "$RES/logs/train_$corpus.log"
    timeout 120 python3 tools/oracle/train_golden.py --check-checkpoint "/tmp/ckpt_$corpus" --prompt "And " \
      --max-tokens 80 > "$RES/logs/hf_load_$corpus.log" 2>&1
    echo "== transformers loads the $corpus checkpoint: exit $?"; tail -3 "$RES/logs/hf_load_$corpus.log"
    "$bin/microllm" generate --checkpoint "/tmp/ckpt_$corpus" --prompt "And " --max-tokens 80 --temperature 0 \
      --device cuda > "$RES/logs/generate_$corpus.log" 2>&1
    echo "== microllm greedy on $corpus: exit $?"; cat "$RES/logs/generate_$corpus.log"
  done
}

step_infer_bench() {
  local config
  for config in qwen2.5-0.5b deepseek-r1-distill-qwen-1.5b; do
    timeout 300 python3 benchmarks/inference_vs_transformers.py --microllm "$bin/microllm" \
      --config "tests/fixtures/configs/$config.json" --reps "${INFER_REPS:-3}" --microllm-timeout 200 \
      --out "$RES/infer_$config.md" --json "$RES/infer_$config.json" > "$RES/logs/infer_$config.log" 2>&1
    echo "== inference vs transformers, $config: exit $?"
    cat "$RES/infer_$config.md" 2>/dev/null || tail -30 "$RES/logs/infer_$config.log"
    save_results
  done
}

step_rms_sweep() {
  local tpr
  "$bin/cuda_ops_bench" --filter copy --reps 50 2>&1 | tee "$RES/logs/rms_copy.log" | head -3
  for tpr in 256 128 64; do
    echo "== rms_norm, $tpr threads per row"
    MICROLLM_RMS_NORM_TPR=$tpr "$bin/cuda_ops_bench" --filter rms_norm --reps 50 2>&1 | tee "$RES/logs/rms_$tpr.log"
  done
}

step_decode_ab() {
  local config switch setting
  for config in qwen2.5-0.5b deepseek-r1-distill-qwen-1.5b; do
    for switch in none pdl gemv attention-o attention-cluster ${DECODE_AB_EXTRA:-}; do
      case $switch in
        none) setting= ;;
        *=*) setting=$switch ;;                # a VAR=value setting
        *) setting=MICROLLM_DISABLE=$switch ;;  # a path name
      esac
      echo "== $config, ${setting:-every path on}"
      env $setting timeout 200 "$bin/microllm" bench \
        --config tests/fixtures/configs/$config.json --device cuda --dtype bf16 -r 2 -p 0 -b 1,8 \
        --workload 2048:2:64,1024:2:64,1024:1:64 2>&1 |
        tee "$RES/logs/decode_ab_${config}_${switch}.log" | grep -E "tg128|pp[0-9]+\+tg"
    done
  done
  "$bin/cuda_ops_bench" --filter decode_ --reps 20 > "$RES/decode_ops.jsonl" 2>&1
  echo "== cuda_ops_bench --filter decode_: exit $?"; cut -c1-230 "$RES/decode_ops.jsonl"
}

# Why the GEMV streams mid-size weights slower than cuBLASLt (docs/perf/inference.md): Nsight Compute's
# throughput, occupancy, warp-stall and launch sections for GEMV_PROFILE_OP through the GEMV and through
# cuBLASLt, weights from DRAM. The default, Qwen2.5-0.5B's folded gate_up (17.4 MB, batch 1), is the largest
# weight the GEMV takes (gemv.cu's limits); GEMV off, the same row runs cuBLASLt's GEMM.
step_gemv_profile() {
  local ncu_bin op=${GEMV_PROFILE_OP:-decode_norm_linear/gate_up_swiglu qwen2.5}
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -z "$ncu_bin" ]; then echo "== no ncu on this machine"; return; fi
  local sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats
                  --section LaunchStats)
  timeout 200 "$ncu_bin" --graph-profiling node "${sections[@]}" --kernel-name regex:decode_gemv --launch-count 2 \
    "$bin/cuda_ops_bench" --filter "$op" --reps 2 > "$RES/ncu_gemv.txt" 2> "$RES/logs/ncu_gemv.log"
  echo "== ncu GEMV ($op): exit $?"
  timeout 200 "$ncu_bin" --graph-profiling node "${sections[@]}" --kernel-name 'regex:gemm|Gemm|xmma|cutlass|nvjet' \
    --launch-count 2 "$bin/cuda_ops_bench" --filter "$op" --reps 2 > "$RES/ncu_cublaslt.txt" 2> "$RES/logs/ncu_lt.log"
  echo "== ncu cuBLASLt ($op): exit $?"
  grep -hE "^  [a-z_].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Warp Cycles Per Issued|Theoretical Occupancy" \
    "$RES/ncu_gemv.txt" "$RES/ncu_cublaslt.txt" | head -60
}

step_gemm_algos() {
  timeout 300 "$bin/cublaslt_algos_bench" --algos 32 --reps 30 > "$RES/cublaslt_algos.log" 2>&1
  echo "== cublaslt_algos_bench: exit $?"; grep '^#' "$RES/cublaslt_algos.log"
}

step_persistent_mlp() {
  timeout 120 "$bin/persistent_mlp_bench" > "$RES/persistent_mlp.md" 2>&1
  echo "== persistent_mlp_bench: exit $?"; cat "$RES/persistent_mlp.md"
}

# Where a prefill's time goes: per-op CUDA event times of pp2048 on the R1-Distill-1.5B config.
step_prefill_profile() {
  timeout 200 "$bin/microllm" bench --config tests/fixtures/configs/deepseek-r1-distill-qwen-1.5b.json --device cuda \
    --dtype bf16 -p 2048 -n 0 -b 1 --workload none -r 2 --op-times > "$RES/logs/prefill_op_times.log" 2>&1
  echo "== prefill --op-times: exit $?"; cat "$RES/logs/prefill_op_times.log"
  # Nsight Compute: each kernel of the prefills timed alone (caches and clocks left as they are), grouped by
  # kernel: event times above carry each op's launch, these do not.
  local ncu_bin config
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$ncu_bin" ] || { echo "== no ncu on this machine"; return; }
  for config in ${PREFILL_PROFILE_CONFIGS:-deepseek-r1-distill-qwen-1.5b qwen2.5-0.5b}; do
    timeout 240 "$ncu_bin" --graph-profiling node --metrics gpu__time_duration.sum --clock-control none \
      --cache-control none --csv --launch-count ${NCU_KERNELS:-2000} "$bin/microllm" bench \
      --config tests/fixtures/configs/$config.json --device cuda --dtype bf16 -p 2048 -n 0 -b 1 --workload none -r 1 \
      > "$RES/ncu_prefill_$config.csv" 2> "$RES/logs/ncu_prefill_$config.log"
    echo "== ncu prefill $config: exit $?"
    python3 tools/gpu/ncu_kernel_table.py "$RES/ncu_prefill_$config.csv" | tee "$RES/ncu_prefill_$config.md"
  done
}

step_host_profile() {
  local lib=.device/gperf/libprofiler.so.0 prof="$RES/host.prof" f
  if [ ! -f "$lib" ]; then
    echo "== host-profile: no $lib (apt-get install libgoogle-perftools4 where you stage, then tools/gpu/stage.sh)"
    return
  fi
  # shellcheck disable=SC2086
  LD_PRELOAD="$PWD/$lib" LD_LIBRARY_PATH="$PWD/.device/gperf:$LD_LIBRARY_PATH" CPUPROFILE="$prof" \
    CPUPROFILE_FREQUENCY=2000 timeout 300 "$bin/microllm" bench --config tests/fixtures/configs/qwen2.5-0.5b.json \
    --device cuda --dtype bf16 ${HOST_PROFILE_ARGS:---path plain -p 128 -n 0 --workload none -r 1500} \
    > "$RES/logs/host_profile_bench.log" 2>&1
  echo "== host-profile bench: exit $?"; tail -3 "$RES/logs/host_profile_bench.log"
  for f in "$prof"*; do  # a forked child writes its own file (PROFILE_pid)
    python3 tools/gpu/host_profile.py "$f" --focus run_bench --group run_matmul --group launch_chained \
      > "$RES/logs/host_profile_$(basename "$f").md" 2>&1
    head -60 "$RES/logs/host_profile_$(basename "$f").md"
  done
}

step_engine_bench() {
  local path
  for path in engine plain; do
    timeout 280 "$bin/microllm" bench --config tests/fixtures/configs/qwen2.5-0.5b.json --device cuda --dtype bf16 \
      -r 3 --path "$path" --json "$RES/bench_$path.json" > "$RES/logs/bench_$path.log" 2>&1
    echo "== microllm bench --path $path: exit $?"; tail -16 "$RES/logs/bench_$path.log"
    save_results
  done
}

# Where a decode step's time goes: per-op CUDA event times (graphs off), and Nsight Systems' kernel table of
# the graph-replayed steps when nsys is there.
step_engine_profile() {
  local config=tests/fixtures/configs/qwen2.5-0.5b.json
  timeout 200 "$bin/microllm" bench --config $config --device cuda --dtype bf16 -p 0 -n 64 -b 1,8 --workload none \
    -r 2 --op-times > "$RES/logs/bench_op_times.log" 2>&1
  echo "== microllm bench --op-times: exit $?"; cat "$RES/logs/bench_op_times.log"
  local nsys_bin
  nsys_bin=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [ -n "$nsys_bin" ]; then
    timeout 200 "$nsys_bin" profile -o /tmp/engine --force-overwrite true --cuda-graph-trace=node \
      "$bin/microllm" bench --config $config --device cuda --dtype bf16 -p 0 -n 64 -b 1 --workload none -r 1 \
      > "$RES/logs/nsys.log" 2>&1
    "$nsys_bin" stats --report cuda_gpu_kern_sum --format csv /tmp/engine.nsys-rep > "$RES/nsys_kernels.csv" 2>&1
    echo "== nsys kernels (graph nodes)"; head -30 "$RES/nsys_kernels.csv" | cut -c1-220
  else
    echo "== no nsys on this machine"
  fi
  # Nsight Compute: every kernel node of the graph-replayed decode steps timed alone (one metric, caches
  # flushed before each kernel, clocks not locked): what each kernel costs without its neighbours.
  local ncu_bin
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$ncu_bin" ]; then
    timeout 240 "$ncu_bin" --graph-profiling node --metrics gpu__time_duration.sum --clock-control none --csv \
      --launch-count ${NCU_KERNELS:-1500} "$bin/microllm" bench --config $config --device cuda --dtype bf16 -p 0 \
      -n ${NCU_TOKENS:-4} -b ${NCU_BATCH:-1} --workload none -r 1 > "$RES/ncu_kernels.csv" 2> "$RES/logs/ncu.log"
    echo "== ncu: exit $?, $(grep -c gpu__time_duration "$RES/ncu_kernels.csv") kernels"; tail -3 "$RES/logs/ncu.log"
  fi
}

# The target's workload on Qwen2.5-0.5B under Nsight Compute: each kernel node of the prefill and decode graphs
# timed alone (caches and clocks left as they are), grouped by kernel (prefill and decode kernels differ by name).
step_workload_profile() {
  local ncu_bin
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$ncu_bin" ] || { echo "== no ncu on this machine"; return; }
  timeout 300 "$ncu_bin" --graph-profiling node --metrics gpu__time_duration.sum --clock-control none \
    --cache-control none --csv --launch-count ${NCU_KERNELS:-3000} "$bin/microllm" bench \
    --config tests/fixtures/configs/qwen2.5-0.5b.json --device cuda --dtype bf16 -p 0 -n 0 \
    --workload "${WORKLOAD_PROFILE:-2048:2:6}" -r 1 --warmup 0 > "$RES/ncu_workload.csv" 2> "$RES/logs/ncu_workload.log"
  echo "== ncu workload ${WORKLOAD_PROFILE:-2048:2:6}: exit $?"
  python3 tools/gpu/ncu_kernel_table.py "$RES/ncu_workload.csv" --name-width 90 | tee "$RES/ncu_workload.md"
}

# microllm serve needs a model directory: random weights from transformers (bf16) and a real tokenizer.
step_infer_serve() {
  local model=/tmp/serve-qwen2.5-0.5b tokenizer=() clients=${SERVE_CLIENTS:-64} server
  if [ ! -d data/tokenizers/qwen3 ] && [ -f .device/tokenizers.tar.xz ]; then
    mkdir -p data && tar xJf .device/tokenizers.tar.xz -C data
  fi
  [ -f data/tokenizers/qwen3/tokenizer.json ] && tokenizer=(--tokenizer data/tokenizers/qwen3)
  timeout 200 python3 tools/gpu/random_model_dir.py --config tests/fixtures/configs/qwen2.5-0.5b.json \
    "${tokenizer[@]}" --out "$model" > "$RES/logs/serve_model.log" 2>&1
  echo "== random-weight Qwen2.5-0.5B directory for serve: exit $?"; tail -3 "$RES/logs/serve_model.log"
  server="$bin/microllm serve --model $model --port 0 --device cuda --dtype bf16 --max-batch ${SERVE_MAX_BATCH:-64}"
  server+=" --http-threads $((clients + 16))"  # a streaming request holds an HTTP thread until it ends
  local traced=$server  # SERVE_TRACE=1: the first run also writes a trace of the server's first seconds
  [ -n "${SERVE_TRACE:-}" ] && traced+=" --trace $RES/serve.trace.json --trace-seconds ${SERVE_TRACE_SECONDS:-30}"
  timeout $((${SERVE_SECONDS:-60} + 240)) python3 benchmarks/serve_load.py --spawn "$traced" \
    --server-log "$RES/logs/serve.log" --startup-timeout 120 --clients "$clients" --duration "${SERVE_SECONDS:-60}" \
    --max-tokens 64 --out "$RES/serve_load.md" --json "$RES/serve_load.json" > "$RES/logs/serve_load.log" 2>&1
  echo "== serve load (microllm serve, cuda): exit $?"
  cat "$RES/serve_load.md" 2>/dev/null || tail -30 "$RES/logs/serve_load.log"
  tail -5 "$RES/logs/serve.log"
  if [ -f "$RES/serve.trace.json" ]; then
    "$bin/microllm" trace summarize "$RES/serve.trace.json" --rows 15 | tee "$RES/serve_trace_summary.md"
    xz -T0 -6 "$RES/serve.trace.json"
  fi
  # A third of the clients leave their requests half-way (streaming and not): every KV block must come back.
  timeout $((${SERVE_DISCONNECT_SECONDS:-30} + 240)) python3 benchmarks/serve_load.py --spawn "$server" \
    --server-log "$RES/logs/serve_disconnect.log" --startup-timeout 120 --clients "$clients" \
    --duration "${SERVE_DISCONNECT_SECONDS:-30}" --max-tokens 64 --disconnect-fraction 0.34 \
    --out "$RES/serve_disconnect.md" --json "$RES/serve_disconnect.json" > "$RES/logs/serve_disconnect_load.log" 2>&1
  echo "== serve load, a third of the clients leaving half-way: exit $?"
  cat "$RES/serve_disconnect.md" 2>/dev/null || tail -30 "$RES/logs/serve_disconnect_load.log"
}

corpora=()
for step in "${steps[@]}"; do
  case "$step" in
    train-kjv | train-austen) corpora+=("${step#train-}") ;;
  esac
done
trained=0
for step in "${steps[@]}"; do
  SECONDS=0
  case "$step" in
    tests) step_tests ;;
    sanitize) step_sanitize ;;
    sanitize-decode) step_sanitize_decode ;;
    sanitize-flash) step_sanitize_flash ;;
    sanitize-projected) step_sanitize_projected ;;
    long-decode-ab) step_long_decode_ab ;;
    bench) step_bench ;;
    oracle) step_oracle_tokenizer; step_oracle_train; step_oracle_models ;;
    oracle-tokenizer) step_oracle_tokenizer ;;
    oracle-train) step_oracle_train ;;
    oracle-models) step_oracle_models ;;
    allreduce) step_allreduce ;;
    parity) step_parity ;;
    train-throughput) step_train_throughput ;;
    rms-sweep) step_rms_sweep ;;
    engine-bench) step_engine_bench ;;
    engine-profile) step_engine_profile ;;
    workload-profile) step_workload_profile ;;
    decode-ab) step_decode_ab ;;
    lib-ab) step_lib_ab ;;
    prefill-profile) step_prefill_profile ;;
    host-profile) step_host_profile ;;
    gemm-algos) step_gemm_algos ;;
    persistent-mlp) step_persistent_mlp ;;
    gemv-profile) step_gemv_profile ;;
    infer) step_infer_bench; save_results; step_infer_serve ;;
    infer-bench) step_infer_bench ;;
    infer-serve) step_infer_serve ;;
    train-kjv | train-austen)
      [ $trained -eq 1 ] && continue
      trained=1
      step_train_corpora "${corpora[@]}" ;;
    *) echo "unknown step: $step"; continue ;;
  esac
  echo "-- $step took ${SECONDS}s"
  save_results
done
save_results

// Picking among cuBLASLt's algorithms by timing them (internal header; used by matmul.cu's plans).
//
// cuBLASLt's heuristic names its first choice without running anything, and for the shapes of our prefill and
// training GEMMs that choice is often not the fastest of the ones it offers (benchmarks/cublaslt_algos_bench;
// docs/perf/kernels.md#gemm-tuning). So a large half-precision problem's plan asks for several candidates and
// times each once, on scratch operands of its shape on a private stream, then keeps the fastest for the
// process's life.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cublaslt.h"
#include "microllm/core/dtype.h"

namespace microllm::cuda_kernels {

// What one GEMM reads and writes, as cuBLASLt's plan describes it; the byte counts are what the layouts span
// (ld x columns x element size).
struct TunedGemm {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, c;  // c is also D's layout
  size_t a_bytes, b_bytes, c_bytes;
  DType dtype;  // bf16 or f16: the scratch operands hold random values of it
  // Only candidates whose output is bit-identical to candidates[0]'s on the scratch operands may win: what
  // deterministic_algorithms() asks for, since a timed choice can differ between processes and a result
  // must not.
  bool same_bits;
};

// Index in candidates[0, count) of the algorithm that ran `gemm` fastest on `device` (the current device). Runs each
// candidate on random scratch operands on a private stream, so it neither touches the caller's tensors nor
// joins a stream capture in progress (captures here are relaxed: Graph::capture). A candidate that fails to
// run (or, with same_bits, gives other bits) is skipped; 0 (the heuristic's first choice) when no scratch
// memory can be had.
int fastest_algo(cublasLtHandle_t handle, const TunedGemm& gemm, const cublasLtMatmulAlgo_t* candidates, int count,
                 int device);

// How many times fastest_algo has timed candidates in this process (all devices): what tests watch.
int64_t gemm_tuning_runs();

// Drops every cached matmul plan of `device` (matmul.cu), so that tests can plan one shape again under other
// settings. The next call of each shape plans (and, where worth it, times) anew.
void clear_matmul_plans(int device);

}  // namespace microllm::cuda_kernels

// Everything the backends read from the environment (internal header), read and validated in environment.cpp
// only: a value it does not understand is a ValueError naming the variable, never ignored. backend_for checks
// every variable at its first call, so a mistake shows at the first op whichever paths the run takes.
//
// MICROLLM_DISABLE=<path>[,<path>...] turns optimized paths off, each falling back to the path under it: the A/B
// switches that time or check a path against the one it replaced (docs/CUDA.md, "Switches"). Names are separated
// by commas (spaces around them and empty entries are allowed; unset or empty: nothing turned off). A path's
// programmatic setter (set_decode_gemv, ...) overrides the environment, process-wide.
#pragma once

#include <cstdint>
#include <string_view>

// The paths: X(enumerator, name, the variable the name replaced, what it turns off).
#define MICROLLM_DISABLE_PATHS(X)                                                                               \
  X(gemv, "gemv", "MICROLLM_GEMV",                                                                              \
    "the decode GEMV with RMSNorm / SwiGLU folded in (gemv.cu): cuBLASLt and the separate kernels run instead") \
  X(gemm_tuning, "gemm-tuning", "MICROLLM_GEMM_TUNING",                                                         \
    "timing cuBLASLt's candidate algorithms (gemm_tuning.cu): the heuristic's first choice runs instead")       \
  X(swiglu_gemm, "swiglu-gemm", "MICROLLM_SWIGLU_GEMM",                                                         \
    "the Hopper GEMM with SwiGLU in its epilogue (gemm_swiglu_sm90.cu): cuBLASLt, then the swiglu kernel")      \
  X(flash_wgmma, "flash-wgmma", "MICROLLM_FLASH_WGMMA",                                                         \
    "the Hopper flash attention forward (attention_flash_fwd_sm90.cu): the mma.sync kernel runs instead")       \
  X(fast_attention, "fast-attention", "MICROLLM_CUDA_ATTENTION",                                                \
    "the decode and flash attention kernels (attention.cu): the reference kernels run every attention")         \
  X(pdl, "pdl", "MICROLLM_PDL",                                                                                 \
    "chained launches (programmatic dependent launch, common.cuh): every launch waits in stream order")         \
  X(attention_o, "attention-o", "MICROLLM_ATTENTION_O",                                                         \
    "the o projection inside the paged decode attention's kernel (paged_attention.cu): its own GEMV after it")  \
  X(attention_cluster, "attention-cluster", "MICROLLM_ATTENTION_CLUSTER",                                       \
    "a token's attention in one cluster past one split (the plan's token_cluster): head clusters or the splits")    \
  X(attention_head_cluster, "attention-head-cluster", "MICROLLM_ATTENTION_HEAD_CLUSTER",                        \
    "a kv head's slices a cluster (the plan's head_clusters): the splits and their projected merge")

namespace microllm::detail {

enum class FastPath : int {
#define MICROLLM_FAST_PATH_ENUM(id, name, replaced, turns_off) id,
  MICROLLM_DISABLE_PATHS(MICROLLM_FAST_PATH_ENUM)
#undef MICROLLM_FAST_PATH_ENUM
};

// A set of paths: bit path_bit(p) for each.
using FastPathSet = uint32_t;
constexpr FastPathSet path_bit(FastPath path) { return FastPathSet{1} << static_cast<int>(path); }

// The path's name in MICROLLM_DISABLE ("gemv", ...).
const char* path_name(FastPath path);

// The paths a MICROLLM_DISABLE value names; ValueError naming an unknown name and listing the known ones.
FastPathSet parse_disabled_paths(std::string_view value);

// Whether MICROLLM_DISABLE turns `path` off (the variable is read once, at the first call). Setting a variable
// a name replaced (MICROLLM_GEMV, ...) is a ValueError that names its replacement.
bool path_disabled(FastPath path);

// Settings that are not A/B switches, each its own variable:
// MICROLLM_DETERMINISTIC: "1" (unset) or "0": whether deterministic_algorithms() starts on (a mode of the run).
bool deterministic_from_environment();
// MICROLLM_ATTENTION_O_REPLICAS=R: the fused o projection's clusters a token, forced to R in
// [1, kMaxAttentionOReplicas] (tests and sweeps pin it); unset: 0, the launch policy chooses.
constexpr int kMaxAttentionOReplicas = 8;
int attention_o_replicas_from_environment();

// Reads and checks every variable above (backend_for's first call); ValueError on the first mistake.
void check_environment();

// The helpers every variable is read through. Unset or "1": true; "0": false; anything else: ValueError naming
// the variable.
bool switch_from_environment(const char* name);
// Unset: 0; else a whole number in [lo, hi] (lo >= 1); anything else: ValueError naming the variable and range.
int count_from_environment(const char* name, int lo, int hi);

}  // namespace microllm::detail

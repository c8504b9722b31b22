// Parameters that ops pass to kernels. Each list below is the one place its names are declared.
#pragma once

#include <cstdint>
#include <vector>

#include "microllm/core/tensor.h"

namespace microllm {

// X(name): elementwise functions of one input; `alpha` is the scalar of scale.
#define MICROLLM_UNARY_OPS(X) \
  X(neg) X(exp) X(log) X(sqrt) X(rsqrt) X(sigmoid) X(silu) X(gelu) X(gelu_tanh) X(tanh) X(scale) X(square)

enum class UnaryOp : uint8_t {
#define MICROLLM_ENUM_ENTRY(name) name,
  MICROLLM_UNARY_OPS(MICROLLM_ENUM_ENTRY)
#undef MICROLLM_ENUM_ENTRY
};
const char* unary_op_name(UnaryOp op);

// Arithmetic keeps the input dtype; comparisons return u8 (1 true, 0 false).
#define MICROLLM_BINARY_OPS(X) X(add) X(sub) X(mul) X(div) X(maximum) X(minimum) X(eq) X(ne) X(lt) X(le) X(gt) X(ge)

enum class BinaryOp : uint8_t {
#define MICROLLM_ENUM_ENTRY(name) name,
  MICROLLM_BINARY_OPS(MICROLLM_ENUM_ENTRY)
#undef MICROLLM_ENUM_ENTRY
};
const char* binary_op_name(BinaryOp op);
inline bool is_comparison(BinaryOp op) { return op >= BinaryOp::eq; }

#define MICROLLM_REDUCE_OPS(X) X(sum) X(mean) X(max) X(min)

enum class ReduceOp : uint8_t {
#define MICROLLM_ENUM_ENTRY(name) name,
  MICROLLM_REDUCE_OPS(MICROLLM_ENUM_ENTRY)
#undef MICROLLM_ENUM_ENTRY
};
const char* reduce_op_name(ReduceOp op);

// Which pairs of a head's dims rotate together.
enum class RopeLayout : uint8_t {
  split_half,   // (i, i + D/2): Hugging Face's rotate_half (Llama, Qwen, Mistral)
  interleaved,  // (2i, 2i + 1): GPT-J, the original RoFormer, Meta's reference Llama
};

// dynamic (transformers' dynamic NTK) keeps the default frequencies up to original_max_position_embeddings, where
// transformers starts to stretch every position's: the context stops there (TransformerConfig::context_limit).
enum class RopeScalingType : uint8_t { none, linear, llama3, yarn, longrope, dynamic };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;            // linear, llama3, yarn; longrope: max_position_embeddings / original
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, yarn, longrope, dynamic
  double beta_fast = 32.0;                          // yarn: the ramp between extrapolated and interpolated frequencies
  double beta_slow = 1.0;
  // yarn, longrope: transformers scales cos and sin by it; here the attention's scale takes its square
  // (rope_attention_factor), the rotation stays a rotation. 0: the default from factor.
  double attention_factor = 0.0;
  std::vector<double> frequency_factors = {};  // longrope: frequency i divided by factor i (short_factor), D/2 of them
  // longrope's long_factor, kept to be written back: past original_max_position_embeddings transformers turns
  // every position by these instead, which a KV cache cannot follow; those contexts are refused
  // (TransformerConfig::context_limit).
  std::vector<double> long_factors = {};
};

struct RopeParams {
  double theta = 10000.0;  // rope_theta
  RopeLayout layout = RopeLayout::split_half;
  RopeScaling scaling;
};

// QK-norm (Qwen3, Gemma 3) folded into an attention op: each head of q and of k RMS-normalized over its D elements by
// the weight of its kind ([D]) before the rotary embedding, as ops/qk_norm.h's qk_rms_norm does it (its bits).
// Undefined weights: no QK-norm.
struct QkNormParams {
  Tensor q_weight, k_weight;
  double eps = 0;
  bool defined() const { return q_weight.defined(); }
};

struct AttentionParams {
  bool causal = true;
  double scale = 0;      // 0 means 1 / sqrt(head_dim)
  int64_t q_offset = 0;  // absolute position of query row 0 (keys 0..S-1): q_offset = S - T with a KV cache
  // Sliding window (causal only): the query at position p sees keys p - window + 1 .. p, `window` keys with
  // itself, as transformers' sliding_window; 0: every earlier key.
  int64_t window = 0;
  // The first key query row i may see.
  int64_t key_begin(int64_t i) const { return window > 0 && q_offset + i >= window ? q_offset + i - window + 1 : 0; }
};

}  // namespace microllm

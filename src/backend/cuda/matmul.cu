// CUDA matmul through cuBLASLt. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
// cuBLASLt's "A" is our b and its "B" our a; a matrix with a unit stride in either of its two dims is
// read in place (the other layout is the same matrix transposed: flip the op), any other operand is
// made contiguous first. Batch dims collapse into one strided batch where their strides allow and loop
// on the host where not. bf16/f16 accumulate in f32, f32 in f32 (TF32 only with set_allow_tf32), f64 in
// f64. Plans (descriptors, layouts, the algorithm) are cached per problem; a problem that cuBLASLt refuses
// runs a plain fallback kernel instead. The algorithm is the heuristic's first choice, except for large
// bf16/f16 problems, which time the heuristic's first kTuningCandidates once and keep the fastest
// (gemm_tuning.h; under deterministic_algorithms(), the fastest of those that give the first's bits). An addend
// (linear_add) is C with beta = 1. Linear layers of decode size (m <= 8 rows, bf16/f16) run the GEMV of gemv.cu
// instead of cuBLASLt.
#include <array>
#include <climits>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common.cuh"
#include "cublaslt.h"
#include "cuda_backend.h"
#include "gemm_tuning.h"
#include "gemv.h"
#include "op_scope.h"

namespace microllm {
namespace cuda_kernels {
namespace {

// ---- kernels for what cuBLASLt does not do ----

// out [rows, n] contiguous = bias[j] (or 0) + addend[i] (or 0): the product of an empty sum (K = 0).
template <typename T>
__global__ void fill_rows(T* __restrict__ out, const T* __restrict__ bias, int64_t bias_stride,
                          const T* __restrict__ addend, int64_t n, int64_t total) {
  MICROLLM_GRID_STRIDE_LOOP(i, total) {
    acc_t<T> v = bias ? to_acc(bias[(i % n) * bias_stride]) : acc_t<T>(0);
    if (addend) v += to_acc(addend[i]);
    out[i] = from_acc<T>(v);
  }
}

// out [rows, n] contiguous += bias[j], when the bias could not ride in cuBLASLt's epilogue.
template <typename T>
__global__ void add_bias_rows(T* __restrict__ out, const T* __restrict__ bias, int64_t bias_stride, int64_t n,
                              int64_t total) {
  MICROLLM_GRID_STRIDE_LOOP(i, total) { out[i] = from_acc<T>(to_acc(out[i]) + to_acc(bias[(i % n) * bias_stride])); }
}

// Everything a plain strided GEMM needs: op(a)[i, p] = a[i * a_i + p * a_p], op(b)[p, j] = b[p * b_p + j * b_j].
struct FallbackMeta {
  int64_t m, n, k;
  int64_t a_i, a_p, b_p, b_j;
  int batch_rank;
  int64_t batch_shape[kMaxDims];
  int64_t a_batch[kMaxDims], b_batch[kMaxDims];
};

// One thread per output element, an f32 (f64) dot product over k. Only for problems cuBLASLt refuses.
template <typename T>
__global__ void matmul_fallback(const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ bias,
                                int64_t bias_stride, const T* __restrict__ addend, T* __restrict__ out,
                                FallbackMeta meta, int64_t total) {
  MICROLLM_GRID_STRIDE_LOOP(idx, total) {
    const int64_t j = idx % meta.n, i = (idx / meta.n) % meta.m;
    int64_t batch = idx / (meta.m * meta.n), a_off = 0, b_off = 0;
    for (int d = meta.batch_rank - 1; d >= 0; --d) {
      const int64_t pos = batch % meta.batch_shape[d];
      batch /= meta.batch_shape[d];
      a_off += pos * meta.a_batch[d];
      b_off += pos * meta.b_batch[d];
    }
    const T* a_row = a + a_off + i * meta.a_i;
    const T* b_col = b + b_off + j * meta.b_j;
    acc_t<T> acc = 0;
    for (int64_t p = 0; p < meta.k; ++p) acc += to_acc(a_row[p * meta.a_p]) * to_acc(b_col[p * meta.b_p]);
    if (bias) acc += to_acc(bias[j * bias_stride]);
    if (addend) acc += to_acc(addend[idx]);  // out and addend: contiguous, the same shape
    out[idx] = from_acc<T>(acc);
  }
}

// ---- operands as cuBLASLt sees them ----

// A stored column-major matrix [rows, cols] with leading dimension ld, and the op cuBLASLt applies to it.
struct LtOperand {
  cublasOperation_t op;
  int64_t rows, cols, ld;
};

// The matrix x [r, c] (strides s0, s1) enters the C^T product as op(x)^T, t being the user's transpose
// flag. A row-major x is stored as the column-major x^T, a column-major x as x itself; the op turns what is
// stored into what is needed. False when neither dim has the unit stride (the caller packs x first).
bool lt_operand(int64_t r, int64_t c, int64_t s0, int64_t s1, bool t, LtOperand* out) {
  const int64_t max_r = std::max<int64_t>(r, 1), max_c = std::max<int64_t>(c, 1);
  if ((s1 == 1 || c == 1) && (r == 1 || s0 >= max_c)) {  // stored: x^T [c, r]; needed x^T (N) or x (T)
    *out = {t ? CUBLAS_OP_T : CUBLAS_OP_N, c, r, r == 1 ? max_c : s0};
    return true;
  }
  if ((s0 == 1 || r == 1) && (c == 1 || s1 >= max_r)) {  // stored: x [r, c]; needed x^T (T) or x (N)
    *out = {t ? CUBLAS_OP_N : CUBLAS_OP_T, r, c, c == 1 ? max_r : s1};
    return true;
  }
  return false;
}

// The largest power of two, at most 256, dividing the address and every byte stride (0 divides nothing).
uint32_t alignment_of(const void* ptr, std::initializer_list<int64_t> byte_strides) {
  uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | 256u;
  for (int64_t s : byte_strides) bits |= static_cast<uint64_t>(s < 0 ? -s : s);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// ---- cached plans ----

struct PlanKey {
  int64_t m, n, k;  // cuBLASLt's: m = our n, n = our m
  int64_t rows_a, cols_a, ld_a, rows_b, cols_b, ld_b;
  int32_t op_a, op_b;
  int64_t batch, stride_a, stride_b, stride_c;
  DType dtype;
  bool tf32, bias;
  uint32_t align_a, align_b, align_c, align_bias;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    for (int64_t v : {key.m, key.n, key.k, key.rows_a, key.cols_a, key.ld_a, key.rows_b, key.cols_b, key.ld_b,
                      key.batch, key.stride_a, key.stride_b, key.stride_c})
      mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(key.op_a) << 8 | static_cast<uint64_t>(key.op_b));
    mix(static_cast<uint64_t>(key.dtype) << 2 | (key.tf32 ? 2u : 0u) | (key.bias ? 1u : 0u));
    mix(static_cast<uint64_t>(key.align_a) << 48 | static_cast<uint64_t>(key.align_b) << 32 |
        static_cast<uint64_t>(key.align_c) << 16 | key.align_bias);
    return static_cast<size_t>(h);
  }
};

constexpr int kTuningCandidates = 8;  // the heuristic's first answers a plan worth_tuning times
constexpr double kMinTunedFlops = 1e9;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // c is also D's layout
  cublasLtMatmulAlgo_t algo{};
  // The heuristic's answers, timed at the plan's first use when there is more than one (a problem worth_tuning).
  std::array<cublasLtMatmulAlgo_t, kTuningCandidates> candidates{};
  int untimed = 0;  // candidates[0, untimed) wait to be timed: 0 once timed, or when there was no choice
  bool has_algo = false;       // false: cuBLASLt offers no algorithm, the fallback kernel runs
  bool bias_epilogue = false;  // the bias is added in cuBLASLt's epilogue (else by add_bias_rows)

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

// Plans of one device. The mutex also covers each use of a plan: setting the bias pointer on the shared
// descriptor and enqueueing the GEMM happen under it.
struct PlanCache {
  std::mutex mutex;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
};
constexpr size_t kMaxPlans = 4096;  // a generation loop makes one shape per cache length; start over then

PlanCache& plan_cache(int device) {
  constexpr int kMaxDevices = 64;
  static auto* caches = new std::array<PlanCache, kMaxDevices>();  // leaked: outlives every op
  MICROLLM_CHECK(device >= 0 && device < kMaxDevices, DeviceError, "matmul", "device index ", device, " out of range");
  return (*caches)[static_cast<size_t>(device)];
}

}  // namespace

void clear_matmul_plans(int device) {
  PlanCache& cache = plan_cache(device);
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.plans.clear();
}

namespace {

cudaDataType_t cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: no_kernel("matmul", dtype);
  }
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  MICROLLM_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const auto count = static_cast<int32_t>(batch);
    MICROLLM_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    MICROLLM_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return layout;
}

// Problems that time the heuristic's candidates (gemm_tuning.h): half precision (the models' GEMMs), one
// matrix (a strided batch would need scratch for every entry), and at least kMinTunedFlops, where a few percent
// outweigh the one-time cost of timing (~a millisecond a candidate at the largest shapes).
bool worth_tuning(const PlanKey& key) {
  return gemm_tuning() && (key.dtype == DType::bf16 || key.dtype == DType::f16) && key.batch == 1 &&
         2.0 * static_cast<double>(key.m) * static_cast<double>(key.n) * static_cast<double>(key.k) >= kMinTunedFlops;
}

// Asks the heuristic for up to `count` algorithms (plan.candidates, the first in plan.algo); false when cuBLASLt
// supports none for this problem.
bool find_algo(cublasLtHandle_t handle, Plan& plan, const PlanKey& key, int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  MICROLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const uint64_t workspace = kCublasLtWorkspaceBytes;
  MICROLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                             sizeof(workspace)));
  const uint32_t aligns[4] = {key.align_a, key.align_b, key.align_c, key.align_c};
  const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    MICROLLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &aligns[i], sizeof(uint32_t)));
  }
  std::array<cublasLtMatmulHeuristicResult_t, kTuningCandidates> results{};
  count = std::min(count, kTuningCandidates);
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref,
                                                               count, results.data(), &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  MICROLLM_CUBLAS_CHECK(status);
  int usable = 0;
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan.candidates[usable++] = results[i].algo;
  }
  if (usable == 0) return false;
  plan.algo = plan.candidates[0];
  plan.untimed = usable > 1 ? usable : 0;
  return true;
}

std::unique_ptr<Plan> make_plan(cublasLtHandle_t handle, const PlanKey& key, const void* bias_ptr) {
  auto plan = std::make_unique<Plan>();
  const int candidates = worth_tuning(key) ? kTuningCandidates : 1;
  const cudaDataType_t type = cuda_data_type(key.dtype);
  const bool f64 = key.dtype == DType::f64;
  const cublasComputeType_t compute =
      f64 ? CUBLAS_COMPUTE_64F : (key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  MICROLLM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, f64 ? CUDA_R_64F : CUDA_R_32F));
  const auto op_a = static_cast<cublasOperation_t>(key.op_a), op_b = static_cast<cublasOperation_t>(key.op_b);
  MICROLLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  MICROLLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  plan->a = make_layout(type, key.rows_a, key.cols_a, key.ld_a, key.batch, key.stride_a);
  plan->b = make_layout(type, key.rows_b, key.cols_b, key.ld_b, key.batch, key.stride_b);
  plan->c = make_layout(type, key.m, key.n, key.m, key.batch, key.stride_c);
  if (key.bias) {
    // The bias runs along D's rows (our columns); its dtype is D's. The heuristic reads the pointer's
    // alignment, so the real one goes in now (and again at each use).
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const auto bias_type = static_cast<int32_t>(type);
    MICROLLM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    MICROLLM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    MICROLLM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)));
    if (find_algo(handle, *plan, key, candidates)) {
      plan->has_algo = plan->bias_epilogue = true;
      return plan;
    }
    // No algorithm with the epilogue (f64, say): plain GEMM, then add_bias_rows.
    const cublasLtEpilogue_t none = CUBLASLT_EPILOGUE_DEFAULT;
    MICROLLM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &none, sizeof(none)));
  }
  plan->has_algo = find_algo(handle, *plan, key, candidates);
  return plan;
}

// Batch dims (size-1 dims dropped), innermost last, with the strides of a, b and out.
struct BatchDims {
  int rank = 0;
  int64_t size[kMaxDims], a[kMaxDims], b[kMaxDims], c[kMaxDims];
};

template <typename T>
void launch_fallback(const Tensor& a, const Tensor& b, bool ta, bool tb, const T* bias, int64_t bias_stride,
                     const T* addend, const Tensor& out, cudaStream_t stream) {
  FallbackMeta meta{};
  meta.m = out.size(-2);
  meta.n = out.size(-1);
  meta.k = ta ? a.size(-2) : a.size(-1);
  meta.a_i = ta ? a.stride(-1) : a.stride(-2);
  meta.a_p = ta ? a.stride(-2) : a.stride(-1);
  meta.b_p = tb ? b.stride(-1) : b.stride(-2);
  meta.b_j = tb ? b.stride(-2) : b.stride(-1);
  meta.batch_rank = out.dim() - 2;
  for (int d = 0; d < meta.batch_rank; ++d) {
    meta.batch_shape[d] = out.size(d);
    meta.a_batch[d] = a.stride(d);
    meta.b_batch[d] = b.stride(d);
  }
  const int64_t total = out.numel();
  matmul_fallback<T><<<grid_for(total), kThreads, 0, stream>>>(static_cast<const T*>(a.data_ptr()),
                                                               static_cast<const T*>(b.data_ptr()), bias, bias_stride,
                                                               addend, static_cast<T*>(out.data_ptr()), meta, total);
  MICROLLM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void run_matmul(const Tensor& a_in, const Tensor& b_in, bool ta, bool tb, const Tensor& bias, const Tensor& addend,
                const Tensor& out, const Launch& launch) {
  const int64_t m = out.size(-2), n = out.size(-1);
  const int64_t k = ta ? a_in.size(-2) : a_in.size(-1);
  if (out.numel() == 0) return;  // m, n or a batch dim is 0: nothing to write
  MICROLLM_CHECK(out.is_contiguous(), ValueError, "matmul", "the output must be contiguous, got strides ",
                 out.strides());
  MICROLLM_CHECK(m < INT_MAX && n < INT_MAX && k < INT_MAX, ShapeError, "matmul", "dims ", m, "x", k, "x", n,
                 " exceed the cuBLASLt int range");
  MICROLLM_CHECK(!addend.defined() || (addend.is_contiguous() && addend.shape() == out.shape()), ValueError, "matmul",
                 "the addend must be contiguous in the output's shape ", out.shape(), ", got ", addend.shape(),
                 " strides ", addend.strides());
  const T* bias_data = bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr;
  const int64_t bias_stride = bias.defined() ? bias.stride(0) : 0;
  const T* addend_data = addend.defined() ? static_cast<const T*>(addend.data_ptr()) : nullptr;
  if (k == 0) {  // an empty sum: zeros, plus the bias and the addend
    fill_rows<T><<<grid_for(out.numel()), kThreads, 0, launch.stream>>>(static_cast<T*>(out.data_ptr()), bias_data,
                                                                        bias_stride, addend_data, n, out.numel());
    MICROLLM_CUDA_CHECK_LAUNCH();
    return;
  }
  // Decode-sized linear layers (m <= 8, bf16/f16): a weight-streaming kernel beats cuBLASLt there (gemv.cu).
  if (!ta && tb &&
      try_decode_gemv(a_in, b_in, bias_data, bias_stride, out, launch.stream, nullptr, GatedActivation::none, nullptr,
                      addend_data)) {
    return;
  }
  // Operands cuBLASLt can read in place; others become contiguous (a device copy on this stream).
  Tensor a = a_in, b = b_in;
  LtOperand lt_a{}, lt_b{};  // lt_a describes our b (cuBLASLt's A), lt_b our a
  if (!lt_operand(b.size(-2), b.size(-1), b.stride(-2), b.stride(-1), tb, &lt_a)) {
    b = b.contiguous();
    lt_operand(b.size(-2), b.size(-1), b.stride(-2), b.stride(-1), tb, &lt_a);
  }
  if (!lt_operand(a.size(-2), a.size(-1), a.stride(-2), a.stride(-1), ta, &lt_b)) {
    a = a.contiguous();
    lt_operand(a.size(-2), a.size(-1), a.stride(-2), a.stride(-1), ta, &lt_b);
  }

  // Batch dims: the innermost run whose strides chain in all three operands becomes cuBLASLt's strided
  // batch (stride 0 chains too: a broadcast operand); the dims outside it loop here.
  BatchDims dims;
  for (int d = 0; d + 2 < out.dim(); ++d) {
    if (out.size(d) == 1) continue;
    dims.size[dims.rank] = out.size(d);
    dims.a[dims.rank] = a.stride(d);
    dims.b[dims.rank] = b.stride(d);
    dims.c[dims.rank] = out.stride(d);
    ++dims.rank;
  }
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  int inner = dims.rank;  // dims [inner, rank) form the strided batch
  if (dims.rank > 0) {
    inner = dims.rank - 1;
    batch = dims.size[inner];
    stride_a = dims.a[inner];
    stride_b = dims.b[inner];
    stride_c = dims.c[inner];
    while (inner > 0 && dims.a[inner - 1] == stride_a * batch && dims.b[inner - 1] == stride_b * batch &&
           dims.c[inner - 1] == stride_c * batch) {
      --inner;
      batch *= dims.size[inner];
    }
  }
  MICROLLM_CHECK(batch < INT_MAX, ShapeError, "matmul", "batch of ", batch, " exceeds the cuBLASLt int range");
  int64_t outer = 1;
  for (int d = 0; d < inner; ++d) outer *= dims.size[d];

  Tensor bias_c = bias;
  if (bias.defined() && bias.stride(0) != 1 && n > 1) bias_c = bias.contiguous();
  const void* bias_ptr = bias_c.defined() ? bias_c.data_ptr() : nullptr;

  const int64_t es = static_cast<int64_t>(sizeof(T));
  PlanKey key{};
  key.m = n;
  key.n = m;
  key.k = k;
  key.rows_a = lt_a.rows;
  key.cols_a = lt_a.cols;
  key.ld_a = lt_a.ld;
  key.rows_b = lt_b.rows;
  key.cols_b = lt_b.cols;
  key.ld_b = lt_b.ld;
  key.op_a = lt_a.op;
  key.op_b = lt_b.op;
  key.batch = batch;
  key.stride_a = batch > 1 ? stride_b : 0;  // cuBLASLt's A is our b
  key.stride_b = batch > 1 ? stride_a : 0;
  key.stride_c = batch > 1 ? stride_c : 0;
  key.dtype = out.dtype();
  key.tf32 = out.dtype() == DType::f32 && allow_tf32();
  key.bias = bias_ptr != nullptr;
  // Alignment must hold at every batch entry, the looped ones included.
  auto outer_byte_strides = [&](const int64_t* strides) {
    int64_t bits = 0;
    for (int d = 0; d < inner; ++d) bits |= strides[d] * es;
    return bits;
  };
  key.align_a = alignment_of(b.data_ptr(), {key.stride_a * es, outer_byte_strides(dims.b)});
  key.align_b = alignment_of(a.data_ptr(), {key.stride_b * es, outer_byte_strides(dims.a)});
  // C (the addend, read at out's offsets) and D (out).
  key.align_c = alignment_of(out.data_ptr(), {key.stride_c * es, outer_byte_strides(dims.c)});
  if (addend_data) {
    key.align_c = std::min(key.align_c, alignment_of(addend_data, {key.stride_c * es, outer_byte_strides(dims.c)}));
  }
  key.align_bias = bias_ptr ? alignment_of(bias_ptr, {}) : 0;

  const cublasLtHandle_t handle = cublaslt_handle(launch.device);
  const CublasLtWorkspace workspace = cublaslt_workspace(launch.device, launch.stream);
  PlanCache& cache = plan_cache(launch.device);
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto it = cache.plans.find(key);
  if (it == cache.plans.end()) {
    if (cache.plans.size() >= kMaxPlans) cache.plans.clear();
    it = cache.plans.emplace(key, make_plan(handle, key, bias_ptr)).first;
  }
  Plan& plan = *it->second;
  if (!plan.has_algo) {
    launch_fallback<T>(a, b, ta, tb, static_cast<const T*>(bias_ptr), 1, addend_data, out, launch.stream);
    return;
  }
  if (plan.bias_epilogue) {
    MICROLLM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)));
  }
  if (plan.untimed > 0) {  // the first use of a plan worth tuning: time its candidates, keep the fastest
    const TunedGemm gemm{plan.desc,
                         plan.a,
                         plan.b,
                         plan.c,
                         static_cast<size_t>(key.ld_a * key.cols_a * es),
                         static_cast<size_t>(key.ld_b * key.cols_b * es),
                         static_cast<size_t>(key.m * key.n * es),
                         key.dtype,
                         deterministic_algorithms()};
    plan.algo = plan.candidates[fastest_algo(handle, gemm, plan.candidates.data(), plan.untimed, launch.device)];
    plan.untimed = 0;
  }
  // beta = 1 reads C = the addend: D = A B (+ bias) + C in the epilogue, one rounding.
  const acc_t<T> alpha = 1, beta = addend_data ? 1 : 0;
  const T* a_base = static_cast<const T*>(a.data_ptr());
  const T* b_base = static_cast<const T*>(b.data_ptr());
  T* c_base = static_cast<T*>(out.data_ptr());
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rest = o, a_off = 0, b_off = 0, c_off = 0;
    for (int d = inner - 1; d >= 0; --d) {
      const int64_t i = rest % dims.size[d];
      rest /= dims.size[d];
      a_off += i * dims.a[d];
      b_off += i * dims.b[d];
      c_off += i * dims.c[d];
    }
    T* d_ptr = c_base + c_off;
    const T* c_ptr = addend_data ? addend_data + c_off : d_ptr;
    MICROLLM_CUBLAS_CHECK(cublasLtMatmul(handle, plan.desc, &alpha, b_base + b_off, plan.a, a_base + a_off, plan.b,
                                         &beta, c_ptr, plan.c, d_ptr, plan.c, &plan.algo, workspace.data,
                                         workspace.bytes, launch.stream));
  }
  if (bias_ptr && !plan.bias_epilogue) {  // after the addend: a second rounding, where no epilogue takes the bias
    add_bias_rows<T><<<grid_for(out.numel()), kThreads, 0, launch.stream>>>(
        static_cast<T*>(out.data_ptr()), static_cast<const T*>(bias_ptr), 1, n, out.numel());
    MICROLLM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace
}  // namespace cuda_kernels

using namespace cuda_kernels;

void CudaBackend::matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, const Tensor& bias,
                         const Tensor& addend, const Tensor& out) {
  OpScope scope("matmul", device_, detail::current_cuda_stream(device_));
  Launch launch(out);
  visit_float(out.dtype(), "matmul",
              [&]<typename T>() { run_matmul<T>(a, b, transpose_a, transpose_b, bias, addend, out, launch); });
}

}  // namespace microllm

// A design question answered by measurement: does cuBLASLt's first heuristic answer leave speed on the table
// for the prefill and training GEMMs of our models, and what does adding the residual in the GEMM's epilogue
// (beta = 1, C = the residual stream) cost next to a plain product?
//   build/cuda-release/benchmarks/cublaslt_algos_bench [--algos N] [--reps N] [--exhaustive]
// For each linear layer shape (row-major out [T, N] = x [T, K] @ w [N, K]^T, bf16 in and out, f32
// accumulation: src/backend/cuda/matmul.cu's call) it asks the heuristic for up to N algorithms and times each
// (CUDA events, median of --reps after 3 warm-ups; the operands are random), then the heuristic's first answer
// with beta = 1. One line per measurement, then a summary line per shape: the first answer, the best, the ratio.
// --exhaustive also configures every algorithm cuBLASLt has for the types (cublasLtMatmulAlgoGetIds) with each
// tile, stage count, cluster shape and CTA swizzle its check accepts, screens them (3 runs each), times the
// fastest 8 again and prints them against the heuristic's best: what a wider search than the heuristic's answers
// would find.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(s));
}

struct Shape {
  const char* model;
  const char* layer;
  int64_t t, n, k;
};

// Random bf16 in [-1, 1) on the device.
__nv_bfloat16* random_device(int64_t count, uint32_t seed) {
  std::vector<__nv_bfloat16> host(static_cast<size_t>(count));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (auto& v : host) v = __float2bfloat16(dist(rng));
  __nv_bfloat16* dev = nullptr;
  check(cudaMalloc(&dev, count * sizeof(__nv_bfloat16)), "cudaMalloc");
  check(cudaMemcpy(dev, host.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice), "cudaMemcpy");
  return dev;
}

int g_reps = 20;
bool g_exhaustive = false;

template <typename Fn>
float median_ms(Fn&& fn, cudaStream_t stream, int reps = g_reps) {
  cudaEvent_t start, end;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&end), "event");
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(start, stream), "record");
    fn();
    check(cudaEventRecord(end, stream), "record");
    check(cudaEventSynchronize(end), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, end), "elapsed");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Config {
  cublasLtMatmulAlgo_t algo;
  int id, tile, stages, cluster, swizzle;
  float ms;
};

// Every configuration of every algorithm id that cublasLtMatmulAlgoCheck accepts for these descriptors, with a
// workspace of at most workspace_bytes.
std::vector<Config> all_configs(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, size_t workspace_bytes) {
  std::vector<Config> configs;
  int ids[256], n_ids = 0;
  check(cublasLtMatmulAlgoGetIds(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF,
                                 CUDA_R_16BF, 256, ids, &n_ids),
        "algo ids");
  for (int i = 0; i < n_ids; ++i) {
    cublasLtMatmulAlgo_t base;
    if (cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF,
                               CUDA_R_16BF, ids[i], &base) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    size_t written = 0;
    std::vector<uint32_t> tiles(CUBLASLT_MATMUL_TILE_END), stages(CUBLASLT_MATMUL_STAGES_END);
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), tiles.size() * 4, &written);
    tiles.resize(written / 4);
    if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_STAGES_IDS, stages.data(), stages.size() * 4, &written);
    stages.resize(written / 4);
    if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
    int swizzle_support = 0;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swizzle_support,
                                      sizeof(swizzle_support), &written);
    for (uint32_t tile : tiles) {
      for (uint32_t stage : stages) {
        for (int cluster = 0; cluster < CUBLASLT_CLUSTER_SHAPE_END; ++cluster) {
          for (int swizzle = 0; swizzle <= swizzle_support; ++swizzle) {
            cublasLtMatmulAlgo_t algo = base;
            const uint16_t cluster_id = static_cast<uint16_t>(cluster);  // the attribute is 16 bits wide
            const uint32_t swizzle_id = static_cast<uint32_t>(swizzle);
            if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile)) ||
                cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage, sizeof(stage)) ||
                cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster_id,
                                                     sizeof(cluster_id)) ||
                cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle_id,
                                                     sizeof(swizzle_id))) {
              continue;
            }
            cublasLtMatmulHeuristicResult_t result{};
            if (cublasLtMatmulAlgoCheck(handle, desc, la, lb, lc, lc, &algo, &result) != CUBLAS_STATUS_SUCCESS ||
                result.workspaceSize > workspace_bytes) {
              continue;
            }
            configs.push_back({algo, ids[i], static_cast<int>(tile), static_cast<int>(stage), cluster, swizzle, 0.f});
          }
        }
      }
    }
  }
  return configs;
}

}  // namespace

int main(int argc, char** argv) {
  int max_algos = 16;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--algos") && i + 1 < argc)
      max_algos = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      g_reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--exhaustive"))
      g_exhaustive = true;
  }
  const Shape shapes[] = {
      {"r1-1.5b", "qkv", 2048, 2048, 1536},         {"r1-1.5b", "o", 2048, 1536, 1536},
      {"r1-1.5b", "gate_up", 2048, 17920, 1536},    {"r1-1.5b", "down", 2048, 1536, 8960},
      {"qwen2.5-0.5b", "qkv", 2048, 1152, 896},     {"qwen2.5-0.5b", "o", 2048, 896, 896},
      {"qwen2.5-0.5b", "gate_up", 2048, 9728, 896}, {"qwen2.5-0.5b", "down", 2048, 896, 4864},
      {"qwen2.5-0.5b", "gate_up", 8192, 9728, 896}, {"qwen2.5-0.5b", "down", 8192, 896, 4864},
  };
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("# cublaslt_algos_bench on %s, %d SMs; median of %d\n", prop.name, prop.multiProcessorCount, g_reps);
  cublasLtHandle_t handle;
  check(cublasLtCreate(&handle), "cublasLtCreate");
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "stream");
  const size_t workspace_bytes = size_t{32} << 20;  // cublaslt.h's kCublasLtWorkspaceBytes
  void* workspace = nullptr;
  check(cudaMalloc(&workspace, workspace_bytes), "workspace");

  for (const Shape& s : shapes) {
    __nv_bfloat16* x = random_device(s.t * s.k, 1);
    __nv_bfloat16* w = random_device(s.n * s.k, 2);
    __nv_bfloat16* residual = random_device(s.t * s.n, 3);
    __nv_bfloat16* out = nullptr;
    check(cudaMalloc(&out, s.t * s.n * sizeof(__nv_bfloat16)), "cudaMalloc");
    // Column-major D [n, t] = op_T(w as [k, n]) x (x as [k, t]): matmul.cu's orientation.
    cublasLtMatmulDesc_t desc;
    check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)), "transa");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)), "transb");
    cublasLtMatrixLayout_t la, lb, lc;
    check(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k), "layout a");
    check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, s.t, s.k), "layout b");
    check(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s.n, s.t, s.n), "layout c");
    cublasLtMatmulPreference_t pref;
    check(cublasLtMatmulPreferenceCreate(&pref), "pref");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                               sizeof(workspace_bytes)),
          "pref workspace");
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max_algos));
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, max_algos, results.data(), &found),
          "heuristic");
    const double flops = 2.0 * s.t * s.n * s.k;
    float first = 0, best = 1e30f;
    int best_i = -1;
    for (int i = 0; i < found; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      const float alpha = 1, beta = 0;
      const float ms = median_ms(
          [&] {
            check(cublasLtMatmul(handle, desc, &alpha, w, la, x, lb, &beta, out, lc, out, lc, &results[i].algo,
                                 workspace, workspace_bytes, stream),
                  "matmul");
          },
          stream);
      std::printf("{\"model\": \"%s\", \"layer\": \"%s\", \"t\": %lld, \"algo\": %d, \"ms\": %.5f, \"tflops\": %.1f}\n",
                  s.model, s.layer, static_cast<long long>(s.t), i, ms, flops / ms / 1e9);
      if (i == 0) first = ms;
      if (ms < best) best = ms, best_i = i;
    }
    // The heuristic's first answer for D = x w^T + residual (beta = 1, C = the residual, D in place).
    float with_residual = 0;
    int found_c = 0;
    cublasLtMatmulHeuristicResult_t result_c{};
    check(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, 1, &result_c, &found_c), "heuristic");
    if (found_c > 0) {
      const float alpha = 1, beta = 1;
      with_residual = median_ms(
          [&] {
            check(cublasLtMatmul(handle, desc, &alpha, w, la, x, lb, &beta, residual, lc, residual, lc, &result_c.algo,
                                 workspace, workspace_bytes, stream),
                  "matmul beta 1");
          },
          stream);
    }
    std::printf(
        "## %s %s T%lld [n %lld, k %lld]: %d algos; first %.4f ms (%.0f TFLOP/s), best #%d %.4f ms "
        "(%.0f TFLOP/s, %.3fx); first with beta 1 (residual in place) %.4f ms\n",
        s.model, s.layer, static_cast<long long>(s.t), static_cast<long long>(s.n), static_cast<long long>(s.k), found,
        first, flops / first / 1e9, best_i, best, flops / best / 1e9, first / best, with_residual);
    std::fflush(stdout);
    if (g_exhaustive) {
      std::vector<Config> configs = all_configs(handle, desc, la, lb, lc, workspace_bytes);
      // At most kMaxScreened configurations, evenly spaced over the list, so a shape's screen stays in seconds.
      constexpr size_t kMaxScreened = 3000;
      if (configs.size() > kMaxScreened) {
        std::vector<Config> kept;
        for (size_t i = 0; i < kMaxScreened; ++i) kept.push_back(configs[i * configs.size() / kMaxScreened]);
        std::printf("   exhaustive: %zu configurations, %zu evenly spaced screened\n", configs.size(), kept.size());
        configs.swap(kept);
      }
      int failed = 0;
      for (Config& c : configs) {
        const float alpha = 1, beta = 0;
        bool ok = true;
        c.ms = median_ms(
            [&] {
              ok = ok && cublasLtMatmul(handle, desc, &alpha, w, la, x, lb, &beta, out, lc, out, lc, &c.algo, workspace,
                                        workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
            },
            stream, /*reps=*/3);  // a screen: the fastest are timed again with --reps
        if (!ok) c.ms = 1e30f, ++failed;
      }
      const size_t screened = configs.size();
      std::sort(configs.begin(), configs.end(), [](const Config& a, const Config& b) { return a.ms < b.ms; });
      if (configs.size() > 8) configs.resize(8);
      for (Config& c : configs) {
        const float alpha = 1, beta = 0;
        c.ms = median_ms(
            [&] {
              cublasLtMatmul(handle, desc, &alpha, w, la, x, lb, &beta, out, lc, out, lc, &c.algo, workspace,
                             workspace_bytes, stream);
            },
            stream);
      }
      std::sort(configs.begin(), configs.end(), [](const Config& a, const Config& b) { return a.ms < b.ms; });
      for (const Config& c : configs) {
        std::printf(
            "   exhaustive: id %d tile %d stages %d cluster %d swizzle %d: %.4f ms (%.0f TFLOP/s, %.3fx the "
            "heuristic's best)\n",
            c.id, c.tile, c.stages, c.cluster, c.swizzle, c.ms, flops / c.ms / 1e9, best / c.ms);
      }
      std::printf("   (%zu configurations screened, %d failed to run)\n", screened, failed);
      std::fflush(stdout);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(x);
    cudaFree(w);
    cudaFree(residual);
    cudaFree(out);
  }
  cudaFree(workspace);
  cublasLtDestroy(handle);
  return 0;
}

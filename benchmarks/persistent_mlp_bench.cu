// Should a decode layer be one persistent kernel? The MLP half of a batch-1 Qwen2.5-0.5B decode layer
// (o projection -> residual add + RMSNorm + gate_up + SwiGLU -> down) as ONE kernel: one CTA per SM, the three
// phases separated by grid barriers, each CTA streaming the next phase's first weight chunks into its ring as
// soon as its own part of a phase is done; against the same three products as the model runs them (the decode
// GEMV kernels, launches chained, in a CUDA graph). bf16, 24 layers' weights (670 MB, past L2) replayed in one
// graph. The persistent kernel reuses the GEMV's arithmetic (gemv.cu: cp.async ring of 16 chunks a lane,
// mma.m16n8k16, rows split over k inside a CTA) with its own work split; results are checked against the
// model's ops first (o and h bit-identical, act and out to bf16 rounding) and the program fails otherwise.
// Rows "barriers only" and "<phase> only" keep every barrier and staging and drop the other phases' products.
//   build/cuda-release/benchmarks/persistent_mlp_bench          (docs/perf/inference.md has the figures)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "backend/cuda/attention_mma.cuh"
#include "backend/elementwise_math.h"
#include "backend/cuda/common.cuh"
#include "microllm/core/cuda.h"
#include "microllm/core/random.h"
#include "microllm/microllm.h"

using namespace microllm;
using bfloat = __nv_bfloat16;

namespace {

void check(cudaError_t status, const char* what) {
  MICROLLM_CHECK(status == cudaSuccess, DeviceError, "persistent_mlp_bench", what, ": ", cudaGetErrorString(status));
}
#define CK(call) check((call), #call)

constexpr int kH = 896, kI = 4864, kLayers = 24;
constexpr int kThreads = 512, kWarps = 16, kSlots = 16, kChunk = 32;

struct LayerArgs {
  const bfloat* attn;      // [kH]
  const bfloat* residual;  // [kH]
  const bfloat* w_o;       // [kH, kH]
  const bfloat* ln2;       // [kH]
  const bfloat* w_gu;      // [2 kI, kH]
  const bfloat* w_down;    // [kH, kI]
  bfloat* o;               // [kH] scratch
  bfloat* h;               // [kH] out
  bfloat* act;             // [kI] scratch
  bfloat* out;             // [kH] out
  unsigned long long* barrier;
  float eps;
  int phases;  // bit 0: o, bit 1: gate_up, bit 2: down (the barriers always run)
};

using cuda_kernels::chain_next_grids;
using cuda_kernels::copy16_async;
using cuda_kernels::copy_async_commit;
using cuda_kernels::copy_async_wait_group;
using cuda_kernels::wait_for_prior_grids;
using cuda_kernels::attn::mma_16816;

// Every CTA of the grid (all resident: one per SM) arrives, then waits for the others. The 64-bit counter only
// grows (zeroed once): each barrier adds gridDim.x arrivals, so an arrival's own count tells which barrier it
// is in and where the counter stands when that barrier is complete.
__device__ void grid_barrier(unsigned long long* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long old = atomicAdd(counter, 1ull);
    const unsigned long long target = (old / gridDim.x + 1) * gridDim.x;
    unsigned long long v = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(counter) : "memory");
    } while (v < target);
  }
  __syncthreads();
}

// One GEMV phase: out groups of 8 rows over n, k; kStreams 2 = gate/up (SwiGLU). CTA c takes groups c, c + G,
// ...; its 16 warps split (stream, k slice). The ring's first kSlots items were fetched by prefetch().
template <int kStreams>
struct Phase {
  const bfloat* w;
  int n, k;      // output rows (per stream), input size
  int64_t up0;   // row offset of the up stream
  int slices, cps, c_begin, c_end, groups_mine;
  int stream;
  __device__ Phase(const bfloat* w_, int n_, int k_, int64_t up0_) : w(w_), n(n_), k(k_), up0(up0_) {
    const int warp = threadIdx.x / 32;
    slices = kWarps / kStreams;
    stream = warp / slices;
    const int chunks = k / kChunk;
    cps = (chunks + slices - 1) / slices;
    c_begin = min(chunks, (warp % slices) * cps);
    c_end = min(chunks, c_begin + cps);
    const int groups = (n + 7) / 8;
    groups_mine = blockIdx.x < groups ? (groups - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  }
  __device__ int len() const { return c_end - c_begin; }
  __device__ int items() const { return len() * groups_mine; }
  // Item j: group i = j / len, chunk c_begin + j % len.
  __device__ void fetch(uint4* ring, int j) const {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    if (j < items()) {
      const int i = j / len(), c = c_begin + j % len();
      const int64_t group = blockIdx.x + static_cast<int64_t>(i) * gridDim.x;
      const int64_t row = group * 8 + g + (stream == 1 ? up0 : 0);
      copy16_async</*kPrefetch256=*/true>(ring + (j % kSlots) * 32, w + row * k + c * kChunk + t * 8);
    }
    copy_async_commit();
  }
  __device__ void prefetch(uint4* ring) const {
    for (int j = 0; j < kSlots; ++j) fetch(ring, j);
  }
  // Runs the phase; x_s: the staged x [k] in shared memory; emit(col, acc[kStreams]) writes an output.
  template <typename Emit>
  __device__ void run(uint4* ring, const bfloat* x_s, float (*partial)[8], Emit emit) const {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int j = 0;
    for (int i = 0; i < groups_mine; ++i) {
      float d[4] = {0.f, 0.f, 0.f, 0.f}, e[4] = {0.f, 0.f, 0.f, 0.f};
      for (int c = c_begin; c < c_end; ++c, ++j) {
        copy_async_wait_group<kSlots - 1>();
        const uint4 wv = ring[(j % kSlots) * 32];
        const uint4 xv = g == 0 ? *reinterpret_cast<const uint4*>(x_s + c * kChunk + t * 8) : make_uint4(0, 0, 0, 0);
        const uint32_t a_lo[4] = {xv.x, 0u, xv.y, 0u}, a_hi[4] = {xv.z, 0u, xv.w, 0u};
        mma_16816<bfloat>(d, a_lo, wv.x, wv.y);
        mma_16816<bfloat>(e, a_hi, wv.z, wv.w);
        fetch(ring, j + kSlots);
      }
      if (g == 0) {
        partial[warp][2 * t] = d[0] + e[0];
        partial[warp][2 * t + 1] = d[1] + e[1];
      }
      __syncthreads();
      if (threadIdx.x < 8) {
        const int r = threadIdx.x;
        float acc[kStreams];
        for (int s = 0; s < kStreams; ++s) {
          acc[s] = 0.f;
          for (int sl = 0; sl < slices; ++sl) acc[s] += partial[s * slices + sl][r];
        }
        const int64_t col = (blockIdx.x + static_cast<int64_t>(i) * gridDim.x) * 8 + r;
        if (col < n) emit(col, acc);
      }
      __syncthreads();
    }
  }
};

__global__ void __launch_bounds__(kThreads, 1) mlp_persistent(const LayerArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float partial[kWarps][8];
  __shared__ float red[kWarps];
  uint4* ring = reinterpret_cast<uint4*>(smem) + (threadIdx.x / 32) * kSlots * 32 + threadIdx.x % 32;
  bfloat* xs = reinterpret_cast<bfloat*>(smem + kThreads * kSlots * 16);  // up to kI
  const Phase<1> po(a.w_o, kH, kH, 0);
  const Phase<2> pg(a.w_gu, kI, kH, kI);
  const Phase<1> pd(a.w_down, kH, kI, 0);

  const bool run_a = a.phases & 1, run_b = a.phases & 2, run_c = a.phases & 4;
  if (run_a) po.prefetch(ring);
  wait_for_prior_grids();
  // Phase A: o = attn @ w_o^T. Every x is read with __ldcg (from L2): other CTAs wrote it, and an SM's L1 may
  // hold the same buffer from the layer before.
  for (int i = threadIdx.x; i < kH / 8; i += kThreads)
    reinterpret_cast<uint4*>(xs)[i] = __ldcg(reinterpret_cast<const uint4*>(a.attn) + i);
  __syncthreads();
  if (run_a) po.run(ring, xs, partial, [&](int64_t col, const float (&acc)[1]) { a.o[col] = __float2bfloat16(acc[0]); });
  if (run_b) pg.prefetch(ring);
  grid_barrier(a.barrier);
  // Phase B: h = o + residual; x = rms_norm(h) * ln2; act = silu(gate) * up.
  float ss = 0.f;
  for (int i = threadIdx.x; i < kH; i += kThreads) {
    const float hv = __bfloat162float(__float2bfloat16(__bfloat162float(__ldcg(a.o + i)) + __bfloat162float(a.residual[i])));
    xs[i] = __float2bfloat16(hv);
    if (blockIdx.x == 0) a.h[i] = __float2bfloat16(hv);
    ss += hv * hv;
  }
  ss = cuda_kernels::warp_sum(ss);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kWarps; ++w) total += red[w];
  const float rstd = 1.0f / sqrtf(total / kH + a.eps);
  for (int i = threadIdx.x; i < kH; i += kThreads) {
    const float n = __bfloat162float(__float2bfloat16(__bfloat162float(xs[i]) * rstd));
    xs[i] = __float2bfloat16(__bfloat162float(a.ln2[i]) * n);
  }
  __syncthreads();
  if (run_b) pg.run(ring, xs, partial, [&](int64_t col, const float (&acc)[2]) {
    const float gate = __bfloat162float(__float2bfloat16(acc[0])), up = __bfloat162float(__float2bfloat16(acc[1]));
    a.act[col] = __float2bfloat16(gate * math::sigmoid(gate) * up);  // activation.cu's SwigluFn
  });
  if (run_c) pd.prefetch(ring);
  grid_barrier(a.barrier);
  // Phase C: out = act @ w_down^T.
  for (int i = threadIdx.x; i < kI / 8; i += kThreads)
    reinterpret_cast<uint4*>(xs)[i] = __ldcg(reinterpret_cast<const uint4*>(a.act) + i);
  __syncthreads();
  chain_next_grids();
  if (run_c) pd.run(ring, xs, partial, [&](int64_t col, const float (&acc)[1]) { a.out[col] = __float2bfloat16(acc[0]); });
  copy_async_wait_group<0>();
}

void run() {
  const Device gpu = Device::cuda(0);
  Generator gen(7);
  auto random_tensor = [&](const Shape& shape, DType dtype, Device device, double low, double high) {
    return Tensor::uniform(shape, gen, low, high, dtype, device);
  };
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<Tensor> w_o, w_gu, w_down, ln2;
  for (int l = 0; l < kLayers; ++l) {
    w_o.push_back(random_tensor({kH, kH}, DType::bf16, gpu, -0.05, 0.05));
    w_gu.push_back(random_tensor({2 * kI, kH}, DType::bf16, gpu, -0.05, 0.05));
    w_down.push_back(random_tensor({kH, kI}, DType::bf16, gpu, -0.05, 0.05));
    ln2.push_back(random_tensor({kH}, DType::bf16, gpu, 0.5, 1.5));
  }
  const Tensor attn = random_tensor({1, kH}, DType::bf16, gpu, -1, 1);
  const Tensor residual = random_tensor({1, kH}, DType::bf16, gpu, -1, 1);
  const double eps = 1e-6;
  Tensor o = Tensor::empty({kH}, DType::bf16, gpu), h = Tensor::empty({kH}, DType::bf16, gpu);
  Tensor act = Tensor::empty({kI}, DType::bf16, gpu), out = Tensor::empty({kH}, DType::bf16, gpu);
  unsigned long long* barrier = nullptr;
  CK(cudaMalloc(&barrier, 8));
  CK(cudaMemset(barrier, 0, 8));
  const size_t smem = kThreads * kSlots * 16 + kI * 2;
  CK(cudaFuncSetAttribute(mlp_persistent, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  // The grid barrier needs every CTA resident at once: one per SM.
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mlp_persistent, kThreads, smem));
  MICROLLM_CHECK(per_sm >= 1, DeviceError, "persistent_mlp_bench", "the kernel does not fit an SM");
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("persistent_mlp_bench on %s (%d SMs): Qwen2.5-0.5B MLP half, batch 1, bf16, %d layers a graph\n\n",
              prop.name, sms, kLayers);
  cuda::Stream stream = cuda::Stream::create(0);
  cudaStream_t s = static_cast<cudaStream_t>(stream.handle());
  int phases = 7;
  auto args = [&](int l) {
    LayerArgs a{};
    a.phases = phases;
    a.attn = static_cast<const bfloat*>(attn.data_ptr());
    a.residual = static_cast<const bfloat*>(residual.data_ptr());
    a.w_o = static_cast<const bfloat*>(w_o[l].data_ptr());
    a.ln2 = static_cast<const bfloat*>(ln2[l].data_ptr());
    a.w_gu = static_cast<const bfloat*>(w_gu[l].data_ptr());
    a.w_down = static_cast<const bfloat*>(w_down[l].data_ptr());
    a.o = static_cast<bfloat*>(o.data_ptr());
    a.h = static_cast<bfloat*>(h.data_ptr());
    a.act = static_cast<bfloat*>(act.data_ptr());
    a.out = static_cast<bfloat*>(out.data_ptr());
    a.barrier = barrier;
    a.eps = static_cast<float>(eps);
    return a;
  };
  auto launch_persistent = [&](int l) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(sms);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, mlp_persistent, args(l)));
  };
  // Correctness on layer 0: persistent vs the model's ops.
  {
    cuda::StreamGuard g(stream);
    launch_persistent(0);
    CK(cudaStreamSynchronize(s));
    const Tensor o_ref = linear(attn, w_o[0], Tensor());
    const NormLinearResult r =
        rms_norm_linear(o_ref, residual, ln2[0], eps, w_gu[0], Tensor(), GatedActivation::swiglu);
    const Tensor out_ref = linear(r.out, w_down[0], Tensor());
    CK(cudaStreamSynchronize(s));
    auto rel = [](const Tensor& x, const Tensor& y) {
      const std::vector<float> a = x.to(DType::f32).to(Device::cpu()).to_vector<float>();
      const std::vector<float> b = y.to(DType::f32).to(Device::cpu()).to_vector<float>();
      double num = 0, den = 0;
      for (size_t i = 0; i < a.size(); ++i) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
      return std::sqrt(num / den);
    };
    const double err[] = {rel(o, o_ref.reshape({kH})), rel(h, r.h.reshape({kH})), rel(act, r.out.reshape({kI})),
                          rel(out, out_ref.reshape({kH}))};
    std::printf("relative error against the model's ops: o %.3g, h %.3g, act %.3g, out %.3g\n\n", err[0], err[1],
                err[2], err[3]);
    MICROLLM_CHECK(err[0] == 0 && err[1] == 0 && err[2] < 1e-2 && err[3] < 1e-2, ValueError, "persistent_mlp_bench",
                   "the persistent kernel's results differ from the model's ops");
  }
  // Microseconds a layer: kLayers layers in one graph, replayed.
  auto time_graph = [&](auto&& body) {
    const uint64_t pool = cuda::create_graph_pool();
    const cuda::Graph graph = cuda::Graph::capture(stream, pool, [&] {
      for (int l = 0; l < kLayers; ++l) body(l);
    });
    for (int i = 0; i < 3; ++i) graph.replay();
    cuda::Event start(0), end(0);
    const int reps = 50;
    start.record(stream);
    for (int i = 0; i < reps; ++i) graph.replay();
    end.record(stream);
    end.synchronize();
    return 1000.0 * cuda::Event::elapsed_ms(start, end) / reps / kLayers;
  };
  auto chained = [&](int l) {
    const Tensor o_l = linear(attn, w_o[l], Tensor());
    const NormLinearResult r =
        rms_norm_linear(o_l, residual, ln2[l], eps, w_gu[l], Tensor(), GatedActivation::swiglu);
    (void)linear(r.out, w_down[l], Tensor());
  };
  auto persistent = [&](int l) { launch_persistent(l); };
  const double chained_us = time_graph(chained), persistent_us = time_graph(persistent);
  auto persistent_phases = [&](int p) {
    phases = p;
    const double us = time_graph(persistent);
    phases = 7;
    return us;
  };
  std::printf("| products | chained GEMV kernels (us a layer) | persistent kernel (us a layer) |\n|---|---:|---:|\n");
  std::printf("| o, gate_up, down | %.2f | %.2f (%.2fx) |\n", chained_us, persistent_us, chained_us / persistent_us);
  std::printf("| none: launch, barriers, stagings | | %.2f |\n", persistent_phases(0));
  std::printf("| o only | %.2f | %.2f |\n", time_graph([&](int l) { (void)linear(attn, w_o[l], Tensor()); }),
              persistent_phases(1));
  std::printf("| gate_up only (with the RMSNorm, SwiGLU) | %.2f | %.2f |\n", time_graph([&](int l) {
                (void)rms_norm_linear(attn, residual, ln2[l], eps, w_gu[l], Tensor(), GatedActivation::swiglu);
              }),
              persistent_phases(2));
  std::printf("| down only | %.2f | %.2f |\n",
              time_graph([&](int l) { (void)linear(act.reshape({1, kI}), w_down[l], Tensor()); }), persistent_phases(4));
  CK(cudaFree(barrier));
}

}  // namespace

int main() {
  try {
    run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

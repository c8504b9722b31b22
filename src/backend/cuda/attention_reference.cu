// Reference CUDA attention: the plain path for every case the fast paths leave out (f32, f64, any head
// dim, masks, odd strides). It computes what src/backend/cpu/attention.cpp computes, in the same order
// where that order matters (f32 accumulation, f64 for f64; the lse recomputed in f64 for f64 inputs;
// rowsum(P * dP) for the backward's delta), so the f64 tests pass at 1e-12.
//
// Forward: one block of 128 threads per query row (b, h, i). Pass 1: each thread scores keys
// j = tid, tid + 128, ... (one whole dot product each) for the row max. Pass 2, 128 keys at a time: each
// thread turns one score into p = exp(s - max) in shared memory, then each thread adds p_j * v_j[d] for
// the dims d it owns (d = tid, tid + 128, ...; V rows read coalesced along d).
// Backward, in two passes so that no two blocks write one element (no atomics), like the CPU:
//   by query row: lse (f64: recomputed), delta = sum_j P dP, dq = scale * sum_j dS_j k_j;
//   by key row (b, kv head, j): dv = sum P dO_i, dk = scale * sum dS q_i over the group's heads and rows.
// Speed is secondary: scores are recomputed per pass rather than stored.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "attention_kernels.h"
#include "common.cuh"

namespace microllm::cuda_kernels::attention {
namespace {

constexpr int kThreads = 128;  // per block; also the keys (or query items) scored per chunk

// A rank-4 strided operand: element (a, b, c, d) at data[a*s0 + b*s1 + c*s2 + d*s3].
template <typename T>
struct View4 {
  const T* data;
  int64_t s0, s1, s2, s3;
  __device__ const T* row(int64_t a, int64_t b, int64_t c) const { return data + a * s0 + b * s1 + c * s2; }
};

template <typename T>
View4<T> view4(const Tensor& t) {
  return {static_cast<const T*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// Sizes, the visibility rule and the mask ([B, Hq, T, S] view, data null when there is none).
struct RefShape {
  int64_t B, Hq, Hkv, T, S, D, G;
  bool causal;
  int64_t q_offset;
  const uint8_t* mask;
  int64_t m0, m1, m2, m3;
  int64_t window;  // > 0: query i sees keys j > q_offset + i - window too

  __device__ int64_t key_end(int64_t i) const { return causal ? min(S, q_offset + i + 1) : S; }
  __device__ bool allowed(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (j >= S || !sees_key(causal, q_offset, window, i, j)) return false;
    return mask == nullptr || mask[b * m0 + h * m1 + i * m2 + j * m3] != 0;
  }
};

RefShape make_shape(const Problem& p, const Tensor& mask) {
  RefShape z{p.batch, p.q_heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim, p.group, p.causal, p.q_offset,
          nullptr, 0, 0, 0, 0, p.window};
  if (mask.defined()) {
    z.mask = static_cast<const uint8_t*>(mask.data_ptr());
    z.m0 = mask.stride(0);
    z.m1 = mask.stride(1);
    z.m2 = mask.stride(2);
    z.m3 = mask.stride(3);
  }
  return z;
}

template <typename A>
__device__ __forceinline__ A exp_acc(A x) {
  if constexpr (std::is_same_v<A, double>) return ::exp(x);
  else return ::expf(x);
}
template <typename A>
__device__ __forceinline__ A log_acc(A x) {
  if constexpr (std::is_same_v<A, double>) return ::log(x);
  else return ::logf(x);
}

// Sequential dot product in A, as the CPU's dot().
template <typename A, typename T>
__device__ A dot(const T* x, int64_t xs, const T* y, int64_t ys, int64_t n) {
  A sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += to_acc(x[d * xs]) * to_acc(y[d * ys]);
  return sum;
}

template <typename T>
__device__ __forceinline__ T* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char attention_reference_smem[];
  return reinterpret_cast<T*>(attention_reference_smem);
}

// The max over visible keys of scale * q_i . k_j; -inf when the row sees none. Block-uniform.
template <typename T, typename A>
__device__ A row_max(const RefShape& z, const View4<T>& q, const View4<T>& k, A scale, int64_t b, int64_t h, int64_t i,
                     A* scratch) {
  const T* qi = q.row(b, h, i);
  const int64_t hk = h / z.G, end = z.key_end(i);
  A m = -INFINITY;
  for (int64_t j = threadIdx.x; j < end; j += blockDim.x) {
    if (z.allowed(b, h, i, j)) m = max(m, scale * dot<A>(qi, q.s3, k.row(b, hk, j), k.s3, z.D));
  }
  return block_max(m, scratch);
}

// Shared memory: acc [D], p [kThreads], scratch [32] (all A).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(View4<T> q, View4<T> k, View4<T> v, RefShape z, acc_t<T> scale, T* __restrict__ out,
                   float* __restrict__ lse) {
  using A = acc_t<T>;
  A* acc = dynamic_smem<A>();
  A* p = acc + z.D;
  A* scratch = p + kThreads;
  const int64_t rows = z.B * z.Hq * z.T;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t i = r % z.T, h = (r / z.T) % z.Hq, b = r / (z.T * z.Hq), hk = h / z.G;
    const T* qi = q.row(b, h, i);
    T* out_row = out + r * z.D;  // [B, Hq, T, D] contiguous
    const A m = row_max(z, q, k, scale, b, h, i, scratch);
    if (m == -INFINITY) {  // sees no key: output 0, lse -inf
      for (int64_t d = threadIdx.x; d < z.D; d += blockDim.x) out_row[d] = from_acc<T>(A(0));
      if (threadIdx.x == 0) lse[r] = -INFINITY;
      continue;
    }
    for (int64_t d = threadIdx.x; d < z.D; d += blockDim.x) acc[d] = 0;
    const int64_t end = z.key_end(i);
    A sum = 0;
    for (int64_t c0 = 0; c0 < end; c0 += kThreads) {
      const int64_t j = c0 + threadIdx.x;
      A pj = 0;
      if (j < end && z.allowed(b, h, i, j)) pj = exp_acc(scale * dot<A>(qi, q.s3, k.row(b, hk, j), k.s3, z.D) - m);
      p[threadIdx.x] = pj;
      sum += pj;
      __syncthreads();
      const int n = end - c0 < kThreads ? static_cast<int>(end - c0) : kThreads;
      for (int64_t d = threadIdx.x; d < z.D; d += blockDim.x) {
        A a = acc[d];
        for (int jj = 0; jj < n; ++jj) {
          if (p[jj] != 0) a += p[jj] * to_acc(v.row(b, hk, c0 + jj)[d * v.s3]);
        }
        acc[d] = a;
      }
      __syncthreads();  // p is rewritten by the next chunk
    }
    sum = block_sum(sum, scratch);
    for (int64_t d = threadIdx.x; d < z.D; d += blockDim.x) out_row[d] = from_acc<T>(acc[d] / sum);
    if (threadIdx.x == 0) lse[r] = static_cast<float>(m + log_acc(sum));
  }
}

// Backward pass 1, one block per query row. Shared memory: acc [D], ds [kThreads], scratch [32].
// Writes dq (scaled), and row_lse / delta [B*Hq*T] for pass 2.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    backward_query_kernel(View4<T> q, View4<T> k, View4<T> v, View4<T> dout, RefShape z, acc_t<T> scale,
                          const float* __restrict__ lse_in, acc_t<T>* __restrict__ row_lse,
                          acc_t<T>* __restrict__ delta, T* __restrict__ dq) {
  using A = acc_t<T>;
  constexpr bool kRecomputeLse = std::is_same_v<T, double>;
  A* acc = dynamic_smem<A>();
  A* ds = acc + z.D;
  A* scratch = ds + kThreads;
  const int64_t rows = z.B * z.Hq * z.T;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t i = r % z.T, h = (r / z.T) % z.Hq, b = r / (z.T * z.Hq), hk = h / z.G;
    const T* qi = q.row(b, h, i);
    const T* doi = dout.row(b, h, i);
    T* dq_row = dq + r * z.D;  // [B, Hq, T, D] contiguous
    const int64_t end = z.key_end(i);
    const A m = row_max(z, q, k, scale, b, h, i, scratch);
    A lse_i = -INFINITY;
    if (m != -INFINITY) {
      if constexpr (kRecomputeLse) {
        A sum = 0;
        for (int64_t j = threadIdx.x; j < end; j += blockDim.x) {
          if (z.allowed(b, h, i, j)) sum += exp_acc(scale * dot<A>(qi, q.s3, k.row(b, hk, j), k.s3, z.D) - m);
        }
        lse_i = m + log_acc(block_sum(sum, scratch));
      } else {
        lse_i = lse_in[r];
      }
    }
    if (lse_i == -INFINITY) {  // no key: P = 0, so dq = 0 and nothing flows to dk, dv
      for (int64_t d = threadIdx.x; d < z.D; d += blockDim.x) dq_row[d] = from_acc<T>(A(0));
      if (threadIdx.x == 0) {
        row_lse[r] = -INFINITY;
        delta[r] = 0;
      }
      continue;
    }
    // delta = sum_j P_ij dP_ij with dP_ij = dO_i . v_j
    A dl = 0;
    for (int64_t j = threadIdx.x; j < end; j += blockDim.x) {
      if (!z.allowed(b, h, i, j)) continue;
      const A pj = exp_acc(scale * dot<A>(qi, q.s3, k.row(b, hk, j), k.s3, z.D) - lse_i);
      if (pj != 0) dl += pj * dot<A>(doi, dout.s3, v.row(b, hk, j), v.s3, z.D);
    }
    dl = block_sum(dl, scratch);
    // dq = scale * sum_j dS_ij k_j, dS_ij = P_ij (dP_ij - delta), 128 keys at a time
    for (int64_t d = threadIdx.x; d < z.D; d += blockDim.x) acc[d] = 0;
    for (int64_t c0 = 0; c0 < end; c0 += kThreads) {
      const int64_t j = c0 + threadIdx.x;
      A dsj = 0;
      if (j < end && z.allowed(b, h, i, j)) {
        const A pj = exp_acc(scale * dot<A>(qi, q.s3, k.row(b, hk, j), k.s3, z.D) - lse_i);
        if (pj != 0) dsj = pj * (dot<A>(doi, dout.s3, v.row(b, hk, j), v.s3, z.D) - dl);
      }
      ds[threadIdx.x] = dsj;
      __syncthreads();
      const int n = end - c0 < kThreads ? static_cast<int>(end - c0) : kThreads;
      for (int64_t d = threadIdx.x; d < z.D; d += blockDim.x) {
        A a = acc[d];
        for (int jj = 0; jj < n; ++jj) {
          if (ds[jj] != 0) a += ds[jj] * to_acc(k.row(b, hk, c0 + jj)[d * k.s3]);
        }
        acc[d] = a;
      }
      __syncthreads();
    }
    for (int64_t d = threadIdx.x; d < z.D; d += blockDim.x) dq_row[d] = from_acc<T>(scale * acc[d]);
    if (threadIdx.x == 0) {
      row_lse[r] = lse_i;
      delta[r] = dl;
    }
  }
}

// Backward pass 2, one block per key row (b, hk, j); the items are the (query head of the group, query
// row) pairs, 128 at a time. Shared memory: dk [D], dv [D], p [kThreads], ds [kThreads] (A), then the
// items' q and dO row offsets [kThreads] each (int64).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    backward_key_kernel(View4<T> q, View4<T> k, View4<T> v, View4<T> dout, RefShape z, acc_t<T> scale,
                        const acc_t<T>* __restrict__ row_lse, const acc_t<T>* __restrict__ delta,
                        T* __restrict__ dk, T* __restrict__ dv) {
  using A = acc_t<T>;
  A* dk_acc = dynamic_smem<A>();
  A* dv_acc = dk_acc + z.D;
  A* p = dv_acc + z.D;
  A* ds = p + kThreads;
  int64_t* q_off = reinterpret_cast<int64_t*>(ds + kThreads);  // 8-byte aligned: D, kThreads counts of A
  int64_t* do_off = q_off + kThreads;
  const int64_t key_rows = z.B * z.Hkv * z.S;
  const int64_t items = z.G * z.T;
  for (int64_t kr = blockIdx.x; kr < key_rows; kr += gridDim.x) {
    const int64_t j = kr % z.S, hk = (kr / z.S) % z.Hkv, b = kr / (z.S * z.Hkv);
    const T* kj = k.row(b, hk, j);
    const T* vj = v.row(b, hk, j);
    for (int64_t d = threadIdx.x; d < z.D; d += blockDim.x) dk_acc[d] = dv_acc[d] = 0;
    for (int64_t c0 = 0; c0 < items; c0 += kThreads) {
      const int64_t it = c0 + threadIdx.x;
      A pj = 0, dsj = 0;
      if (it < items) {
        const int64_t h = hk * z.G + it / z.T, i = it % z.T;
        const int64_t qr = (b * z.Hq + h) * z.T + i;
        q_off[threadIdx.x] = b * q.s0 + h * q.s1 + i * q.s2;
        do_off[threadIdx.x] = b * dout.s0 + h * dout.s1 + i * dout.s2;
        if (z.allowed(b, h, i, j) && row_lse[qr] != -INFINITY) {
          pj = exp_acc(scale * dot<A>(q.row(b, h, i), q.s3, kj, k.s3, z.D) - row_lse[qr]);
          dsj = pj * (dot<A>(dout.row(b, h, i), dout.s3, vj, v.s3, z.D) - delta[qr]);
        }
      }
      p[threadIdx.x] = pj;
      ds[threadIdx.x] = dsj;
      __syncthreads();
      const int n = items - c0 < kThreads ? static_cast<int>(items - c0) : kThreads;
      for (int64_t d = threadIdx.x; d < z.D; d += blockDim.x) {
        A a_k = dk_acc[d], a_v = dv_acc[d];
        for (int jj = 0; jj < n; ++jj) {
          if (p[jj] == 0 && ds[jj] == 0) continue;
          a_v += p[jj] * to_acc(dout.data[do_off[jj] + d * dout.s3]);
          a_k += ds[jj] * to_acc(q.data[q_off[jj] + d * q.s3]);
        }
        dk_acc[d] = a_k;
        dv_acc[d] = a_v;
      }
      __syncthreads();
    }
    for (int64_t d = threadIdx.x; d < z.D; d += blockDim.x) {  // [B, Hkv, S, D] contiguous
      dk[kr * z.D + d] = from_acc<T>(scale * dk_acc[d]);
      dv[kr * z.D + d] = from_acc<T>(dv_acc[d]);
    }
  }
}

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20)); }

// Raises a kernel's dynamic shared-memory limit when it needs more than the default 48 KiB.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* op) {
  constexpr size_t kDefault = 48 * 1024, kMax = 227 * 1024;
  MICROLLM_CHECK(bytes <= kMax, NotSupportedError, op, "head dim too large for the CUDA reference kernel (",
                 bytes, " bytes of shared memory)");
  if (bytes > kDefault) {
    MICROLLM_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

}  // namespace

void reference_forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                       const Tensor& out, const Tensor& lse, cudaStream_t stream) {
  visit_float(q.dtype(), "attention", [&]<typename T>() {
    using A = acc_t<T>;
    const int64_t rows = p.batch * p.q_heads * p.q_len;
    if (rows == 0) return;
    const size_t smem = (p.head_dim + kThreads + 32) * sizeof(A);
    allow_smem(forward_kernel<T>, smem, "attention");
    forward_kernel<T><<<blocks_for(rows), kThreads, smem, stream>>>(
        view4<T>(q), view4<T>(k), view4<T>(v), make_shape(p, mask), static_cast<A>(p.scale),
        static_cast<T*>(out.data_ptr()), lse.data<float>());
    MICROLLM_CUDA_CHECK_LAUNCH();
  });
}

void reference_backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const Tensor& lse, const Tensor& grad_out, const Tensor& grad_q, const Tensor& grad_k,
                        const Tensor& grad_v, cudaStream_t stream) {
  visit_float(q.dtype(), "attention_backward", [&]<typename T>() {
    using A = acc_t<T>;
    const RefShape z = make_shape(p, mask);
    const A scale = static_cast<A>(p.scale);
    const int64_t rows = p.batch * p.q_heads * p.q_len;
    const int64_t key_rows = p.batch * p.kv_heads * p.kv_len;
    const DType acc_dtype = std::is_same_v<A, double> ? DType::f64 : DType::f32;
    // Per query row: the lse used for P and delta = rowsum(P * dP). [B, Hq, T] each.
    const Tensor row_lse = Tensor::empty({std::max<int64_t>(rows, 1)}, acc_dtype, q.device());
    const Tensor delta = Tensor::empty({std::max<int64_t>(rows, 1)}, acc_dtype, q.device());
    const Tensor lse_c = lse.contiguous();
    if (rows > 0) {
      const size_t smem = (p.head_dim + kThreads + 32) * sizeof(A);
      allow_smem(backward_query_kernel<T>, smem, "attention_backward");
      backward_query_kernel<T><<<blocks_for(rows), kThreads, smem, stream>>>(
          view4<T>(q), view4<T>(k), view4<T>(v), view4<T>(grad_out), z, scale, lse_c.data<float>(),
          static_cast<A*>(row_lse.data_ptr()), static_cast<A*>(delta.data_ptr()),
          static_cast<T*>(grad_q.data_ptr()));
      MICROLLM_CUDA_CHECK_LAUNCH();
    }
    if (key_rows > 0) {  // with T == 0 this still writes dk = dv = 0
      const size_t smem = (2 * p.head_dim + 2 * kThreads) * sizeof(A) + 2 * kThreads * sizeof(int64_t);
      allow_smem(backward_key_kernel<T>, smem, "attention_backward");
      backward_key_kernel<T><<<blocks_for(key_rows), kThreads, smem, stream>>>(
          view4<T>(q), view4<T>(k), view4<T>(v), view4<T>(grad_out), z, scale,
          static_cast<const A*>(row_lse.data_ptr()), static_cast<const A*>(delta.data_ptr()),
          static_cast<T*>(grad_k.data_ptr()), static_cast<T*>(grad_v.data_ptr()));
      MICROLLM_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace microllm::cuda_kernels::attention

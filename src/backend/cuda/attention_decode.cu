// Flash-decoding: attention for a few query rows (T <= 4: token-by-token generation, short speculative
// chunks) against a long KV cache, bf16/f16/f32, any head dim D <= 256 that is a multiple of 8, with
// causal/q_offset, a sliding window (its hidden keys masked, not skipped) and the optional mask.
//
// With T = 1 a head's whole work is one row against S keys: too little for a CTA per head, so the keys
// are split into chunks of up to 256 across CTAs, and a combine kernel merges the partial softmaxes:
//   partial kernel: grid (batch x kv head x row block, split). The rows of a CTA are up to 8 (query head
//     of the group, query row) pairs of ONE kv head, so every K/V row read from memory serves the whole
//     GQA group (Qwen2.5-0.5B: 7 query heads per kv head). 128 threads:
//     1. scores: thread per key, the 8 rows' dot products in f32 over 16-byte K loads (q in shared f32);
//     2. per row (warp per row): chunk max m, p = exp(s - m) in place, l = sum p;
//     3. o = sum_j p_j v_j: thread = (8-dim slice of D, key slice), 16-byte V loads coalesced along D,
//        then a shared-memory sum over the key slices. Writes (m, l, o) per row and split, f32.
//   combine kernel: one block per row: M = max m_s, L = sum l_s e^(m_s - M), out = sum o_s e^(m_s - M) / L,
//     lse = M + log L; a row that sees no key (M = -inf) gets out 0 and lse -inf.
// Memory traffic is K and V read once (plus tiny partials), so the kernel is bandwidth- and, at small
// sizes, launch-latency bound; the split count aims at >= 2 CTAs per SM.
#include <algorithm>
#include <cmath>

#include "attention_kernels.h"
#include "common.cuh"
#include "rows.cuh"
#include "decode_phases.cuh"

namespace microllm::cuda_kernels::attention {
namespace {

constexpr int kDecThreads = 128;
constexpr int kRowsPerCta = 8;   // (query head, query row) pairs per CTA
constexpr int kMaxChunk = 256;   // keys per CTA at most
constexpr int kMinChunk = 64;
constexpr int kMaxDecodeDim = 256;
constexpr int kMaxSplits = 8192;  // the combine kernel keeps one weight per split in shared memory

struct DecodeArgs {
  const void* q;
  const void* k;
  const void* v;
  const uint8_t* mask;  // [B, Hq, T, S] view or null
  int64_t q_stride[3], k_stride[3], v_stride[3];  // batch, head, position; dim stride 1
  int64_t mask_stride[4];
  int q_heads, kv_heads, group, q_len, kv_len, dim;
  int64_t q_offset;
  int64_t window;  // > 0: query i sees keys j > q_offset + i - window too
  bool causal;
  float scale;
  int rows_per_group;  // group * q_len
  int row_blocks;      // ceil(rows_per_group / kRowsPerCta)
  int chunk, n_split;
  float* part_o;  // [B * Hq * T][n_split][D]
  float* part_m;  // [B * Hq * T][n_split]
  float* part_l;
};

// Shared memory, f32: phase 1-3 use q [R][D] + scores [R][chunk]; the key-slice sums [slices][R][D]
// reuse the same space afterwards; row stats m, l [R] follow.
template <typename T>
__global__ void __launch_bounds__(kDecThreads) decode_partial_kernel(const DecodeArgs a) {
  constexpr int R = kRowsPerCta;
  extern __shared__ __align__(16) float decode_smem[];
  const int D = a.dim, chunk = a.chunk;
  const int slices_cap = kDecThreads / (D / 8);
  const int region = max(R * D + R * chunk, slices_cap * R * D);
  float* sq = decode_smem;     // [R][D]
  float* sc = sq + R * D;      // [R][chunk]
  float* red = decode_smem;    // [slices][R][D], after phase 3
  float* sm = decode_smem + region;
  float* sl = sm + R;

  const int rb = blockIdx.x % a.row_blocks;
  const int hk = (blockIdx.x / a.row_blocks) % a.kv_heads;
  const int b = blockIdx.x / (a.row_blocks * a.kv_heads);
  const int split = blockIdx.y;
  const int c0 = split * chunk;
  const int n = min(chunk, a.kv_len - c0);  // >= 1
  const int r0 = rb * R;
  const int nr = min(R, a.rows_per_group - r0);
  const int tid = threadIdx.x;

  // Row r of this CTA: query head h = hk * group + (r0 + r) / T, query row i = (r0 + r) % T.
  auto head_of = [&](int r) { return hk * a.group + (r0 + r) / a.q_len; };
  auto qrow_of = [&](int r) { return (r0 + r) % a.q_len; };

  const T* kg = static_cast<const T*>(a.k) + b * a.k_stride[0] + hk * a.k_stride[1];
  const T* vg = static_cast<const T*>(a.v) + b * a.v_stride[0] + hk * a.v_stride[1];

  // ---- phase 0: the rows' queries, f32 (zeros past nr) ----
  for (int idx = tid; idx < R * D; idx += kDecThreads) {
    const int r = idx / D, d = idx % D;
    float x = 0.f;
    if (r < nr) {
      const T* qr = static_cast<const T*>(a.q) + b * a.q_stride[0] + head_of(r) * a.q_stride[1] +
                    qrow_of(r) * a.q_stride[2];
      x = to_acc(qr[d]);
    }
    sq[idx] = x;
  }
  __syncthreads();

  // ---- phase 1: scores, one key per thread, all rows at once ----
  for (int jj = tid; jj < n; jj += kDecThreads) {
    const int j = c0 + jj;
    float acc[R];
    decode_phases::dot_rows<R>(kg + static_cast<int64_t>(j) * a.k_stride[2], sq, D, acc);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      bool visible = r < nr;
      if (visible) {
        const int h = head_of(r), i = qrow_of(r);
        visible = sees_key<int64_t>(a.causal, a.q_offset, a.window, i, j);
        if (visible && a.mask != nullptr) {
          visible = a.mask[b * a.mask_stride[0] + h * a.mask_stride[1] + i * a.mask_stride[2] +
                           static_cast<int64_t>(j) * a.mask_stride[3]] != 0;
        }
      }
      sc[r * chunk + jj] = visible ? acc[r] * a.scale : -INFINITY;
    }
  }
  __syncthreads();

  // ---- phase 2: chunk max and sum per row; scores become p = exp(s - m) (0 when the row sees nothing) ----
  decode_phases::softmax_rows<R>(sc, chunk, n, sm, sl, kDecThreads / 32);
  __syncthreads();

  // ---- phase 3: o = sum_j p_j v_j, per key slice into red ----
  decode_phases::accumulate_pv<R, kDecThreads, T>(sc, chunk, n, D, red, [&](int jj) {
    return vg + static_cast<int64_t>(c0 + jj) * a.v_stride[2];
  });
  const int slices = slices_cap;
  for (int idx = tid; idx < nr * D; idx += kDecThreads) {
    const int r = idx / D, d = idx % D;
    float o = 0.f;
    for (int s = 0; s < slices; ++s) o += red[(s * R + r) * D + d];
    const int64_t row = (static_cast<int64_t>(b) * a.q_heads + head_of(r)) * a.q_len + qrow_of(r);
    a.part_o[(row * a.n_split + split) * D + d] = o;
  }
  for (int r = tid; r < nr; r += kDecThreads) {
    const int64_t row = (static_cast<int64_t>(b) * a.q_heads + head_of(r)) * a.q_len + qrow_of(r);
    a.part_m[row * a.n_split + split] = sm[r];
    a.part_l[row * a.n_split + split] = sl[r];
  }
}

// One block per row (b, h, i) of [B, Hq, T]; shared memory: the splits' weights e^(m_s - M) [n_split]
// and 32 floats of reduction scratch.
template <typename T>
__global__ void __launch_bounds__(kDecThreads)
    decode_combine_kernel(const float* __restrict__ part_o, const float* __restrict__ part_m,
                          const float* __restrict__ part_l, int n_split, int D, int64_t rows, T* __restrict__ out,
                          float* __restrict__ lse) {
  extern __shared__ __align__(16) float combine_smem[];
  float* w = combine_smem;       // [n_split]
  float* scratch = w + n_split;  // [32]
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float2 stats = decode_phases::combine_row(part_m + row * n_split, part_l + row * n_split,
                                                    part_o + row * n_split * D, n_split, D, w, scratch, out + row * D);
    if (threadIdx.x == 0) lse[row] = stats.y > 0.f ? stats.x + logf(stats.y) : -INFINITY;
  }
}


}  // namespace

bool decode_supported(const Problem& p, DType dtype) {
  return (dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16) && p.q_len >= 1 && p.q_len <= 4 &&
         p.head_dim % 8 == 0 && p.head_dim <= kMaxDecodeDim && p.kv_len >= 1 &&
         p.kv_len <= int64_t{kMaxSplits} * kMaxChunk &&
         p.batch * p.kv_heads * ((p.group * p.q_len + kRowsPerCta - 1) / kRowsPerCta) < (int64_t{1} << 31);
}

void decode_forward(const Problem& p, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& mask,
                    const Tensor& out, const Tensor& lse, cudaStream_t stream, int device) {
  visit_float(q_in.dtype(), "attention", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      no_kernel("attention decode", DType::f64);  // decode_supported excludes f64
    } else {
      const Tensor q = vector_ready(q_in), k = vector_ready(k_in), v = vector_ready(v_in);
      const int64_t rows = p.batch * p.q_heads * p.q_len;
      const int rows_per_group = static_cast<int>(p.group * p.q_len);
      const int row_blocks = (rows_per_group + kRowsPerCta - 1) / kRowsPerCta;
      const int64_t base_ctas = p.batch * p.kv_heads * row_blocks;
      // Chunk: as large as possible (fewer partials) while giving >= 2 CTAs per SM, 64..256 keys.
      const int64_t want_splits = std::max<int64_t>(1, (2 * multiprocessor_count(device) + base_ctas - 1) / base_ctas);
      int64_t chunk = (p.kv_len + want_splits - 1) / want_splits;
      chunk = std::clamp<int64_t>((chunk + 31) / 32 * 32, kMinChunk, kMaxChunk);
      const int64_t n_split = (p.kv_len + chunk - 1) / chunk;

      const Device dev = q.device();
      const Tensor part_o = Tensor::empty({rows * n_split * p.head_dim}, DType::f32, dev);
      const Tensor part_m = Tensor::empty({rows * n_split}, DType::f32, dev);
      const Tensor part_l = Tensor::empty({rows * n_split}, DType::f32, dev);
      DecodeArgs a{};
      a.q = q.data_ptr();
      a.k = k.data_ptr();
      a.v = v.data_ptr();
      a.mask = mask.defined() ? static_cast<const uint8_t*>(mask.data_ptr()) : nullptr;
      rows::strides3(q, a.q_stride);
      rows::strides3(k, a.k_stride);
      rows::strides3(v, a.v_stride);
      for (int d = 0; d < 4; ++d) a.mask_stride[d] = mask.defined() ? mask.stride(d) : 0;
      a.q_heads = static_cast<int>(p.q_heads);
      a.kv_heads = static_cast<int>(p.kv_heads);
      a.group = static_cast<int>(p.group);
      a.q_len = static_cast<int>(p.q_len);
      a.kv_len = static_cast<int>(p.kv_len);
      a.dim = static_cast<int>(p.head_dim);
      a.q_offset = p.q_offset;
      a.window = p.window;
      a.causal = p.causal;
      a.scale = static_cast<float>(p.scale);
      a.rows_per_group = rows_per_group;
      a.row_blocks = row_blocks;
      a.chunk = static_cast<int>(chunk);
      a.n_split = static_cast<int>(n_split);
      a.part_o = part_o.data<float>();
      a.part_m = part_m.data<float>();
      a.part_l = part_l.data<float>();

      const int D = a.dim;
      const int slices = kDecThreads / (D / 8);
      const size_t region = std::max<size_t>(kRowsPerCta * (D + chunk), static_cast<size_t>(slices) * kRowsPerCta * D);
      const size_t smem = (region + 2 * kRowsPerCta) * sizeof(float);  // <= 32 KiB + 64 B
      const dim3 grid(static_cast<unsigned>(base_ctas), static_cast<unsigned>(n_split));
      decode_partial_kernel<T><<<grid, kDecThreads, smem, stream>>>(a);
      MICROLLM_CUDA_CHECK_LAUNCH();

      const size_t combine_smem = (n_split + 32) * sizeof(float);
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20));
      decode_combine_kernel<T><<<blocks, kDecThreads, combine_smem, stream>>>(
          a.part_o, a.part_m, a.part_l, a.n_split, D, rows, static_cast<T*>(out.data_ptr()), lse.data<float>());
      MICROLLM_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace microllm::cuda_kernels::attention

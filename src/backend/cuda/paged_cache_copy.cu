// CUDA kernels of the paged KV cache's copies (include/microllm/ops/paged_attention.h): paged_kv_write and
// paged_gather, one grid-stride kernel each, coalesced along D (bad slots and block ids are skipped, gather
// writing zeros, and reported through the device error word: IndexError at the next synchronization); and
// paged_decode_advance, a decode step's last kernel. The attention kernels are in paged_attention.cu.
#include "../../core/cuda/device_errors.h"
#include "common.cuh"
#include "cuda_backend.h"
#include "op_scope.h"

namespace microllm {
namespace cuda_kernels::paged {
namespace {

using detail::DeviceErrorCode;
using detail::report_device_error;

// pool[slots[n]] = k[n], v[n]: one thread per element of k, coalesced along D.
struct WriteArgs {
  const int32_t* slots;
  int64_t slot_stride;
  int64_t k_stride[3], v_stride[3];
  int64_t kp_stride[4], vp_stride[4];
  int64_t rows, heads, dim, block_size, n_slots;
  uint64_t* error_word;
};
template <typename P, typename S>
__global__ void paged_write_kernel(P* __restrict__ k_pool, P* __restrict__ v_pool, const S* __restrict__ k,
                                   const S* __restrict__ v, const WriteArgs a) {
  MICROLLM_GRID_STRIDE_LOOP(i, a.rows * a.heads * a.dim) {
    const int64_t d = i % a.dim, h = (i / a.dim) % a.heads, n = i / (a.dim * a.heads);
    const int64_t slot = a.slots[n * a.slot_stride];
    if (slot < 0) continue;  // padding row
    if (slot >= a.n_slots) {
      if (h == 0 && d == 0) report_device_error(a.error_word, DeviceErrorCode::paged_slot, slot);
      continue;
    }
    const int64_t b = slot / a.block_size, r = slot % a.block_size;
    k_pool[b * a.kp_stride[0] + r * a.kp_stride[1] + h * a.kp_stride[2] + d * a.kp_stride[3]] =
        from_acc<P>(static_cast<float>(to_acc(k[n * a.k_stride[0] + h * a.k_stride[1] + d * a.k_stride[2]])));
    v_pool[b * a.vp_stride[0] + r * a.vp_stride[1] + h * a.vp_stride[2] + d * a.vp_stride[3]] =
        from_acc<P>(static_cast<float>(to_acc(v[n * a.v_stride[0] + h * a.v_stride[1] + d * a.v_stride[2]])));
  }
}

// out [length, Hkv, D] contiguous = the sequence's first `length` rows; a bad block id gives zeros.
template <typename T>
__global__ void paged_gather_kernel(const T* __restrict__ pool, const int32_t* __restrict__ row, int64_t row_stride,
                                    int64_t s0, int64_t s1, int64_t s2, int64_t s3, int64_t length, int64_t heads,
                                    int64_t dim, int64_t block_size, int64_t num_blocks, T* __restrict__ out,
                                    uint64_t* error_word) {
  MICROLLM_GRID_STRIDE_LOOP(i, length * heads * dim) {
    const int64_t d = i % dim, h = (i / dim) % heads, j = i / (dim * heads);
    const int64_t block = row[(j / block_size) * row_stride];
    if (block < 0 || block >= num_blocks) {
      if (h == 0 && d == 0) report_device_error(error_word, DeviceErrorCode::paged_block, block);
      out[i] = from_acc<T>(0.f);
      continue;
    }
    out[i] = pool[block * s0 + (j % block_size) * s1 + h * s2 + d * s3];
  }
}

// paged_decode_advance in one CTA (a batch is at most a few hundred rows). Launched chained at the end of a
// captured step, it waits before anything else: the step's kernels read `inputs` until they finish.
constexpr int kAdvanceThreads = 256;
__global__ void decode_advance_kernel(int32_t* __restrict__ inputs, int64_t batch, const int32_t* __restrict__ tables,
                                      int64_t row_stride, int64_t column_stride, int64_t columns, int64_t block_size,
                                      const int32_t* __restrict__ ids, int64_t id_stride, int64_t n_ids,
                                      int32_t* __restrict__ outbox, int64_t outbox_rows, int64_t outbox_stride,
                                      int32_t* __restrict__ counter) {
  wait_for_prior_grids();
  if (ids != nullptr) {
    // Unsigned: past 2^31 steps (weeks of serving) the count wraps to 0, and rows still alternate (R = 2).
    const auto count = static_cast<uint32_t>(*counter);
    int32_t* row = outbox + (count % outbox_rows) * outbox_stride;  // pinned host memory: PCIe writes
    for (int64_t n = threadIdx.x; n < n_ids; n += kAdvanceThreads) row[n] = ids[n * id_stride];
    __syncthreads();  // every thread has read the counter
    if (threadIdx.x == 0) *counter = static_cast<int32_t>(count + 1u);
  }
  int32_t* rope_positions = inputs;
  int32_t* positions = inputs + batch;
  int32_t* slots = inputs + 2 * batch;
  for (int64_t b = threadIdx.x; b < batch; b += kAdvanceThreads) {
    const int32_t position = positions[b];
    if (position < 0) continue;  // not fed
    const int64_t next = position + 1, column = next / block_size;
    rope_positions[b] += 1;
    positions[b] = static_cast<int32_t>(next);
    slots[b] =
        column < columns
            ? static_cast<int32_t>(tables[b * row_stride + column * column_stride] * block_size + next % block_size)
            : -1;
  }
}

}  // namespace
}  // namespace cuda_kernels::paged

using namespace cuda_kernels;

void CudaBackend::paged_kv_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v,
                                 const Tensor& slots) {
  OpScope scope("paged_kv_write", device_, detail::current_cuda_stream(device_));
  Launch launch(k_pool);
  paged::WriteArgs a{};
  a.slots = slots.data<int32_t>();
  a.slot_stride = slots.stride(0);
  for (int d = 0; d < 3; ++d) {
    a.k_stride[d] = k.stride(d);
    a.v_stride[d] = v.stride(d);
  }
  for (int d = 0; d < 4; ++d) {
    a.kp_stride[d] = k_pool.stride(d);
    a.vp_stride[d] = v_pool.stride(d);
  }
  a.rows = k.size(0);
  a.heads = k.size(1);
  a.dim = k.size(2);
  a.block_size = k_pool.size(1);
  a.n_slots = k_pool.size(0) * k_pool.size(1);
  a.error_word = detail::cuda_error_word(device_);
  visit_float(k_pool.dtype(), "paged_kv_write", [&]<typename P>() {
    visit_float(k.dtype(), "paged_kv_write", [&]<typename S>() {
      paged::paged_write_kernel<P, S><<<grid_for(a.rows * a.heads * a.dim), kThreads, 0, launch.stream>>>(
          static_cast<P*>(k_pool.data_ptr()), static_cast<P*>(v_pool.data_ptr()), static_cast<const S*>(k.data_ptr()),
          static_cast<const S*>(v.data_ptr()), a);
      MICROLLM_CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaBackend::paged_gather(const Tensor& pool, const Tensor& block_table_row, int64_t length, const Tensor& out) {
  OpScope scope("paged_gather", device_, detail::current_cuda_stream(device_));
  Launch launch(out);
  visit_float(pool.dtype(), "paged_gather", [&]<typename T>() {
    const int64_t n = length * pool.size(2) * pool.size(3);
    paged::paged_gather_kernel<T><<<grid_for(n), kThreads, 0, launch.stream>>>(
        static_cast<const T*>(pool.data_ptr()), block_table_row.data<int32_t>(), block_table_row.stride(0),
        pool.stride(0), pool.stride(1), pool.stride(2), pool.stride(3), length, pool.size(2), pool.size(3),
        pool.size(1), pool.size(0), static_cast<T*>(out.data_ptr()), detail::cuda_error_word(device_));
    MICROLLM_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::paged_decode_advance(const Tensor& inputs, const Tensor& block_tables, int64_t block_size,
                                       const Tensor& ids, const Tensor& outbox, const Tensor& counter) {
  OpScope scope("paged_decode_advance", device_, detail::current_cuda_stream(device_));
  Launch launch(inputs);
  const bool hand_over = ids.defined();
  launch_chained(paged::decode_advance_kernel, 1, paged::kAdvanceThreads, 0, launch.stream, launch.device,
                 inputs.data<int32_t>(), inputs.size(1), block_tables.data<int32_t>(), block_tables.stride(0),
                 block_tables.stride(1), block_tables.size(1), block_size, hand_over ? ids.data<int32_t>() : nullptr,
                 hand_over ? ids.stride(0) : int64_t{0}, hand_over ? ids.size(0) : int64_t{0},
                 hand_over ? outbox.data<int32_t>() : nullptr, hand_over ? outbox.size(0) : int64_t{1},
                 hand_over ? outbox.stride(0) : int64_t{0}, hand_over ? counter.data<int32_t>() : nullptr);
}

}  // namespace microllm

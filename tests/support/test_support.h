// Helpers for op tests: devices to run on, fresh random inputs, non-contiguous copies, error norms and
// a finite-difference gradient check. One test body runs on every device (TEST_P over test_devices()).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "microllm/backend/kernel_params.h"
#include "microllm/core/tensor.h"

namespace microllm::testing {

// cpu, and cuda:0 in CUDA builds (tests on it skip when the machine has no GPU).
std::vector<Device> test_devices();
std::string device_test_name(const ::testing::TestParamInfo<Device>& info);
// cuda_bf16, ...: the name of a CUDA-only suite's dtype parameter (the GPU runs select "*cuda*").
std::string cuda_dtype_test_name(const ::testing::TestParamInfo<DType>& info);

// Skips the current test with a message when `device` is not usable here.
#define MICROLLM_SKIP_IF_UNAVAILABLE(device)                                                         \
  do {                                                                                               \
    if ((device).is_cuda() && !::microllm::cuda_available())                                         \
      GTEST_SKIP() << "no CUDA device on this machine: CUDA tests skip (they run on the GPU machine)"; \
  } while (0)

// The fixture of a suite whose one body runs on every device (INSTANTIATE_TEST_SUITE_P over test_devices()):
// derive a suite's own class from it (`class MatmulTest : public testing::DeviceTest {};`). It skips, saying why,
// on a device this machine lacks.
class DeviceTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { MICROLLM_SKIP_IF_UNAVAILABLE(GetParam()); }
  Device device() const { return GetParam(); }
};

// A fresh seed for every call (tests must not depend on one lucky input); printed on failure, and rerun with
// MICROLLM_TEST_SEED=<that seed> (the binary's first call returns it).
uint64_t fresh_seed();

// Uniform in [low, high) on `device`.
Tensor random_tensor(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(), double low = -1,
                     double high = 1, uint64_t seed = fresh_seed());
// The same values as `t` in a non-contiguous layout (every other element of a wider buffer).
Tensor non_contiguous(const Tensor& t);

// ||out - ref|| / ||ref|| over all elements (NaN in `out` gives NaN).
double relative_error(const Tensor& out, const std::vector<double>& ref);
double relative_error(const Tensor& out, const Tensor& ref);
// The tolerance of the relative error for results stored in `dtype` (f64 1e-12, f32 1e-5, f16 2e-3,
// bf16 1e-2): the Standards of the project.
double tolerance(DType dtype);

// EXPECT that relative_error(out, ref) <= tol, naming the op and the seed on failure.
#define MICROLLM_EXPECT_CLOSE(out, ref, tol) \
  EXPECT_LE(::microllm::testing::relative_error((out), (ref)), (tol)) << "relative error too large"

// Checks analytic gradients against central finite differences in f64 on the CPU.
// L(inputs) = sum(forward(inputs) * R) for a random R; backward(inputs, R) must return dL/dinput for
// every input (an undefined tensor for inputs that have no gradient, e.g. integer ids).
using ForwardFn = std::function<Tensor(const std::vector<Tensor>&)>;
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&, const Tensor&)>;
void expect_gradients_match(const std::vector<Tensor>& inputs, const ForwardFn& forward, const BackwardFn& backward,
                            double eps = 1e-6, double tol = 1e-6);

// Runs `call`, which gives an op bad indices on `device`, and returns the IndexError's message ("" if
// none). The CPU throws at once; a CUDA kernel reports through the device error word, so the error
// surfaces at the next synchronization, which this helper performs.
std::string index_error_message(Device device, const std::function<void()>& call);
// The message of the E (a microllm::Error) that `call` throws, or "no error"; any other exception propagates.
template <typename E>
std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const E& e) {
    return e.what();
  }
  return "no error";
}
inline std::string error_message(const std::function<void()>& call) { return message_of<Error>(call); }
// The message of the E that `fn` throws; fails the test (and returns "") when it throws nothing or another type.
template <typename E, typename Fn>
std::string thrown_message(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}
// Expects `call` to throw E (a microllm::Error type) whose message names the op as `[op]` and holds every one of
// `parts`; a call that does not throw, or throws another type, fails the test.
template <typename E = Error>
void expect_op_error(const std::function<void()>& call, const std::string& op,
                     const std::vector<std::string>& parts = {}) {
  try {
    call();
    ADD_FAILURE() << op << " did not throw";
  } catch (const E& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("[" + op + "]"), std::string::npos) << message;
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << op << " threw the wrong error type: " << e.what();
  }
}

// Sets a process-wide switch (set_decode_gemv, set_flash_wgmma, set_deterministic_algorithms, ...) for one scope
// and puts its old value back, also when the test fails or throws.
class ScopedSwitch {
 public:
  ScopedSwitch(bool (*get)(), void (*set)(bool), bool value) : set_(set), was_(get()) { set(value); }
  ~ScopedSwitch() { set_(was_); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  void (*set_)(bool);
  bool was_;
};

// f64 host values of a tensor, and an index helper for row-major loops in reference code.
std::vector<double> host_values(const Tensor& t);

// Rotary parameters of the paged-cache tests: Qwen's (theta 1e6, split-half pairs), and llama3 scaling with
// interleaved pairs, its blend band over small head dims' frequencies.
inline RopeParams qwen_rope() {
  RopeParams p;
  p.theta = 1e6;
  return p;
}
inline RopeParams llama3_interleaved_rope() {
  RopeParams p;
  p.theta = 5e5;
  p.layout = RopeLayout::interleaved;
  p.scaling.type = RopeScalingType::llama3;
  p.scaling.factor = 32;
  p.scaling.original_max_position_embeddings = 64;  // so the blend band covers these head dims' frequencies
  return p;
}

}  // namespace microllm::testing

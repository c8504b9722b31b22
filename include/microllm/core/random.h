// Counter-based random numbers (Philox4x32-10): the same (seed, offset) gives the same numbers on every
// device and thread count, and a generator's whole state is two integers, easy to checkpoint.
#pragma once

#include <array>
#include <cstdint>

namespace microllm {

// One Philox4x32-10 block: four 32-bit random words for (key, counter).
std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }  // number of 4-word blocks consumed so far
  void set_state(uint64_t seed, uint64_t offset) { seed_ = seed; offset_ = offset; }

  // Reserves `blocks` consecutive counters and returns the first; kernels draw from them in parallel.
  uint64_t reserve(uint64_t blocks) { const uint64_t first = offset_; offset_ += blocks; return first; }

  // Single draws, for host code that needs a few numbers (sampling, data order).
  uint32_t next_u32();
  uint64_t next_u64();
  double next_uniform();  // [0, 1)
  // Uniform integer in [0, bound), without modulo bias.
  uint64_t next_below(uint64_t bound);

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// [0, 1) from 32 random bits, and a standard normal from two uniforms (Box-Muller).
inline float uniform_from_bits(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }
void box_muller(uint32_t bits_a, uint32_t bits_b, float* out_pair);

}  // namespace microllm

#include "microllm/core/random.h"

#include <cmath>

namespace microllm {

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  // Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC11): 10 rounds of Philox4x32.
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c[4] = {static_cast<uint32_t>(counter_lo), static_cast<uint32_t>(counter_lo >> 32),
                   static_cast<uint32_t>(counter_hi), static_cast<uint32_t>(counter_hi >> 32)};
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
    const uint32_t next[4] = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<uint32_t>(p1),
                              static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<uint32_t>(p0)};
    c[0] = next[0]; c[1] = next[1]; c[2] = next[2]; c[3] = next[3];
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c[0], c[1], c[2], c[3]};
}

uint32_t Generator::next_u32() { return philox4x32(seed_, 0, reserve(1))[0]; }

uint64_t Generator::next_u64() {
  const auto words = philox4x32(seed_, 0, reserve(1));
  return (static_cast<uint64_t>(words[0]) << 32) | words[1];
}

double Generator::next_uniform() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }

uint64_t Generator::next_below(uint64_t bound) {
  if (bound <= 1) return 0;
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;  // reject the biased tail
  for (;;) {
    const uint64_t value = next_u64();
    if (value < limit) return value % bound;
  }
}

void box_muller(uint32_t bits_a, uint32_t bits_b, float* out_pair) {
  // u1 in (0, 1] so log(u1) is finite.
  const float u1 = (static_cast<float>(bits_a >> 8) + 1.0f) * (1.0f / 16777216.0f);
  const float u2 = uniform_from_bits(bits_b);
  const float radius = std::sqrt(-2.0f * std::log(u1));
  const float angle = 6.283185307179586f * u2;
  out_pair[0] = radius * std::cos(angle);
  out_pair[1] = radius * std::sin(angle);
}

}  // namespace microllm

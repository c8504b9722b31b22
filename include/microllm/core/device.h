// Where a tensor's bytes live: the host, or one CUDA device.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

namespace microllm {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // the CUDA ordinal; always 0 for the CPU

  static constexpr Device cpu() { return Device{DeviceType::cpu, 0}; }
  static constexpr Device cuda(int index = 0) { return Device{DeviceType::cuda, index}; }
  // Parses "cpu", "cuda", "cuda:1"; throws ValueError.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;  // "cpu", "cuda:0"
  friend bool operator==(const Device&, const Device&) = default;
};

std::ostream& operator<<(std::ostream& out, const Device& device);

// True when this build has the CUDA backend and the machine has at least one CUDA device.
bool cuda_available();
int cuda_device_count();  // 0 without CUDA

}  // namespace microllm

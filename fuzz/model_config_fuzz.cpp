// libFuzzer target: config.json text -> models::read_config (the registry of families) -> TransformerConfig,
// then the export round trip: an accepted config writes (write_config), reads back, and writes the same text.
// Any microllm::Error from read_config is an accepted answer to bad input; a crash, a sanitizer report, a
// hang, any other exception, or an accepted config that does not survive the round trip is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "microllm/core/error.h"
#include "microllm/models/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  microllm::nn::TransformerConfig config;
  try {
    config = microllm::models::read_config(text, "fuzz/config.json");
  } catch (const microllm::Error&) {
    return 0;
  }
  // Accepted: what read_config returns is a model this runtime can write and read again, unchanged.
  const std::string written = microllm::models::write_config(config);
  const microllm::nn::TransformerConfig again = microllm::models::read_config(written, "fuzz/written.json");
  if (microllm::models::write_config(again) != written) __builtin_trap();
  return 0;
}

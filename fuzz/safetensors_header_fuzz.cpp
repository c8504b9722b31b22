// libFuzzer target: the bytes of a .safetensors file -> SafetensorsFile::parse_header, the validation that
// SafetensorsFile::open runs on every mapped file. Any microllm::Error is an accepted answer to bad input; a
// crash, a sanitizer report, a hang, any other exception, or an accepted header that breaks the documented
// guarantees (each tensor's bytes = numel x dtype size, the tensors tile the data buffer exactly) is a bug.
//
// The first 8 bytes are the header length, which random mutations rarely keep consistent with the JSON that
// follows. So each input is parsed twice: as given (this tests the length checks), and with the length
// rewritten to end at the last '}' of the input (this lets the mutations reach the JSON validation).
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "microllm/core/error.h"
#include "microllm/io/safetensors.h"

namespace {

void check(bool cond) {
  if (!cond) __builtin_trap();
}

uint64_t read_length(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void parse(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> metadata;
  std::vector<microllm::io::TensorInfo> tensors;
  try {
    tensors = microllm::io::SafetensorsFile::parse_header(data, size, "fuzz.safetensors", &metadata);
  } catch (const microllm::Error&) {
    return;
  }
  // Accepted: the header length fits, and the tensors tile [0, data size) in offset order.
  check(size >= 8);
  const uint64_t header_bytes = read_length(data);
  check(header_bytes <= size - 8);
  const uint64_t data_size = size - 8 - header_bytes;
  uint64_t expected = 0;
  for (const microllm::io::TensorInfo& t : tensors) {
    check(t.data_begin == expected && t.data_begin <= t.data_end && t.data_end <= data_size);
    check(t.shape.size() <= microllm::kMaxDims);
    uint64_t numel = 1;
    for (int i = 0; i < t.shape.size(); ++i) {
      check(t.shape[i] >= 0);
      check(!__builtin_mul_overflow(numel, static_cast<uint64_t>(t.shape[i]), &numel));
    }
    check(numel * microllm::dtype_size(t.dtype) == t.data_end - t.data_begin);
    expected = t.data_end;
  }
  check(expected == data_size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  parse(data, size);
  if (size < 8) return 0;
  // The same bytes with the length field pointing just past the last '}'.
  size_t end = size;
  while (end > 8 && data[end - 1] != '}') --end;
  if (end == 8) return 0;
  const uint64_t length = end - 8;
  if (length == read_length(data)) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  for (int i = 0; i < 8; ++i) fixed[i] = static_cast<uint8_t>(length >> (8 * i));
  parse(fixed.data(), fixed.size());
  return 0;
}

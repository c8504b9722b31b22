// libFuzzer target: tokenizer.json text -> Tokenizer, then an encode/decode round of a fixed text.
// Any microllm::Error is an accepted answer to bad input; a crash, a sanitizer report, a hang or any other
// exception is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "microllm/core/error.h"
#include "microllm/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const microllm::Tokenizer tok = microllm::Tokenizer::from_json_text(text, "fuzz.json");
    for (const std::string_view sample : {std::string_view("Hello world! It's 2024 <|im_start|>héllo 你好\n\n  x"),
                                          std::string_view(""), std::string_view("aaaa bbbb")}) {
      const std::vector<int32_t> ids = tok.encode(sample, true);
      (void)tok.decode(ids, false);
      (void)tok.decode(ids, true);
      microllm::StreamDecoder stream = tok.stream_decoder();
      for (const int32_t id : ids) (void)stream.push(id);
      (void)stream.finish();
    }
    (void)tok.vocab_size();
    (void)tok.bos_id();
  } catch (const microllm::Error&) {
  }
  return 0;
}

// libFuzzer target: tokenizer.json text -> Tokenizer, then an encode/decode round of fixed texts.
// Any microllm::Error is an accepted answer to bad input; a crash, a sanitizer report, a hang, any other
// exception, or a StreamDecoder whose pieces do not add up to decode() is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "microllm/core/error.h"
#include "microllm/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const microllm::Tokenizer tok = microllm::Tokenizer::from_json_text(text, "fuzz.json");
    for (const std::string_view sample : {std::string_view("Hello world! It's 2024 <|im_start|>héllo 你好\n\n  x"),
                                          std::string_view(""), std::string_view("aaaa bbbb"),
                                          std::string_view("\xE2\x96\x81"
                                                           "a  \xF0\x92\x80\x80<s>b ")}) {
      const std::vector<int32_t> ids = tok.encode(sample, true);
      for (const bool skip : {false, true}) {
        const std::string decoded = tok.decode(ids, skip);
        microllm::StreamDecoder stream = tok.stream_decoder(skip);
        std::string streamed;
        for (const int32_t id : ids) streamed += stream.push(id);
        streamed += stream.finish();
        if (streamed != decoded) __builtin_trap();
      }
    }
    (void)tok.vocab_size();
    (void)tok.bos_id();
  } catch (const microllm::Error&) {
  }
  return 0;
}

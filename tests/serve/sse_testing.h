// Reading a server-sent event stream of the OpenAI format in the serve tests: its chunks, its text, its usage
// chunk, an error event and the final [DONE].
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace microllm::serve {

using nlohmann::json;

struct Sse {
  std::vector<json> chunks;  // every data: line with choices, parsed
  std::optional<json> usage_chunk;  // the one without choices (stream_options.include_usage)
  std::optional<json> error;        // an error event's object
  bool done = false;         // the last data line was [DONE]
  std::string text;          // the concatenated text / delta.content
};

inline Sse parse_sse(const std::string& body, bool chat) {
  Sse out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == ':') continue;
    EXPECT_EQ(line.rfind("data: ", 0), 0u) << line;
    const std::string data = line.substr(6);
    EXPECT_FALSE(out.done) << "data after [DONE]: " << data;
    if (data == "[DONE]") {
      out.done = true;
      continue;
    }
    json chunk = json::parse(data);
    if (chunk.contains("error")) {
      EXPECT_FALSE(out.error) << "two error events";
      out.error = chunk["error"];
      continue;
    }
    EXPECT_FALSE(out.usage_chunk) << "a chunk after the usage chunk: " << data;
    if (chunk["choices"].empty()) {
      out.usage_chunk = chunk;
      continue;
    }
    const json& choice = chunk["choices"][0];
    if (chat) {
      if (choice["delta"].contains("content")) out.text += choice["delta"]["content"].get<std::string>();
    } else {
      out.text += choice["text"].get<std::string>();
    }
    out.chunks.push_back(std::move(chunk));
  }
  return out;
}

}  // namespace microllm::serve

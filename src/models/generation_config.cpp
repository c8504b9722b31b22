// generation_config.json of a Hugging Face model directory, and the stop ids of generation.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "microllm/core/error.h"
#include "microllm/models/config.h"

namespace microllm::models {

namespace fs = std::filesystem;

std::optional<GenerationConfig> read_generation_config(const std::string& directory) {
  const fs::path path = fs::path(directory) / "generation_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const nlohmann::json j = detail::parse_json(text, "generation_config", str_cat(path.string(), ": not JSON"));
  GenerationConfig g;
  if (!j.is_object()) return g;
  if (const auto eos = j.find("eos_token_id"); eos != j.end()) {
    if (eos->is_number_integer()) g.eos_token_ids.push_back(eos->get<int64_t>());
    if (eos->is_array()) {
      for (const auto& id : *eos) {
        if (id.is_number_integer()) g.eos_token_ids.push_back(id.get<int64_t>());
      }
    }
  }
  if (const auto v = j.find("do_sample"); v != j.end() && v->is_boolean()) g.do_sample = v->get<bool>();
  auto number = [&](const char* key, std::optional<double>& field) {
    if (const auto v = j.find(key); v != j.end() && v->is_number()) field = v->get<double>();
  };
  number("temperature", g.temperature);
  number("top_k", g.top_k);
  number("top_p", g.top_p);
  number("min_p", g.min_p);
  number("repetition_penalty", g.repetition_penalty);
  return g;
}

std::vector<int64_t> stop_token_ids(const std::string& directory, const nn::TransformerConfig& config,
                                    std::span<const int32_t> extra) {
  std::vector<int64_t> ids = config.eos_token_ids;
  if (const std::optional<GenerationConfig> g = read_generation_config(directory))
    ids.insert(ids.end(), g->eos_token_ids.begin(), g->eos_token_ids.end());
  ids.insert(ids.end(), extra.begin(), extra.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace microllm::models

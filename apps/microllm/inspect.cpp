// `microllm inspect`: what a Hugging Face model directory holds, without loading the weights: the
// architecture from config.json (as microLLM reads it), the parameter count, and the tensor table
// (name, dtype, shape, bytes) of model.safetensors or its shards.
//   microllm inspect models/Qwen3-0.6B
//   microllm inspect models/Qwen3-0.6B --filter layers.0. --files
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "microllm/io/safetensors.h"
#include "microllm/models/config.h"

namespace microllm::app {
namespace {

namespace fs = std::filesystem;

struct InspectOptions {
  std::string directory;
  std::string filter;
  bool no_tensors = false;
  bool files = false;
};

// 1234567 -> "1,234,567"
std::string grouped(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  std::ostringstream out;
  out << std::fixed << std::setprecision(u == 0 ? 0 : 2) << v << " " << units[u];
  return out.str();
}

// "layers.2." before "layers.10.": digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string_view na = std::string_view(a).substr(i, ie - i), nb = std::string_view(b).substr(j, je - j);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ie, j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

std::string shape_text(const Shape& shape) { return shape.str(); }

// 1000000 rather than 1e+06.
std::string number_text(double v) {
  std::ostringstream out;
  if (std::abs(v) < 1e15 && v == static_cast<double>(static_cast<int64_t>(v)))
    out << static_cast<int64_t>(v);
  else
    out << v;
  return out.str();
}

void print_architecture(const nn::TransformerConfig& c, std::ostream& out) {
  out << "model_type    " << c.model_type << " (" << models::architecture_of(c.model_type) << ")\n"
      << "hidden        " << c.hidden_size << ", intermediate " << c.intermediate_size << "\n"
      << "layers        " << c.num_layers << "\n"
      << "heads         " << c.num_heads << " query, " << c.num_kv_heads << " key/value (GQA "
      << c.num_heads / c.num_kv_heads << ":1), head_dim " << c.resolved_head_dim() << "\n"
      << "vocab         " << c.vocab_size << "\n"
      << "rope          theta " << number_text(c.rope.theta) << ", "
      << (c.rope.layout == RopeLayout::split_half ? "split-half" : "interleaved") << ", scaling "
      << models::rope_scaling_name(c.rope.scaling.type);
  if (c.rope.scaling.type != RopeScalingType::none) out << " (factor " << c.rope.scaling.factor;
  if (c.rope.scaling.type == RopeScalingType::llama3) {
    out << ", low/high freq " << c.rope.scaling.low_freq_factor << "/" << c.rope.scaling.high_freq_factor;
  }
  if (c.rope.scaling.type != RopeScalingType::none && c.rope.scaling.type != RopeScalingType::linear) {
    out << ", original max positions " << c.rope.scaling.original_max_position_embeddings;
  }
  if (c.rope.scaling.type != RopeScalingType::none) out << ")";
  if (c.sliding_rope) out << "; sliding layers theta " << number_text(c.sliding_rope->theta);
  out << "\n"
      << "max positions " << c.max_position_embeddings;
  if (c.context_limit() < c.max_position_embeddings)
    out << " (runs " << c.context_limit() << ": where the rotary scaling would start to change)";
  out << "\n";
  int64_t windowed = 0;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) windowed += c.window_of(layer) > 0 ? 1 : 0;
  if (windowed > 0) {
    out << "window        " << c.sliding_window << " keys (sliding) on " << windowed << " of " << c.num_layers
        << " layers\n";
  }
  out << "tie embeddings " << (c.tie_word_embeddings ? "yes" : "no") << ", qkv bias "
      << (c.attention_bias ? "yes" : "no") << ", qk-norm " << (c.qk_norm ? "yes" : "no") << ", rms_norm_eps "
      << c.rms_norm_eps << "\n";
  out << "block         " << (c.norm_placement == nn::NormPlacement::sandwich ? "sandwich" : "pre") << " norms, "
      << (c.mlp_activation == nn::MlpActivation::silu ? "SwiGLU" : "GeGLU (tanh)") << " MLP, scores x "
      << number_text(c.attention(0).scale);
  if (c.embedding_scale != 1) out << ", embeddings x " << number_text(c.embedding_scale);
  if (c.final_logit_softcap > 0) out << ", logits soft-capped at " << number_text(c.final_logit_softcap);
  out << "\n";
  out << "bos/eos ids   " << (c.bos_token_id >= 0 ? std::to_string(c.bos_token_id) : std::string("-")) << " / ";
  if (c.eos_token_ids.empty()) out << "-";
  for (size_t i = 0; i < c.eos_token_ids.size(); ++i) out << (i ? ", " : "") << c.eos_token_ids[i];
  out << "\n";
}

// config.json fields printed as they are, for a model microLLM cannot run (so its tensors still show).
void print_raw_config(const fs::path& path, std::ostream& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  for (const char* key : {"model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "rope_theta",
                          "rope_scaling", "max_position_embeddings", "tie_word_embeddings", "torch_dtype"}) {
    if (j.contains(key)) out << "  " << key << ": " << j[key].dump() << "\n";
  }
}

void run_inspect(const InspectOptions& o) {
  const fs::path dir(o.directory);
  std::ostream& out = std::cout;
  out << "directory     " << fs::absolute(dir).lexically_normal().string() << "\n";
  std::optional<nn::TransformerConfig> config;
  try {
    config = models::read_config_file(o.directory);
  } catch (const Error& e) {
    out << "config.json   cannot be run by microLLM: " << e.what() << "\n";
    print_raw_config(dir / "config.json", out);
  }
  if (config) print_architecture(*config, out);

  const io::SafetensorsCheckpoint checkpoint = io::SafetensorsCheckpoint::open(o.directory);
  std::vector<std::string> names = checkpoint.names();
  std::sort(names.begin(), names.end(), natural_less);
  uint64_t parameters = 0, bytes = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_dtype;  // dtype -> tensors, parameters
  for (const std::string& name : names) {
    const io::TensorInfo& info = checkpoint.info(name);
    const auto n = static_cast<uint64_t>(info.shape.numel());
    parameters += n;
    bytes += info.data_end - info.data_begin;
    auto& d = by_dtype[io::safetensors_dtype_name(info.dtype)];
    ++d.first;
    d.second += n;
  }
  out << "parameters    " << grouped(parameters) << " (" << std::fixed << std::setprecision(1)
      << static_cast<double>(parameters) / 1e6 << "M) in " << names.size() << " tensors, " << human_bytes(bytes)
      << " in " << checkpoint.files().size() << " file(s)\n";
  out.unsetf(std::ios::floatfield);
  out << std::setprecision(6);
  if (config && static_cast<uint64_t>(config->num_parameters()) != parameters) {
    out << "              the config makes " << grouped(static_cast<uint64_t>(config->num_parameters()))
        << " parameters"
        << (config->tie_word_embeddings && checkpoint.contains("lm_head.weight")
                ? " (lm_head.weight is stored although the embeddings are tied)"
                : "")
        << "\n";
  }
  out << "dtypes        ";
  bool first = true;
  for (const auto& [dtype, counts] : by_dtype) {
    out << (first ? "" : ", ") << dtype << ": " << counts.first << " tensors, " << grouped(counts.second)
        << " parameters";
    first = false;
  }
  out << "\n";
  if (o.files) {
    out << "files\n";
    for (const io::SafetensorsFile& f : checkpoint.files()) {
      out << "  " << fs::path(f.path()).filename().string() << "  " << f.tensors().size() << " tensors, "
          << human_bytes(f.file_size()) << "\n";
    }
  }
  if (o.no_tensors) return;
  std::vector<const io::TensorInfo*> rows;
  size_t name_width = 4, shape_width = 5;
  for (const std::string& name : names) {
    if (!o.filter.empty() && name.find(o.filter) == std::string::npos) continue;
    rows.push_back(&checkpoint.info(name));
    name_width = std::max(name_width, name.size());
    shape_width = std::max(shape_width, shape_text(rows.back()->shape).size());
  }
  out << "tensors" << (o.filter.empty() ? "" : " matching '" + o.filter + "'") << " (" << rows.size() << ")\n";
  out << "  " << std::left << std::setw(static_cast<int>(name_width)) << "name"
      << "  " << std::setw(5) << "dtype"
      << "  " << std::setw(static_cast<int>(shape_width)) << "shape"
      << "  " << std::right << "bytes\n";
  for (const io::TensorInfo* info : rows) {
    out << "  " << std::left << std::setw(static_cast<int>(name_width)) << info->name << "  " << std::setw(5)
        << io::safetensors_dtype_name(info->dtype) << "  " << std::setw(static_cast<int>(shape_width))
        << shape_text(info->shape) << "  " << std::right << grouped(info->data_end - info->data_begin) << "\n";
  }
}

}  // namespace

void register_inspect(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("inspect", "Architecture, parameter count and tensors of a model directory");
  auto o = std::make_shared<InspectOptions>();
  cmd->add_option("directory", o->directory, "Hugging Face model directory (config.json + safetensors, or shards)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--filter", o->filter, "Only tensors whose name contains this text");
  cmd->add_flag("--no-tensors", o->no_tensors, "Leave out the tensor table");
  cmd->add_flag("--files", o->files, "List the safetensors files");
  cmd->callback([o] { run_inspect(*o); });
}

}  // namespace microllm::app

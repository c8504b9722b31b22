// Loading and saving Hugging Face model directories.
#include "microllm/models/loader.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>

#include "microllm/io/atomic_file.h"
#include "microllm/models/config.h"

namespace microllm::models {

namespace fs = std::filesystem;

std::string LoadReport::summary() const {
  std::ostringstream out;
  out << "loaded " << static_cast<double>(bytes) / 1e9 << " GB in " << seconds << " s (" << gigabytes_per_second()
      << " GB/s)";
  auto list = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    out << "; " << names.size() << " " << what << ":";
    for (size_t i = 0; i < names.size() && i < 8; ++i) out << " " << names[i];
    if (names.size() > 8) out << " ...";
  };
  list("missing", missing);
  list("unexpected", unexpected);
  list("mismatched", mismatched);
  if (ignored_tied_lm_head) out << "; lm_head.weight ignored (tied to the embeddings)";
  return out.str();
}

LoadReport load_weights(nn::TransformerLM& model, const io::SafetensorsCheckpoint& checkpoint,
                        const LoadOptions& options) {
  MemoryCategoryScope memory(MemoryCategory::weights);
  const auto start = std::chrono::steady_clock::now();
  LoadReport report;
  const std::vector<nn::ParameterInfo> parameters = model.named_parameters();
  std::map<std::string, bool> used;
  for (const std::string& name : checkpoint.names()) used[name] = false;
  // Check everything first, so a strict load fails before moving any byte.
  for (const nn::ParameterInfo& p : parameters) {
    if (!checkpoint.contains(p.name)) {
      report.missing.push_back(p.name);
      continue;
    }
    used[p.name] = true;
    const io::TensorInfo& info = checkpoint.info(p.name);
    if (info.shape != p.variable->shape()) {
      report.mismatched.push_back(str_cat(p.name, ": checkpoint ", info.shape, " vs model ", p.variable->shape()));
    } else if (!is_floating(info.dtype)) {
      report.mismatched.push_back(str_cat(p.name, ": checkpoint dtype ", info.dtype, " is not floating"));
    }
  }
  for (const auto& [name, was_used] : used) {
    if (was_used) continue;
    if (name == "lm_head.weight" && model.config().tie_word_embeddings) {
      report.ignored_tied_lm_head = true;  // some exports write the tied head too
      continue;
    }
    report.unexpected.push_back(name);
  }
  if (options.strict && !report.clean()) {
    throw ValueError("load", str_cat("the checkpoint does not match the model (strict load): ", report.summary()));
  }
  Generator gen(0);
  for (const nn::ParameterInfo& p : parameters) {
    const bool usable = checkpoint.contains(p.name) && checkpoint.info(p.name).shape == p.variable->shape() &&
                        is_floating(checkpoint.info(p.name).dtype);
    Tensor value;
    const Tensor& current = p.variable->value();
    const bool in_place = current.device() == options.device && current.dtype() == options.dtype;
    if (usable) {
      const Tensor stored = checkpoint.get(p.name);  // a view of the mapped file
      report.bytes += stored.nbytes();
      if (in_place) {
        // Already where it belongs (a resume): overwrite the values, so anything holding the parameter's
        // tensor (an optimizer) sees the loaded weights.
        Tensor target = current;
        target.copy_(stored);
        continue;
      }
      // Tensor::to moves the smaller of the two dtypes and converts on the faster side.
      value = stored.to(options.device, options.dtype);
    } else {
      // Non-strict and missing: a fresh initialization, as transformers does.
      const double std = model.config().initializer_range;
      value = p.name.find("norm") != std::string::npos
                  ? Tensor::ones(p.variable->shape(), options.dtype, options.device)
                  : Tensor::randn(p.variable->shape(), gen, options.dtype, options.device, 0, std);
    }
    *p.variable = nn::Variable(value, p.variable->requires_grad());
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

LoadedModel load_model(const std::string& directory, const LoadOptions& options) {
  const nn::TransformerConfig config = read_config_file(directory);
  LoadedModel loaded;
  loaded.model = std::make_unique<nn::TransformerLM>(config, 0, /*random_init=*/false);
  loaded.report = load_weights(*loaded.model, io::SafetensorsCheckpoint::open(directory), options);
  return loaded;
}

void save_model(const nn::TransformerLM& model, const std::string& directory, size_t max_shard_bytes) {
  fs::create_directories(directory);
  std::vector<std::pair<std::string, Tensor>> tensors;
  size_t total = 0;
  for (const nn::ParameterInfo& p : model.named_parameters()) {
    tensors.emplace_back(p.name, p.variable->value());
    total += p.variable->value().nbytes();
  }
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  if (max_shard_bytes == 0 || total <= max_shard_bytes) {
    io::save_safetensors((fs::path(directory) / "model.safetensors").string(), tensors, metadata);
  } else {
    io::save_safetensors_sharded(directory, "model", tensors, max_shard_bytes, metadata);
  }
  io::write_text_atomically((fs::path(directory) / "config.json").string(), write_config(model.config()));
}

}  // namespace microllm::models

// Loading and saving Hugging Face model directories.
#include "microllm/models/loader.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>

#include "config_reader.h"
#include "microllm/io/atomic_file.h"
#include "microllm/models/config.h"
#include "microllm/ops/elementwise.h"
#include "microllm/ops/indexing.h"

namespace microllm::models {

namespace fs = std::filesystem;

namespace {

// Where a parameter's values are in a checkpoint: its own tensor, or rows [row, row + rows) of a tensor that stacks
// it with others (the family's StackedWeight). Empty name: not there.
struct Source {
  std::string name;
  int64_t row = 0, rows = -1;  // rows < 0: the whole tensor
  int64_t stacked_rows = 0;    // the rows all parts of a stacked tensor need together
};

std::map<std::string, Source> sources_of(const nn::TransformerLM& model,
                                         const std::vector<nn::ParameterInfo>& parameters,
                                         const io::SafetensorsCheckpoint& checkpoint) {
  const std::vector<StackedWeight> stacked = family_of(model.config().model_type, "load").stacked;
  std::map<std::string, Shape> shapes;
  for (const nn::ParameterInfo& p : parameters) shapes[p.name] = p.variable->shape();
  std::map<std::string, Source> sources;
  for (const auto& [name, shape] : shapes) {
    if (checkpoint.contains(name)) {
      sources[name] = {name};
      continue;
    }
    for (const StackedWeight& rule : stacked) {
      for (size_t k = 0; k < rule.parts.size(); ++k) {
        if (!name.ends_with(rule.parts[k])) continue;
        const std::string prefix = name.substr(0, name.size() - rule.parts[k].size());
        if (!checkpoint.contains(prefix + rule.stored)) continue;
        Source s{prefix + rule.stored, 0, shape[0]};
        for (size_t i = 0; i < rule.parts.size(); ++i) {
          const auto part = shapes.find(prefix + rule.parts[i]);
          const int64_t rows = part == shapes.end() ? 0 : part->second[0];
          if (i < k) s.row += rows;
          s.stacked_rows += rows;
        }
        sources[name] = s;
      }
    }
  }
  return sources;
}

// The RMSNorm weights a family's norm offset applies to (every layer's, QK-norm's, the final norm's).
bool is_norm_weight(const std::string& name) { return name.ends_with("norm.weight"); }

// t + delta, computed in f64 and rounded once to `dtype` (on the CPU).
Tensor offset(const Tensor& t, double delta, DType dtype) {
  const Tensor wide = t.to(Device::cpu(), DType::f64);
  return add(wide, Tensor::full(wide.shape(), delta, DType::f64)).to(dtype);
}

}  // namespace

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
  const std::map<std::string, Source> sources = sources_of(model, parameters, checkpoint);
  std::map<std::string, bool> used;
  for (const std::string& name : checkpoint.names()) used[name] = false;
  // The shape a parameter expects of its checkpoint tensor: its own, or the stacked tensor's.
  auto stored_shape = [](const Source& s, const Shape& shape) {
    Shape want = shape;
    if (s.rows >= 0) want[0] = s.stacked_rows;
    return want;
  };
  // Check everything first, so a strict load fails before moving any byte.
  std::map<std::string, bool> usable;
  for (const nn::ParameterInfo& p : parameters) {
    const auto source = sources.find(p.name);
    if (source == sources.end()) {
      report.missing.push_back(p.name);
      continue;
    }
    const Source& s = source->second;
    used[s.name] = true;
    const io::TensorInfo& info = checkpoint.info(s.name);
    const Shape want = stored_shape(s, p.variable->shape());
    if (info.shape != want) {
      report.mismatched.push_back(
          str_cat(p.name, ": checkpoint ", s.name == p.name ? "" : s.name + " ", info.shape, " vs model ", want));
    } else if (!is_floating(info.dtype)) {
      report.mismatched.push_back(str_cat(p.name, ": checkpoint dtype ", info.dtype, " is not floating"));
    } else {
      usable[p.name] = true;
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
  const double norm_offset = family_of(model.config().model_type, "load").norm_offset;
  for (const nn::ParameterInfo& p : parameters) {
    Tensor value;
    const Tensor& current = p.variable->value();
    const bool in_place = current.device() == options.device && current.dtype() == options.dtype;
    if (usable.count(p.name) > 0) {
      const Source& s = sources.at(p.name);
      Tensor stored = checkpoint.get(s.name);  // a view of the mapped file
      if (s.rows >= 0) stored = stored.narrow(0, s.row, s.rows);
      report.bytes += stored.nbytes();
      if (norm_offset != 0 && is_norm_weight(p.name))
        stored = offset(stored, norm_offset, options.dtype == DType::f64 ? DType::f64 : DType::f32);
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
  const Family family = family_of(model.config().model_type, "save");
  const std::vector<StackedWeight>& stacked = family.stacked;
  const double norm_offset = family.norm_offset;
  std::map<std::string, bool> written;  // parameters already written stacked
  const std::vector<nn::ParameterInfo> parameters = model.named_parameters();
  std::map<std::string, Tensor> values;
  for (const nn::ParameterInfo& p : parameters) values[p.name] = p.variable->value();
  for (const nn::ParameterInfo& p : parameters) {
    if (written.count(p.name) > 0) continue;
    for (const StackedWeight& rule : stacked) {  // the family's stacked tensors, at their first part
      if (!p.name.ends_with(rule.parts.front())) continue;
      const std::string prefix = p.name.substr(0, p.name.size() - rule.parts.front().size());
      std::vector<Tensor> parts;
      for (const std::string& part : rule.parts) {
        const auto value = values.find(prefix + part);
        MICROLLM_CHECK(value != values.end(), ValueError, "save", "a ", model.config().model_type,
                       " checkpoint stacks ", prefix + rule.stored, " but the model has no ", prefix + part);
        parts.push_back(value->second);
        written[prefix + part] = true;
      }
      tensors.emplace_back(prefix + rule.stored, concat(parts, 0));
      total += tensors.back().second.nbytes();
    }
    if (written.count(p.name) > 0) continue;
    const Tensor& value = p.variable->value();
    tensors.emplace_back(
        p.name, norm_offset != 0 && is_norm_weight(p.name) ? offset(value, -norm_offset, value.dtype()) : value);
    total += value.nbytes();
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

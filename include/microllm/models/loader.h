// Loading a Hugging Face model directory (config.json + model.safetensors or shards with
// model.safetensors.index.json) into a TransformerLM on a device, in a dtype; saving one back.
// Tensors stream from the mapped files to the device through the runtime's bounded pinned staging
// buffers and are converted on the device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "microllm/io/safetensors.h"
#include "microllm/nn/transformer.h"

namespace microllm::models {

struct LoadOptions {
  Device device = Device::cpu();
  DType dtype = DType::f32;
  // Strict: any missing, unexpected or mismatched tensor is an error (naming them all). Non-strict:
  // they are reported, missing parameters keep a random initialization, the rest is ignored.
  bool strict = true;
};

struct LoadReport {
  std::vector<std::string> missing;     // parameters the checkpoint lacks
  std::vector<std::string> unexpected;  // tensors the model has no parameter for
  std::vector<std::string> mismatched;  // "name: checkpoint [a, b] vs model [c, d]"
  bool ignored_tied_lm_head = false;    // lm_head.weight present although the embeddings are tied
  size_t bytes = 0;                     // bytes read from the checkpoint
  double seconds = 0;
  double gigabytes_per_second() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
  bool clean() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  std::string summary() const;  // one paragraph for people
};

struct LoadedModel {
  std::unique_ptr<nn::TransformerLM> model;
  LoadReport report;
};

// Reads DIR/config.json, builds the model (weights unwritten), loads the checkpoint into it.
LoadedModel load_model(const std::string& directory, const LoadOptions& options = {});
// Loads a checkpoint into an existing model (its parameters are replaced by tensors on options.device).
LoadReport load_weights(nn::TransformerLM& model, const io::SafetensorsCheckpoint& checkpoint,
                        const LoadOptions& options = {});
// Writes DIR/config.json and the weights (one file, or shards of at most max_shard_bytes with an index).
void save_model(const nn::TransformerLM& model, const std::string& directory, size_t max_shard_bytes = 0);

}  // namespace microllm::models

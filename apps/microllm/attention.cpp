// `microllm attention`: the attention weights of one layer for a prompt (nn::attention_weights: transformers'
// output_attentions=True with eager attention), as a table of the keys each query attends to most, a heat map of a
// head (--svg), and all heads as safetensors (--out):
//   microllm attention --model DIR --prompt "The capital of France is" --layer 3 --head 5 --svg head5.svg
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "microllm/core/threads.h"
#include "microllm/io/atomic_file.h"
#include "microllm/io/safetensors.h"
#include "microllm/models/loader.h"
#include "microllm/nn/transformer.h"
#include "microllm/profile/heatmap.h"
#include "microllm/tokenizer/tokenizer.h"
#include "token_ids.h"

namespace microllm::app {
namespace {

struct AttentionCliOptions {
  std::string model, prompt, ids, device = "cpu", dtype = "f32", svg, out;
  int layer = 0, head = 0, top = 3, threads = 0;
};

// A token as a label: its text with control characters shown as escapes, or #id without a tokenizer.
std::string token_label(const std::optional<Tokenizer>& tokenizer, int64_t id) {
  if (!tokenizer) return "#" + std::to_string(id);
  const std::string text = tokenizer->decode(std::vector<int32_t>{static_cast<int32_t>(id)});
  std::string label;
  for (unsigned char c : text) {
    if (c == '\n') {
      label += "\\n";
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      label += escaped;
    } else {
      label += static_cast<char>(c);
    }
  }
  return label.empty() ? "#" + std::to_string(id) : label;
}

void run_attention(const AttentionCliOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  MICROLLM_CHECK(o.prompt.empty() != o.ids.empty(), ValueError, "attention", "give exactly one of --prompt and --ids");
  const std::optional<Tokenizer> tokenizer = Tokenizer::load_if_present(o.model);
  std::vector<int64_t> ids;
  if (!o.prompt.empty()) {
    MICROLLM_CHECK(tokenizer.has_value(), ValueError, "attention", "--prompt needs a tokenizer (tokenizer.json) in ",
                   o.model, "; give --ids instead");
    for (int32_t id : tokenizer->encode(o.prompt, /*add_special_tokens=*/true)) ids.push_back(id);
    MICROLLM_CHECK(!ids.empty(), ValueError, "attention", "--prompt encodes to no token");
  } else {
    const auto rows = parse_id_rows(o.ids, "attention");
    MICROLLM_CHECK(rows.size() == 1, ValueError, "attention", "--ids: one sequence, got ", rows.size());
    ids = rows[0];
  }

  models::LoadOptions load;
  load.device = Device::parse(o.device);
  load.dtype = parse_dtype(o.dtype);
  MICROLLM_CHECK(load.dtype == DType::f32 || load.dtype == DType::bf16, ValueError, "attention",
                 "--dtype must be f32 or bf16, got ", o.dtype);
  const models::LoadedModel loaded = models::load_model(o.model, load);
  const nn::TransformerConfig& config = loaded.model->config();
  for (int64_t id : ids) {
    MICROLLM_CHECK(id >= 0 && id < config.vocab_size, ValueError, "attention", "token id ", id,
                   " is outside the vocabulary of ", config.vocab_size);
  }
  MICROLLM_CHECK(o.head >= -1 && o.head < config.num_heads, ValueError, "attention", "--head ", o.head,
                 " is outside the model's ", config.num_heads, " heads (-1: their mean)");
  const auto tokens = static_cast<int64_t>(ids.size());
  nn::ForwardContext ctx;
  ctx.compute_dtype = load.dtype;
  const Tensor weights = nn::attention_weights(*loaded.model, Tensor::from_vector(ids, {1, tokens}).to(load.device),
                                               {o.layer}, ctx)[0]
                             .to(Device::cpu());  // [1, Hq, T, T] f32
  if (!o.out.empty()) {
    io::save_safetensors(o.out, {{"input_ids", Tensor::from_vector(ids, {1, tokens})}, {"attn_weights", weights}},
                         {{"model", o.model}, {"layer", std::to_string(o.layer)}, {"dtype", o.dtype}});
  }

  // The chosen head, or the mean of all, as a T x T matrix.
  const std::vector<float> all = weights.to_vector<float>();
  std::vector<float> matrix(static_cast<size_t>(tokens * tokens), 0.0F);
  const int64_t first = o.head < 0 ? 0 : o.head, last = o.head < 0 ? config.num_heads : o.head + 1;
  for (int64_t h = first; h < last; ++h) {
    for (int64_t i = 0; i < tokens * tokens; ++i) {
      matrix[static_cast<size_t>(i)] += all[static_cast<size_t>(h * tokens * tokens + i)] / static_cast<float>(last - first);
    }
  }
  std::vector<std::string> labels;
  for (int64_t id : ids) labels.push_back(token_label(tokenizer, id));

  const std::string head_name = o.head < 0 ? "mean of the heads" : "head " + std::to_string(o.head);
  std::cout << "layer " << o.layer << ", " << head_name << ": the keys each query attends to most\n";
  for (int64_t q = 0; q < tokens; ++q) {
    std::vector<int64_t> keys(static_cast<size_t>(q + 1));
    std::iota(keys.begin(), keys.end(), 0);
    const float* row = matrix.data() + q * tokens;
    std::stable_sort(keys.begin(), keys.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    char head[64];
    std::snprintf(head, sizeof head, "%4lld ", static_cast<long long>(q));
    std::cout << head << labels[static_cast<size_t>(q)] << "  ->";
    for (size_t k = 0; k < keys.size() && k < static_cast<size_t>(o.top); ++k) {
      char weight[32];
      std::snprintf(weight, sizeof weight, "%.3f", static_cast<double>(row[keys[k]]));
      std::cout << "  " << keys[k] << ":" << labels[static_cast<size_t>(keys[k])] << " " << weight;
    }
    std::cout << "\n";
  }
  if (!o.svg.empty()) {
    const std::string title = "layer " + std::to_string(o.layer) + ", " + head_name + " (queries down, keys across)";
    io::write_text_atomically(o.svg, profile::heatmap_svg(matrix, tokens, tokens, labels, labels, title));
    std::cout << "svg: " << o.svg << "\n";
  }
}

}  // namespace

void register_attention(CLI::App& app) {
  CLI::App* cmd =
      app.add_subcommand("attention", "Attention weights of a layer for a prompt: top keys per query, a heat map");
  auto o = std::make_shared<AttentionCliOptions>();
  cmd->add_option("--model", o->model, "Model directory (config.json + safetensors, tokenizer.json for --prompt)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--prompt", o->prompt, "Text, encoded with the model's tokenizer (special tokens added)");
  cmd->add_option("--ids", o->ids, "Token ids instead of a prompt, e.g. \"1,2,3\"");
  cmd->add_option("--layer", o->layer, "Layer index")->required()->check(CLI::NonNegativeNumber);
  cmd->add_option("--head", o->head, "Query head to show (-1: the mean over heads)")->capture_default_str();
  cmd->add_option("--top", o->top, "Keys listed per query")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--svg", o->svg, "Write the head's weights as an SVG heat map");
  cmd->add_option("--out", o->out, "Write all heads' weights [1, H, T, T] and the ids as safetensors");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Weights and compute dtype: f32 or bf16")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0: all)");
  cmd->callback([o] { run_attention(*o); });
}

}  // namespace microllm::app

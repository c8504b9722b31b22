// The server with a random-weight folder of each newer family, over real HTTP: a Gemma 3 folder (gemma3_text with
// its sliding and global layers, Gemma 3's tokenizer and its own chat template from tokenizer_config.json) and a
// Phi-3 folder (stacked qkv_proj / gate_up_proj, a window on every layer; the Llama 2 tokenizer Phi-3 extends and
// Phi-3's chat template). Each answers a chat completion whose prompt is the template's rendering, and its greedy
// reply equals generate()'s over the same folder. The tokenizer files come from scripts/fetch-tokenizers.sh; the
// test skips without them.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_testing.h"
#include "microllm/generate/generate.h"
#include "microllm/models/config.h"
#include "microllm/models/loader.h"
#include "microllm/serve/server.h"
#include "microllm/tokenizer/tokenizer.h"
#include "test_support.h"
#include "tiny_model_dir.h"

namespace microllm::serve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Phi-3-mini-instruct's chat template (its tokenizer_config.json).
constexpr const char* kPhi3Template =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif "
    "message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor "
    "%}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";

nn::TransformerConfig small(const std::string& model_type, int64_t vocab) {
  nn::TransformerConfig c;
  c.model_type = model_type;
  c.vocab_size = vocab;
  c.hidden_size = 16, c.intermediate_size = 32, c.num_layers = 2, c.num_heads = 2, c.num_kv_heads = 1;
  c.max_position_embeddings = 512;
  c.initializer_range = 0.2;
  c.rope.theta = 10000;
  c.sliding_window = 4;  // shorter than the prompts: the windows matter
  return c;
}

nn::TransformerConfig gemma3(int64_t vocab) {
  nn::TransformerConfig c = small("gemma3_text", vocab);
  c.norm_placement = nn::NormPlacement::sandwich;
  c.qk_norm = true;
  c.mlp_activation = nn::MlpActivation::gelu_tanh;
  c.head_dim = 8;
  c.embedding_scale = 4;  // sqrt(hidden_size)
  c.query_pre_attn_scalar = 8;
  c.sliding_layers = {true, false};
  c.sliding_rope = RopeParams{};
  c.rope.theta = 1e6;
  return c;
}

nn::TransformerConfig phi3(int64_t vocab) {
  nn::TransformerConfig c = small("phi3", vocab);
  c.tie_word_embeddings = false;
  return c;
}

// Serves the folder, asks for a chat completion and checks it against the template and generate().
void expect_chat_served(const fs::path& dir) {
  const Tokenizer tokenizer = Tokenizer::load(dir.string());
  const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hello, wörld! What is 2 + 2?"}};
  const std::vector<int32_t> prompt = tokenizer.encode(tokenizer.chat_template().render(messages), false);

  ServerOptions options;
  options.model_dir = dir.string();
  options.port = 0;
  options.dtype = "f64";  // the engine's batched steps equal generate()'s exactly
  Server server(options);
  server.start();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(60);
  const json request = {{"messages", json::array({{{"role", "system"}, {"content", messages[0].content}},
                                                  {{"role", "user"}, {"content", messages[1].content}}})},
                        {"max_tokens", 6},
                        {"temperature", 0}};
  const auto response = client.Post("/v1/chat/completions", request.dump(), "application/json");
  ASSERT_TRUE(response);
  ASSERT_EQ(response->status, 200) << response->body;
  const json body = json::parse(response->body);
  EXPECT_EQ(body["usage"]["prompt_tokens"].get<size_t>(), prompt.size()) << "the prompt is not the template's";

  const models::LoadedModel loaded = models::load_model(dir.string(), {.dtype = DType::f64});
  generate::GenerateOptions o;
  o.max_new_tokens = 6;
  o.sampling.temperature = 0;
  o.compute_dtype = DType::f64;
  for (int32_t id : tokenizer.stop_ids(/*chat=*/true)) o.stop_ids.push_back(id);
  auto stream = std::make_shared<StreamDecoder>(tokenizer.stream_decoder(true));
  generate::TextDecoder decoder{[stream](int32_t id) { return stream->push(id); },
                                [stream] { return stream->finish(); }};
  const generate::Generation expected = generate::generate_text(*loaded.model, prompt, o, decoder);
  EXPECT_EQ(body["usage"]["completion_tokens"].get<size_t>(), expected.tokens.size());
  EXPECT_GE(expected.tokens.size(), 2u) << "a reply that ends at once tests little";
  EXPECT_EQ(body["choices"][0]["message"]["content"].get<std::string>(), expected.text);
}

TEST(ServeFamilies, Gemma3AndPhi3FoldersServeChatsWithTheirTemplates) {
  const fs::path fetched = testing::fetched_tokenizers();
  int served = 0;
  for (const auto& [family, tokenizer_dir] : {std::pair{"gemma3_text", "gemma3"}, std::pair{"phi3", "llama2"}}) {
    SCOPED_TRACE(family);
    const fs::path source = fetched / tokenizer_dir;
    if (!fs::exists(source / "tokenizer.json")) continue;
    const fs::path dir =
        fs::temp_directory_path() / (std::string("microllm-serve-") + family + "-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(source / file, dir / file);
    const int64_t vocab = testing::largest_token_id(dir / "tokenizer.json") + 1;
    if (std::string(family) == "phi3") testing::write_text_file(dir / "chat_template.jinja", kPhi3Template);
    const nn::TransformerConfig config = std::string(family) == "phi3" ? phi3(vocab) : gemma3(vocab);
    models::save_model(nn::TransformerLM(config, testing::fresh_seed()), dir.string());
    EXPECT_EQ(models::read_config_file(dir.string()).model_type, family);
    expect_chat_served(dir);
    fs::remove_all(dir);
    ++served;
  }
  if (served == 0) GTEST_SKIP() << "no tokenizer folders in " << fetched << ": run scripts/fetch-tokenizers.sh";
}

}  // namespace
}  // namespace microllm::serve

// The C API's models, text and generation (capi/microllm.h) on a tiny random model folder: logits equal to the
// C++ forward, tokenize/detokenize equal to the Tokenizer's, greedy generation equal to generate_text's, and the
// buffer rule (a result larger than the buffer: MICROLLM_ERROR_VALUE with the needed count set). The tensor ops'
// C API is exercised by the package test's C consumer (examples/consumers/c-api).
#include "microllm/capi/microllm.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "microllm/autograd/variable.h"
#include "microllm/generate/generate.h"
#include "microllm/models/loader.h"
#include "microllm/tokenizer/tokenizer.h"
#include "test_support.h"
#include "tiny_model_dir.h"

namespace microllm {
namespace {

TEST(CApi, ModelLogitsTokenizerAndGenerate) {
  const uint64_t seed = testing::fresh_seed();
  const testing::TinyModelDir dir(seed);
  microllm_model* model = nullptr;
  ASSERT_EQ(microllm_model_load(dir.dir.c_str(), "cpu", "f32", &model), MICROLLM_OK) << microllm_last_error();
  const models::LoadedModel reference = models::load_model(dir.dir.string());
  EXPECT_EQ(microllm_model_vocab_size(model), reference.model->config().vocab_size);

  // Logits of random ids equal the forward's.
  const Tensor ids = testing::random_tensor({2, 5}, DType::i64, Device::cpu(), 0, 259, seed);
  const std::vector<int64_t> flat = ids.to_vector<int64_t>();
  microllm_tensor* logits = nullptr;
  ASSERT_EQ(microllm_model_logits(model, flat.data(), 2, 5, &logits), MICROLLM_OK) << microllm_last_error();
  ASSERT_EQ(microllm_tensor_rank(logits), 3);
  std::vector<float> got(static_cast<size_t>(microllm_tensor_numel(logits)), NAN);
  ASSERT_EQ(microllm_tensor_to_f32(logits, got.data(), got.size()), MICROLLM_OK);
  autograd::NoGradGuard no_grad;
  const std::vector<float> expected = reference.model->forward(ids, {}).value().to_vector<float>();
  EXPECT_EQ(got, expected);
  microllm_tensor_free(logits);
  const int64_t outside = 100000;
  EXPECT_EQ(microllm_model_logits(model, &outside, 1, 1, &logits), MICROLLM_ERROR_INDEX);
  EXPECT_NE(std::string(microllm_last_error()).find("outside the vocabulary"), std::string::npos);

  // Text through the model's tokenizer, and the buffer rule.
  const microllm_tokenizer* tokenizer = nullptr;
  ASSERT_EQ(microllm_model_tokenizer(model, &tokenizer), MICROLLM_OK) << microllm_last_error();
  const Tokenizer tok = Tokenizer::load(dir.dir.string());
  const std::string text = "Hello, wörld " + std::to_string(seed % 1000);
  std::vector<int32_t> encoded(2, -1);
  size_t count = 0;
  EXPECT_EQ(microllm_tokenize(tokenizer, text.c_str(), 1, encoded.data(), encoded.size(), &count),
            MICROLLM_ERROR_VALUE);
  const std::vector<int32_t> expected_ids = tok.encode(text, true);
  ASSERT_EQ(count, expected_ids.size());
  encoded.assign(count, -1);
  ASSERT_EQ(microllm_tokenize(tokenizer, text.c_str(), 1, encoded.data(), encoded.size(), &count), MICROLLM_OK);
  EXPECT_EQ(encoded, expected_ids);
  std::string decoded(text.size() + 1, '#');
  size_t length = 0;
  ASSERT_EQ(microllm_detokenize(tokenizer, encoded.data(), count, 0, decoded.data(), decoded.size(), &length),
            MICROLLM_OK);
  EXPECT_EQ(decoded.substr(0, length), tok.decode(encoded));
  EXPECT_EQ(decoded[length], '\0');

  // Greedy generation equals generate_text's with the same stop ids.
  microllm_sampling sampling = microllm_sampling_default();
  sampling.max_tokens = 6;
  std::string generated(256, '#');
  ASSERT_EQ(microllm_generate(model, "Once", &sampling, generated.data(), generated.size(), &length), MICROLLM_OK)
      << microllm_last_error();
  generate::GenerateOptions options;
  options.max_new_tokens = 6;
  options.sampling.temperature = 0;
  options.stop_ids = {258, 258};
  std::shared_ptr<StreamDecoder> stream = std::make_shared<StreamDecoder>(tok.stream_decoder(true));
  const generate::TextDecoder decoder{[stream](int32_t id) { return stream->push(id); },
                                      [stream] { return stream->finish(); }};
  EXPECT_EQ(generated.substr(0, length),
            generate::generate_text(*reference.model, tok.encode("Once", true), options, decoder).text);
  sampling.top_p = 2;
  EXPECT_EQ(microllm_generate(model, "Once", &sampling, generated.data(), generated.size(), &length),
            MICROLLM_ERROR_VALUE);
  EXPECT_NE(std::string(microllm_last_error()).find("top_p"), std::string::npos) << microllm_last_error();
  microllm_model_free(model);

  microllm_model* missing = nullptr;
  EXPECT_EQ(microllm_model_load("/nonexistent/model", "cpu", "f32", &missing), MICROLLM_ERROR_IO);
  EXPECT_EQ(missing, nullptr);
}

}  // namespace
}  // namespace microllm

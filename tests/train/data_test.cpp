// Training data: the byte tokenizer, token files (round trip, uint16/uint32, corrupt headers), the batch
// sampler (determinism, state), validation windows, and prepare on a small text.
#include "microllm/train/data.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../tokenizer/tokenizer_test_util.h"
#include "microllm/io/atomic_file.h"
#include "microllm/tokenizer/tokenizer.h"
#include "test_support.h"

namespace microllm::train {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() / ("microllm_data_test_" + std::to_string(::getpid()) + "_" +
                                           ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

TEST(ByteTokenizer, BytesAndSpecialTokensRoundTrip) {
  ByteTokenizer tok({"<|endoftext|>"});
  EXPECT_EQ(tok.vocab_size(), 257);
  const std::string text = "h\xC3\xA9<|endoftext|>!";
  const std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{104, 0xC3, 0xA9, 256, 33}));
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(ByteTokenizer().encode("<|endoftext|>").size(), 13u);
}

TEST(TokenFile, RoundTripsUint16AndUint32) {
  TempDir dir;
  const std::vector<int32_t> small{0, 255, 17, 65535};
  write_token_file(dir / "a.bin", small, 65536, 4, "bytes");
  const TokenFile a = TokenFile::open(dir / "a.bin");
  EXPECT_EQ(a.info().id_bytes, 2u);
  EXPECT_EQ(a.size(), 4);
  EXPECT_EQ(a.info().tokenizer, "bytes");
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(a[i], small[static_cast<size_t>(i)]);
  EXPECT_EQ(fs::file_size(dir / "a.bin"), 64u + 8u);
  const std::vector<int32_t> large{70000, 3, 151935};
  write_token_file(dir / "b.bin", large, 151936, 12, "hf:tokenizer.json");
  const TokenFile b = TokenFile::open(dir / "b.bin");
  EXPECT_EQ(b.info().id_bytes, 4u);
  EXPECT_EQ(b.info().vocab_size, 151936u);
  EXPECT_DOUBLE_EQ(b.bytes_per_token(), 4.0);
  std::vector<int64_t> out(3);
  b.read(0, 3, out.data());
  EXPECT_EQ(out, (std::vector<int64_t>{70000, 3, 151935}));
  EXPECT_THROW(b.read(1, 3, out.data()), IndexError);
  EXPECT_THROW(write_token_file(dir / "c.bin", large, 1000, 0, "bytes"), ValueError);  // id outside the vocab
}

// Overwrites bytes of a valid file and expects a ParseError whose message names the problem.
void expect_corrupt(const std::string& path, size_t offset, const std::string& bytes, const std::string& what) {
  std::string content = io::read_text_file(path);
  content.replace(offset, bytes.size(), bytes);
  const std::string bad = path + ".bad";
  io::write_text_atomically(bad, content);
  try {
    TokenFile::open(bad);
    ADD_FAILURE() << "no error for " << what;
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(TokenFile, CorruptHeadersAreParseErrors) {
  TempDir dir;
  const std::string path = dir / "ok.bin";
  write_token_file(path, std::vector<int32_t>{1, 2, 3}, 256, 3, "bytes");
  expect_corrupt(path, 0, "NOTTOKEN", "bad magic");
  expect_corrupt(path, 8, std::string("\x02\0\0\0", 4), "unsupported version");
  expect_corrupt(path, 12, std::string("\x03\0\0\0", 4), "bytes per id");
  expect_corrupt(path, 24, std::string("\x09\0\0\0", 4), "the header says 9 ids");
  expect_corrupt(path, 16, std::string("\x02\0\0\0", 4), "outside the vocabulary");  // vocab 2, ids up to 3
  io::write_text_atomically(dir / "short.bin", "MLLMTOK");
  EXPECT_THROW(TokenFile::open(dir / "short.bin"), ParseError);
  EXPECT_THROW(TokenFile::open(dir / "missing.bin"), IoError);
}

TEST(BatchSampler, SeededWindowsAreShiftedByOneAndReplayFromTheState) {
  TempDir dir;
  std::vector<int32_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 251);
  write_token_file(dir / "t.bin", ids, 256, ids.size(), "bytes");
  const TokenFile file = TokenFile::open(dir / "t.bin");
  BatchSampler a(file, 4, 16, 42), b(file, 4, 16, 42), c(file, 4, 16, 43);
  const Batch first = a.next();
  EXPECT_EQ(first.ids.shape(), (Shape{4, 16}));
  EXPECT_EQ(first.ids.to_vector<int64_t>(), b.next().ids.to_vector<int64_t>());
  EXPECT_NE(first.ids.to_vector<int64_t>(), c.next().ids.to_vector<int64_t>());
  const std::vector<int64_t> x = first.ids.to_vector<int64_t>(), y = first.targets.to_vector<int64_t>();
  for (size_t i = 0; i + 1 < x.size(); ++i) {
    if ((i + 1) % 16 != 0) {
      EXPECT_EQ(x[i + 1], y[i]);
    }
  }
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], (x[i] + 1) % 251);
  // Saving (seed, offset) and restoring it replays the next batches.
  const uint64_t seed = a.generator().seed(), offset = a.generator().offset();
  const Batch second = a.next();
  BatchSampler restored(file, 4, 16, 0);
  restored.set_state(seed, offset, 1);
  EXPECT_EQ(restored.next().ids.to_vector<int64_t>(), second.ids.to_vector<int64_t>());
  EXPECT_EQ(restored.batches_drawn(), 2);
  EXPECT_THROW(BatchSampler(file, 1, 1000, 0), ValueError);
}

TEST(Validation, FixedWindowsSpreadOverTheFile) {
  TempDir dir;
  std::vector<int32_t> ids(10000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 200);
  write_token_file(dir / "v.bin", ids, 256, ids.size(), "bytes");
  const TokenFile file = TokenFile::open(dir / "v.bin");
  const std::vector<Batch> a = validation_batches(file, 4, 32, 3), b = validation_batches(file, 4, 32, 3);
  ASSERT_EQ(a.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].ids.to_vector<int64_t>(), b[i].ids.to_vector<int64_t>());
  EXPECT_GT(a.back().ids.to_vector<int64_t>().back(), 0);
  // A short file still gives one batch.
  write_token_file(dir / "w.bin", std::vector<int32_t>(40, 7), 256, 40, "bytes");
  EXPECT_EQ(validation_batches(TokenFile::open(dir / "w.bin"), 2, 32, 10).size(), 1u);
}

TEST(Prepare, WritesTrainAndValSplitsOfASmallText) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 400; ++i) text += "In the beginning " + std::to_string(i) + "\n";
  io::write_text_atomically(dir / "a.txt", text);
  io::write_text_atomically(dir / "b.txt", "no newline at the end");
  PrepareOptions options;
  options.inputs = {dir / "a.txt", dir / "b.txt"};
  options.output = dir / "out/corpus.bin";
  options.val_fraction = 0.25;
  options.block_tokens = 512;
  const PrepareResult r = prepare_token_files(options);
  EXPECT_EQ(r.train_path, dir / "out/corpus.train.bin");
  EXPECT_EQ(r.val_path, dir / "out/corpus.val.bin");
  EXPECT_EQ(r.text_bytes, text.size() + 21);
  EXPECT_EQ(r.train_tokens + r.val_tokens, static_cast<int64_t>(r.text_bytes));
  EXPECT_NEAR(static_cast<double>(r.val_tokens) / static_cast<double>(r.text_bytes), 0.25, 0.1);
  const TokenFile train = TokenFile::open(r.train_path), val = TokenFile::open(r.val_path);
  EXPECT_EQ(train.size(), r.train_tokens);
  EXPECT_EQ(val.info().text_bytes, static_cast<uint64_t>(r.val_tokens));
  EXPECT_EQ(train.info().tokenizer, "bytes");
  // The splits hold the text's bytes in order: the val blocks are whole blocks of it.
  std::string joined;
  for (int64_t i = 0; i < val.size(); ++i) joined.push_back(static_cast<char>(val[i]));
  EXPECT_NE((text + "no newline at the end").find(joined.substr(0, 512)), std::string::npos);
  options.val_fraction = 1.5;
  EXPECT_THROW(prepare_token_files(options), ValueError);
}

TEST(Prepare, RefusesAnEmptyInputAndSplitsWithAnEmptyPart) {
  TempDir dir;
  io::write_text_atomically(dir / "empty.txt", "");
  std::string text;
  for (uint64_t i = 0, seed = testing::fresh_seed(); i < 100; ++i) text += std::to_string(seed * (i + 1)) + " words\n";
  io::write_text_atomically(dir / "text.txt", text);
  PrepareOptions options;
  options.inputs = {dir / "text.txt", dir / "empty.txt"};
  options.output = dir / "out";
  const std::string empty = testing::thrown_message<ValueError>([&] { prepare_token_files(options); });
  EXPECT_NE(empty.find(dir / "empty.txt"), std::string::npos) << empty;
  EXPECT_NE(empty.find("is empty"), std::string::npos) << empty;
  EXPECT_FALSE(fs::exists(dir / "out.train.bin"));
  // The whole text in one block (block_tokens 8192): no validation part although val_fraction is 0.05.
  options.inputs = {dir / "text.txt"};
  const std::string no_val = testing::thrown_message<ValueError>([&] { prepare_token_files(options); });
  EXPECT_NE(no_val.find("no tokens are left for validation"), std::string::npos) << no_val;
  EXPECT_NE(no_val.find("--block-tokens"), std::string::npos) << no_val;
  // One block sent to validation: no training part.
  options.val_fraction = 0.9;
  const std::string no_train = testing::thrown_message<ValueError>([&] { prepare_token_files(options); });
  EXPECT_NE(no_train.find("no tokens are left for training"), std::string::npos) << no_train;
  // No validation asked for: an empty val file is what was meant.
  options.val_fraction = 0;
  const PrepareResult r = prepare_token_files(options);
  EXPECT_EQ(r.train_tokens, static_cast<int64_t>(text.size()));
  EXPECT_EQ(r.val_tokens, 0);
}

TEST(Prepare, UsesAHuggingFaceTokenizerWhenGiven) {
  TempDir dir;
  // Byte-level BPE with two merges: "th" and "the".
  const auto json = testing::byte_level_json({{"t", "h"}, {"th", "e"}});
  io::write_text_atomically(dir / "tokenizer.json", json.dump());
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the thin thesis\n";
  io::write_text_atomically(dir / "t.txt", text);
  PrepareOptions options;
  options.inputs = {dir / "t.txt"};
  options.output = dir / "bpe";
  options.tokenizer_path = dir / "tokenizer.json";
  options.block_tokens = 64;
  options.val_fraction = 0.1;
  const PrepareResult r = prepare_token_files(options);
  EXPECT_EQ(r.vocab_size, 258);
  EXPECT_EQ(r.tokenizer, "hf:tokenizer.json");
  EXPECT_LT(r.train_tokens + r.val_tokens, static_cast<int64_t>(text.size()));  // merges shorten the stream
  const TokenFile train = TokenFile::open(r.train_path);
  EXPECT_EQ(train.info().vocab_size, 258u);
  EXPECT_GT(train.bytes_per_token(), 1.0);
  const Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  EXPECT_EQ(tok.encode("the")[0], 257);
}

}  // namespace
}  // namespace microllm::train

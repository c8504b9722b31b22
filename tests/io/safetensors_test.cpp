// safetensors: round trips of every dtype (single and sharded), zero-copy reads, and the strict header
// validation on every kind of bad file (each error names the file and what was wrong).
#include "microllm/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "microllm/io/atomic_file.h"
#include "test_support.h"

namespace microllm::io {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("microllm_st_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                        "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file from a raw header (padded by the caller or not) and a data buffer of `data_bytes`.
  std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes,
                        uint64_t claimed_length = UINT64_MAX) {
    const uint64_t length = claimed_length == UINT64_MAX ? header.size() : claimed_length;
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(length >> (8 * i));
    bytes += header;
    bytes.append(data_bytes, '\x01');
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }

  void expect_parse_error(const std::string& file, const std::string& fragment) {
    try {
      SafetensorsFile::open(file);
      ADD_FAILURE() << "expected a ParseError containing '" << fragment << "'";
    } catch (const ParseError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << "the message must name the file: " << e.what();
    }
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripsEveryDtypeWithMetadata) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8, DType::u8, DType::i32, DType::i64,
                      DType::f8_e4m3fn, DType::f8_e5m2}) {
    tensors.emplace_back(std::string("t_") + dtype_name(dtype),
                         testing::random_tensor({3, 5}, dtype, Device::cpu(), -4, 4));
  }
  tensors.emplace_back("scalar", Tensor::full({}, 2.5));
  tensors.emplace_back("empty", Tensor::empty({0, 4}));
  tensors.emplace_back("strided", testing::random_tensor({4, 6}).t());  // written contiguous
  save_safetensors(path("a.safetensors"), tensors, {{"format", "pt"}});
  const SafetensorsFile file = SafetensorsFile::open(path("a.safetensors"));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.tensors().size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    const Tensor got = file.get(name);
    ASSERT_EQ(got.shape(), expected.shape()) << name;
    ASSERT_EQ(got.dtype(), expected.dtype()) << name;
    EXPECT_EQ(got.to(DType::f64).to_vector<double>(), expected.to(DType::f64).to_vector<double>()) << name;
  }
  // Zero copy: the tensor points into the mapping and keeps it alive after the file object is gone.
  Tensor kept;
  {
    const SafetensorsFile again = SafetensorsFile::open(path("a.safetensors"));
    kept = again.get("t_f32");
    EXPECT_FALSE(kept.storage()->owns_memory());
  }
  EXPECT_EQ(kept.to_vector<float>(), tensors[0].second.to_vector<float>());
  EXPECT_THROW(file.get("missing"), IndexError);
}

TEST_F(SafetensorsTest, ShardedCheckpointsAndTheirIndex) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int i = 0; i < 5; ++i) tensors.emplace_back("layer." + std::to_string(i), testing::random_tensor({100}));
  save_safetensors_sharded(dir_.string(), "model", tensors, 900);  // 400 bytes each: two per shard
  EXPECT_TRUE(fs::exists(path("model-00001-of-00003.safetensors")));
  EXPECT_TRUE(fs::exists(path("model-00003-of-00003.safetensors")));
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(dir_.string());
  EXPECT_EQ(checkpoint.files().size(), 3u);
  EXPECT_EQ(checkpoint.names().size(), 5u);
  EXPECT_EQ(checkpoint.get("layer.4").to_vector<float>(), tensors[4].second.to_vector<float>());
  // A missing shard is an error naming it.
  fs::remove(path("model-00002-of-00003.safetensors"));
  try {
    SafetensorsCheckpoint::open(dir_.string());
    ADD_FAILURE() << "expected an IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00003.safetensors"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, StrictHeaderValidation) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW(SafetensorsFile::open(write_raw("ok.st", ok, 8)));
  std::ofstream(path("short.st"), std::ios::binary) << "abc";
  expect_parse_error(path("short.st"), "fewer than the 8-byte header length");
  expect_parse_error(write_raw("huge_len.st", ok, 8, uint64_t{1} << 62), "exceeds the limit");
  expect_parse_error(write_raw("past_end.st", ok, 8, ok.size() + 100), "runs past the end of the file");
  expect_parse_error(write_raw("bad_json.st", "{\"a\": ", 0), "not valid JSON");
  expect_parse_error(write_raw("bad_utf8.st", "{\"a\xff\":{}}", 0), "not valid JSON");
  expect_parse_error(write_raw("not_object.st", "[1, 2]", 0), "must be a JSON object");
  expect_parse_error(write_raw("dtype.st", R"({"a":{"dtype":"F13","shape":[2],"data_offsets":[0,8]}})", 8),
                     "unsupported dtype 'F13'");
  expect_parse_error(write_raw("size.st", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                     "needs 3 x 4 bytes");
  expect_parse_error(write_raw("reversed.st", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 8),
                     "reversed");
  expect_parse_error(write_raw("beyond.st", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
                     "past the data buffer");
  expect_parse_error(write_raw("overlap.st",
                               R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                               8),
                     "overlaps");
  expect_parse_error(write_raw("hole.st", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                     "has a hole");
  expect_parse_error(write_raw("trailing.st", ok, 12), "trailing bytes");
  expect_parse_error(write_raw("negative.st", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                     "non-negative integer");
  expect_parse_error(write_raw("overflow.st",
                               R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})", 8),
                     "overflows");
  expect_parse_error(write_raw("meta.st", R"({"__metadata__":{"k":1}})", 0), "__metadata__.k must be a string");
  EXPECT_THROW(SafetensorsFile::open(path("does_not_exist.st")), IoError);
}

TEST_F(SafetensorsTest, AtomicWritesLeaveNoPartialFiles) {
  write_text_atomically(path("state.json"), "first");
  EXPECT_EQ(read_text_file(path("state.json")), "first");
  // A writer that fails halfway leaves the old file untouched and no temporary behind.
  EXPECT_THROW(write_file_atomically(path("state.json"),
                                     [&](int fd) {
                                       write_all(fd, "partial", 7, path("state.json"));
                                       throw IoError("test", "simulated crash");
                                     }),
               IoError);
  EXPECT_EQ(read_text_file(path("state.json")), "first");
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) files += entry.is_regular_file();
  EXPECT_EQ(files, 1);
}

}  // namespace
}  // namespace microllm::io

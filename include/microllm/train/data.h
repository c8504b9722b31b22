// Training data: a byte-level tokenizer, token files, `prepare` (text files -> train and val token files)
// and the batch sampler.
//
// Token file (little-endian; a 64-byte header, then the ids, read through a memory map):
//   0  char[8]  magic "MLLMTOK\0"
//   8  u32      version (1)
//   12 u32      bytes per id: 2 (uint16) or 4 (uint32)
//   16 u64      vocab size (every id is below it)
//   24 u64      count of ids
//   32 u64      bytes of text the ids encode (nats/byte = nats/token * count / text_bytes)
//   40 char[24] tokenizer: "bytes", or "hf:" + the tokenizer's file name; NUL-padded
//   64 ids
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "microllm/core/random.h"
#include "microllm/core/tensor.h"

namespace microllm::train {

// Bytes are ids 0..255; special tokens (optional) follow at 256, 257, ... and are recognised in text.
class ByteTokenizer {
 public:
  explicit ByteTokenizer(std::vector<std::string> special_tokens = {});
  std::vector<int32_t> encode(std::string_view text) const;
  // Special tokens decode to their text; ids past the vocabulary are skipped.
  std::string decode(std::span<const int32_t> ids) const;
  int64_t vocab_size() const { return 256 + static_cast<int64_t>(special_tokens_.size()); }
  std::optional<int32_t> special_id(std::string_view token) const;
  const std::vector<std::string>& special_tokens() const { return special_tokens_; }

 private:
  std::vector<std::string> special_tokens_;
};

struct TokenFileInfo {
  uint32_t version = 1;
  uint32_t id_bytes = 2;
  uint64_t vocab_size = 256;
  uint64_t count = 0;
  uint64_t text_bytes = 0;
  std::string tokenizer = "bytes";
};

// Writes `ids` (each below vocab_size) atomically; uint16 ids when vocab_size <= 65536, else uint32.
void write_token_file(const std::string& path, std::span<const int32_t> ids, uint64_t vocab_size, uint64_t text_bytes,
                      const std::string& tokenizer);

// A token file, mapped. Opening validates the header and the size (ParseError naming the file and the
// field) and that every id is below the vocabulary size.
class TokenFile {
 public:
  static TokenFile open(const std::string& path);
  const std::string& path() const { return path_; }
  const TokenFileInfo& info() const { return info_; }
  int64_t size() const { return static_cast<int64_t>(info_.count); }
  int32_t operator[](int64_t i) const;
  // ids [start, start + n) into out (i64).
  void read(int64_t start, int64_t n, int64_t* out) const;
  // bytes of text per token: nats/byte = nats/token / bytes_per_token.
  double bytes_per_token() const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  const uint8_t* ids_ = nullptr;
  TokenFileInfo info_;
};

// ids [B, T] and targets [B, T] (i64, on the CPU): windows [B, T + 1] of the token stream, shifted by one.
struct Batch {
  Tensor ids, targets;
};

// Random windows from a seeded generator. The generator's (seed, offset) is the sampler's whole state:
// restoring it replays the same batches.
class BatchSampler {
 public:
  BatchSampler(const TokenFile& file, int64_t batch, int64_t seq_len, uint64_t seed);
  Batch next();
  Generator& generator() { return gen_; }
  const Generator& generator() const { return gen_; }
  int64_t batches_drawn() const { return drawn_; }
  void set_state(uint64_t seed, uint64_t offset, int64_t batches_drawn);

 private:
  const TokenFile* file_;
  int64_t batch_, seq_len_;
  Generator gen_;
  int64_t drawn_ = 0;
};

// Fixed validation windows: up to max_batches batches of [B, T + 1] windows evenly spaced over the file
// (the same every evaluation, so losses compare across steps).
std::vector<Batch> validation_batches(const TokenFile& file, int64_t batch, int64_t seq_len, int64_t max_batches);

// `microllm prepare`: tokenizes text files (bytes, or a Hugging Face tokenizer when tokenizer_path is set)
// and writes <output>.train.bin and <output>.val.bin (and <output>.tokenizer.json, a copy of the Hugging
// Face tokenizer, which training copies into its checkpoints). The stream is cut into blocks of block_tokens; a
// val_fraction of the blocks, spread evenly, goes to validation. A file that does not end in a newline is
// joined to the next with one. Each split's text_bytes is exact for bytes, proportional for BPE.
// ValueError for an empty input file (naming it), and for a split that leaves no training tokens, or no
// validation tokens although val_fraction > 0 (a text of one block: a smaller block_tokens splits it).
struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string output;          // prefix; a trailing ".bin" is dropped
  std::string tokenizer_path;  // empty: the byte tokenizer
  double val_fraction = 0.05;
  int64_t block_tokens = 8192;
};

struct PrepareResult {
  std::string train_path, val_path;
  int64_t train_tokens = 0, val_tokens = 0;
  uint64_t text_bytes = 0;
  int64_t vocab_size = 0;
  std::string tokenizer;
  std::string tokenizer_copy;  // <output>.tokenizer.json: the tokenizer.json used, for training and generation
};

PrepareResult prepare_token_files(const PrepareOptions& options);

}  // namespace microllm::train

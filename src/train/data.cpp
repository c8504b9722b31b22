#include "microllm/train/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "microllm/io/atomic_file.h"
#include "microllm/tokenizer/tokenizer.h"

namespace microllm::train {
namespace {

constexpr char kMagic[8] = {'M', 'L', 'L', 'M', 'T', 'O', 'K', '\0'};
constexpr size_t kHeaderBytes = 64;
constexpr size_t kTokenizerField = 24;

template <typename T>
void put(uint8_t* header, size_t offset, T value) {
  std::memcpy(header + offset, &value, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
}

template <typename T>
T get(const uint8_t* header, size_t offset) {
  T value;
  std::memcpy(&value, header + offset, sizeof(T));
  return value;
}

}  // namespace

// ---- ByteTokenizer ----

ByteTokenizer::ByteTokenizer(std::vector<std::string> special_tokens) : special_tokens_(std::move(special_tokens)) {
  for (const std::string& s : special_tokens_) {
    MICROLLM_CHECK(!s.empty(), ValueError, "byte_tokenizer", "a special token cannot be empty");
  }
}

std::optional<int32_t> ByteTokenizer::special_id(std::string_view token) const {
  for (size_t i = 0; i < special_tokens_.size(); ++i) {
    if (special_tokens_[i] == token) return static_cast<int32_t>(256 + i);
  }
  return std::nullopt;
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    bool matched = false;
    for (size_t s = 0; s < special_tokens_.size() && !matched; ++s) {
      if (text.substr(i, special_tokens_[s].size()) == special_tokens_[s]) {
        ids.push_back(static_cast<int32_t>(256 + s));
        i += special_tokens_[s].size();
        matched = true;
      }
    }
    if (!matched) ids.push_back(static_cast<int32_t>(static_cast<uint8_t>(text[i++])));
  }
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(static_cast<uint8_t>(id)));
    } else if (id >= 256 && id < vocab_size()) {
      out += special_tokens_[static_cast<size_t>(id - 256)];
    }
  }
  return out;
}

// ---- token files ----

void write_token_file(const std::string& path, std::span<const int32_t> ids, uint64_t vocab_size, uint64_t text_bytes,
                      const std::string& tokenizer) {
  MICROLLM_CHECK(vocab_size > 0 && vocab_size <= (uint64_t{1} << 32), ValueError, path, "vocab size ", vocab_size,
                 " does not fit uint32 ids");
  const uint32_t id_bytes = vocab_size <= 65536 ? 2 : 4;
  uint8_t header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, 8);
  put<uint32_t>(header, 8, 1);
  put<uint32_t>(header, 12, id_bytes);
  put<uint64_t>(header, 16, vocab_size);
  put<uint64_t>(header, 24, ids.size());
  put<uint64_t>(header, 32, text_bytes);
  std::memcpy(header + 40, tokenizer.data(), std::min(tokenizer.size(), kTokenizerField - 1));
  std::vector<uint8_t> body(ids.size() * id_bytes);
  for (size_t i = 0; i < ids.size(); ++i) {
    MICROLLM_CHECK(ids[i] >= 0 && static_cast<uint64_t>(ids[i]) < vocab_size, ValueError, path, "id ", ids[i], " at ",
                   i, " is outside the vocabulary of ", vocab_size);
    if (id_bytes == 2) {
      put<uint16_t>(body.data(), i * 2, static_cast<uint16_t>(ids[i]));
    } else {
      put<uint32_t>(body.data(), i * 4, static_cast<uint32_t>(ids[i]));
    }
  }
  io::write_file_atomically(path, [&](int fd) {
    io::write_all(fd, header, kHeaderBytes, path);
    io::write_all(fd, body.data(), body.size(), path);
  });
}

struct TokenFile::Mapping {
  void* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data != nullptr && data != MAP_FAILED) ::munmap(data, size);
  }
};

TokenFile TokenFile::open(const std::string& path) {
  TokenFile file;
  file.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(path, str_cat("cannot open the token file: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw IoError(path, str_cat("cannot stat: ", std::strerror(errno)));
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size < kHeaderBytes) {
    ::close(fd);
    throw ParseError(path, str_cat("file of ", size, " bytes is shorter than the 64-byte token file header"));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->size = size;
  mapping->data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping->data == MAP_FAILED) throw IoError(path, str_cat("cannot map the file: ", std::strerror(errno)));
  const auto* bytes = static_cast<const uint8_t*>(mapping->data);
  MICROLLM_CHECK(std::memcmp(bytes, kMagic, 8) == 0, ParseError, path,
                 "bad magic: not a microLLM token file (expected \"MLLMTOK\")");
  TokenFileInfo& info = file.info_;
  info.version = get<uint32_t>(bytes, 8);
  MICROLLM_CHECK(info.version == 1, ParseError, path, "unsupported version ", info.version, " (this build reads 1)");
  info.id_bytes = get<uint32_t>(bytes, 12);
  MICROLLM_CHECK(info.id_bytes == 2 || info.id_bytes == 4, ParseError, path, "bytes per id must be 2 or 4, got ",
                 info.id_bytes);
  info.vocab_size = get<uint64_t>(bytes, 16);
  MICROLLM_CHECK(info.vocab_size > 0 && info.vocab_size <= (uint64_t{1} << (8 * info.id_bytes)), ParseError, path,
                 "vocab size ", info.vocab_size, " does not fit ", info.id_bytes, "-byte ids");
  info.count = get<uint64_t>(bytes, 24);
  MICROLLM_CHECK(
      info.count <= (size - kHeaderBytes) / info.id_bytes && kHeaderBytes + info.count * info.id_bytes == size,
      ParseError, path, "the header says ", info.count, " ids of ", info.id_bytes, " bytes but the file has ",
      size - kHeaderBytes, " bytes after the header");
  info.text_bytes = get<uint64_t>(bytes, 32);
  const char* name = reinterpret_cast<const char*>(bytes + 40);
  info.tokenizer.assign(name, strnlen(name, kTokenizerField));
  file.mapping_ = std::move(mapping);
  file.ids_ = bytes + kHeaderBytes;
  for (int64_t i = 0; i < file.size(); ++i) {
    const int32_t id = file[i];
    if (id < 0 || static_cast<uint64_t>(id) >= info.vocab_size) {
      throw ParseError(path, str_cat("id ", static_cast<uint32_t>(id), " at position ", i,
                                     " is outside the vocabulary of ", info.vocab_size));
    }
  }
  return file;
}

int32_t TokenFile::operator[](int64_t i) const {
  if (info_.id_bytes == 2) return get<uint16_t>(ids_, static_cast<size_t>(i) * 2);
  return static_cast<int32_t>(get<uint32_t>(ids_, static_cast<size_t>(i) * 4));
}

void TokenFile::read(int64_t start, int64_t n, int64_t* out) const {
  MICROLLM_CHECK(start >= 0 && n >= 0 && start + n <= size(), IndexError, path_, "range [", start, ", ", start + n,
                 ") outside the ", size(), " ids");
  for (int64_t i = 0; i < n; ++i) out[i] = (*this)[start + i];
}

double TokenFile::bytes_per_token() const {
  if (info_.count == 0 || info_.text_bytes == 0) return 1.0;
  return static_cast<double>(info_.text_bytes) / static_cast<double>(info_.count);
}

// ---- batches ----

namespace {
Batch make_batch(const TokenFile& file, const std::vector<int64_t>& starts, int64_t seq_len) {
  const auto batch = static_cast<int64_t>(starts.size());
  Batch out{Tensor::empty({batch, seq_len}, DType::i64), Tensor::empty({batch, seq_len}, DType::i64)};
  std::vector<int64_t> window(static_cast<size_t>(seq_len + 1));
  for (int64_t b = 0; b < batch; ++b) {
    file.read(starts[static_cast<size_t>(b)], seq_len + 1, window.data());
    std::copy(window.begin(), window.end() - 1, out.ids.data<int64_t>() + b * seq_len);
    std::copy(window.begin() + 1, window.end(), out.targets.data<int64_t>() + b * seq_len);
  }
  return out;
}
}  // namespace

BatchSampler::BatchSampler(const TokenFile& file, int64_t batch, int64_t seq_len, uint64_t seed)
    : file_(&file), batch_(batch), seq_len_(seq_len), gen_(seed) {
  MICROLLM_CHECK(batch > 0 && seq_len > 0, ValueError, "sampler", "batch and seq_len must be > 0, got ", batch, ", ",
                 seq_len);
  MICROLLM_CHECK(file.size() > seq_len, ValueError, "sampler", file.path(), " has ", file.size(),
                 " tokens: too few for windows of ", seq_len + 1);
}

Batch BatchSampler::next() {
  std::vector<int64_t> starts(static_cast<size_t>(batch_));
  const auto windows = static_cast<uint64_t>(file_->size() - seq_len_);  // starts in [0, size - T - 1]
  for (int64_t& s : starts) s = static_cast<int64_t>(gen_.next_below(windows));
  ++drawn_;
  return make_batch(*file_, starts, seq_len_);
}

void BatchSampler::set_state(uint64_t seed, uint64_t offset, int64_t batches_drawn) {
  gen_.set_state(seed, offset);
  drawn_ = batches_drawn;
}

std::vector<Batch> validation_batches(const TokenFile& file, int64_t batch, int64_t seq_len, int64_t max_batches) {
  MICROLLM_CHECK(file.size() > seq_len, ValueError, "validation", file.path(), " has ", file.size(),
                 " tokens: too few for windows of ", seq_len + 1);
  // Non-overlapping windows when the file is long enough, else evenly spaced overlapping ones.
  const int64_t available = file.size() - seq_len;  // window starts in [0, available)
  const int64_t windows = std::max<int64_t>(1, std::min(max_batches * batch, (file.size() - 1) / seq_len));
  const int64_t batches = std::max<int64_t>(1, windows / batch);
  std::vector<Batch> out;
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<int64_t> starts(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t w = b * batch + i;
      starts[static_cast<size_t>(i)] = std::min(available - 1, w * available / std::max<int64_t>(batches * batch, 1));
    }
    out.push_back(make_batch(file, starts, seq_len));
  }
  return out;
}

// ---- prepare ----

PrepareResult prepare_token_files(const PrepareOptions& options) {
  MICROLLM_CHECK(!options.inputs.empty(), ValueError, "prepare", "no input files");
  MICROLLM_CHECK(options.val_fraction >= 0 && options.val_fraction < 1, ValueError, "prepare",
                 "val_fraction must be in [0, 1), got ", options.val_fraction);
  MICROLLM_CHECK(options.block_tokens > 0, ValueError, "prepare", "block_tokens must be > 0");
  std::string text;
  for (const std::string& input : options.inputs) {
    std::string part = io::read_text_file(input);
    MICROLLM_CHECK(!part.empty(), ValueError, "prepare", input, " is empty: there is no text to tokenize");
    if (!text.empty() && text.back() != '\n') text.push_back('\n');
    text += part;
  }
  PrepareResult result;
  std::vector<int32_t> ids;
  if (options.tokenizer_path.empty()) {
    ids = ByteTokenizer().encode(text);
    result.vocab_size = 256;
    result.tokenizer = "bytes";
  } else {
    const Tokenizer tok = Tokenizer::load(options.tokenizer_path);
    ids = tok.encode(text);
    result.vocab_size = static_cast<int64_t>(tok.vocab_size());
    for (int32_t id : ids) result.vocab_size = std::max<int64_t>(result.vocab_size, int64_t{id} + 1);
    result.tokenizer = "hf:" + std::filesystem::path(options.tokenizer_path).filename().string();
  }
  result.text_bytes = text.size();
  // Blocks b with round((b + 1) f) > round(b f) go to validation: a fraction f of them, evenly spread
  // (the first near block 1 / 2f). A text too short for that still gives its last block when f > 0.
  std::vector<int32_t> train_ids, val_ids;
  const int64_t total = static_cast<int64_t>(ids.size());
  const int64_t blocks = (total + options.block_tokens - 1) / options.block_tokens;
  const double f = options.val_fraction;
  const bool any_val = std::floor(static_cast<double>(blocks) * f + 0.5) > 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const bool val =
        (std::floor(static_cast<double>(b + 1) * f + 0.5) > std::floor(static_cast<double>(b) * f + 0.5)) ||
        (!any_val && f > 0 && blocks > 1 && b == blocks - 1);
    auto begin = ids.begin() + b * options.block_tokens;
    auto end = ids.begin() + std::min(total, (b + 1) * options.block_tokens);
    (val ? val_ids : train_ids).insert((val ? val_ids : train_ids).end(), begin, end);
  }
  MICROLLM_CHECK(!train_ids.empty(), ValueError, "prepare", "no tokens are left for training: val_fraction ", f,
                 " sends all ", blocks, " block(s) of the ", total, " tokens (block_tokens ", options.block_tokens,
                 ") to validation; lower --val-fraction or --block-tokens");
  MICROLLM_CHECK(!val_ids.empty() || f == 0, ValueError, "prepare", "no tokens are left for validation: the ", total,
                 " tokens fit in one block of block_tokens ", options.block_tokens, "; pass --block-tokens ",
                 std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(total) * f)), " (so that val_fraction ",
                 f, " makes a block), or --val-fraction 0 for no validation");
  std::string prefix = options.output;
  if (prefix.size() > 4 && prefix.ends_with(".bin")) prefix.resize(prefix.size() - 4);
  MICROLLM_CHECK(!prefix.empty(), ValueError, "prepare", "empty output path");
  const std::filesystem::path parent = std::filesystem::path(prefix).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  result.train_path = prefix + ".train.bin";
  result.val_path = prefix + ".val.bin";
  result.train_tokens = static_cast<int64_t>(train_ids.size());
  result.val_tokens = static_cast<int64_t>(val_ids.size());
  const double bytes_per_token = total > 0 ? static_cast<double>(result.text_bytes) / static_cast<double>(total) : 1.0;
  auto split_bytes = [&](size_t tokens) {
    return options.tokenizer_path.empty()
               ? static_cast<uint64_t>(tokens)
               : static_cast<uint64_t>(std::llround(bytes_per_token * static_cast<double>(tokens)));
  };
  const auto vocab = static_cast<uint64_t>(result.vocab_size);
  write_token_file(result.train_path, train_ids, vocab, split_bytes(train_ids.size()), result.tokenizer);
  write_token_file(result.val_path, val_ids, vocab, split_bytes(val_ids.size()), result.tokenizer);
  if (!options.tokenizer_path.empty()) {  // beside the ids, so that training finds it for its checkpoints
    const std::filesystem::path source = std::filesystem::is_directory(options.tokenizer_path)
                                             ? std::filesystem::path(options.tokenizer_path) / "tokenizer.json"
                                             : std::filesystem::path(options.tokenizer_path);
    if (std::filesystem::exists(source)) {
      result.tokenizer_copy = prefix + ".tokenizer.json";
      io::write_text_atomically(result.tokenizer_copy, io::read_text_file(source.string()));
    }
  }
  return result;
}

}  // namespace microllm::train

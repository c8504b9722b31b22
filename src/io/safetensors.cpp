#include "microllm/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "microllm/io/atomic_file.h"

namespace microllm::io {

namespace fs = std::filesystem;
using nlohmann::json;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors is little-endian; so is every host we target");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {{"F32", DType::f32},   {"F16", DType::f16},         {"BF16", DType::bf16},
                                     {"F64", DType::f64},   {"I8", DType::i8},           {"U8", DType::u8},
                                     {"I32", DType::i32},   {"I64", DType::i64},         {"F8_E4M3", DType::f8_e4m3fn},
                                     {"F8_E5M2", DType::f8_e5m2}, {"BOOL", DType::u8}};

bool parse_dtype_name(const std::string& name, DType* out) {
  for (const DTypeName& d : kDTypeNames) {
    if (name == d.name) {
      *out = d.dtype;
      return true;
    }
  }
  return false;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint64_t field_u64(const json& value, const std::string& origin, const std::string& what) {
  MICROLLM_CHECK(value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0), ParseError,
                 origin, what, " must be a non-negative integer, got ", value.dump());
  return value.get<uint64_t>();
}

}  // namespace

struct SafetensorsFile::Mapping {
  void* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data && size) ::munmap(data, size);
  }
};

std::vector<TensorInfo> SafetensorsFile::parse_header(const uint8_t* bytes, size_t size, const std::string& origin,
                                                      std::map<std::string, std::string>* metadata) {
  MICROLLM_CHECK(size >= 8, ParseError, origin, "the file has ", size, " bytes, fewer than the 8-byte header length");
  const uint64_t header_bytes = read_u64_le(bytes);
  MICROLLM_CHECK(header_bytes <= kMaxHeaderBytes, ParseError, origin, "header length ", header_bytes,
                 " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  MICROLLM_CHECK(header_bytes <= size - 8, ParseError, origin, "header length ", header_bytes,
                 " runs past the end of the file (", size, " bytes)");
  const json header = detail::parse_json(std::string_view(reinterpret_cast<const char*>(bytes) + 8, header_bytes),
                                         origin, "the header is not valid JSON");
  MICROLLM_CHECK(header.is_object(), ParseError, origin, "the header must be a JSON object");
  const uint64_t data_size = size - 8 - header_bytes;
  std::vector<TensorInfo> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      MICROLLM_CHECK(entry.is_object(), ParseError, origin, "__metadata__ must be an object of strings");
      for (const auto& [key, value] : entry.items()) {
        MICROLLM_CHECK(value.is_string(), ParseError, origin, "__metadata__.", key, " must be a string");
        if (metadata) (*metadata)[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    MICROLLM_CHECK(entry.is_object(), ParseError, origin, where, " must be an object");
    MICROLLM_CHECK(entry.contains("dtype") && entry["dtype"].is_string(), ParseError, origin, where,
                   ": dtype is missing or not a string");
    MICROLLM_CHECK(entry.contains("shape") && entry["shape"].is_array(), ParseError, origin, where,
                   ": shape is missing or not an array");
    MICROLLM_CHECK(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                       entry["data_offsets"].size() == 2,
                   ParseError, origin, where, ": data_offsets must be [begin, end]");
    TensorInfo info;
    info.name = name;
    const std::string dtype_name = entry["dtype"].get<std::string>();
    MICROLLM_CHECK(parse_dtype_name(dtype_name, &info.dtype), ParseError, origin, where, ": unsupported dtype '",
                   dtype_name, "'");
    MICROLLM_CHECK(entry["shape"].size() <= static_cast<size_t>(kMaxDims), ParseError, origin, where, ": rank ",
                   entry["shape"].size(), " exceeds ", kMaxDims);
    uint64_t numel = 1;
    for (const json& dim : entry["shape"]) {
      const uint64_t d = field_u64(dim, origin, where + " shape entry");
      MICROLLM_CHECK(d < (uint64_t{1} << 62) && !__builtin_mul_overflow(numel, d, &numel), ParseError, origin, where,
                     ": shape ", entry["shape"].dump(), " overflows");
      info.shape.push_back(static_cast<int64_t>(d));
    }
    info.data_begin = field_u64(entry["data_offsets"][0], origin, where + " data_offsets[0]");
    info.data_end = field_u64(entry["data_offsets"][1], origin, where + " data_offsets[1]");
    MICROLLM_CHECK(info.data_begin <= info.data_end, ParseError, origin, where, ": data_offsets [", info.data_begin,
                   ", ", info.data_end, "] are reversed");
    uint64_t expected_bytes = 0;
    MICROLLM_CHECK(!__builtin_mul_overflow(numel, dtype_size(info.dtype), &expected_bytes) &&
                       expected_bytes == info.data_end - info.data_begin,
                   ParseError, origin, where, ": shape ", entry["shape"].dump(), " of ", dtype_name, " needs ",
                   numel, " x ", dtype_size(info.dtype), " bytes but data_offsets cover ",
                   info.data_end - info.data_begin);
    MICROLLM_CHECK(info.data_end <= data_size, ParseError, origin, where, ": data_offsets end ", info.data_end,
                   " lies past the data buffer of ", data_size, " bytes");
    tensors.push_back(std::move(info));
  }
  // The tensors must tile the data buffer: sorted by offset, each starts where the previous ended.
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  uint64_t expected = 0;
  for (const TensorInfo& t : tensors) {
    MICROLLM_CHECK(t.data_begin >= expected, ParseError, origin, "tensor '", t.name, "' at [", t.data_begin, ", ",
                   t.data_end, ") overlaps the previous tensor, which ends at ", expected);
    MICROLLM_CHECK(t.data_begin == expected, ParseError, origin, "the data buffer has a hole at [", expected, ", ",
                   t.data_begin, ") before tensor '", t.name, "'");
    expected = t.data_end;
  }
  MICROLLM_CHECK(expected == data_size, ParseError, origin, "the data buffer has ", data_size - expected,
                 " trailing bytes that no tensor covers");
  return tensors;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(path, str_cat("cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw IoError(path, str_cat("cannot stat: ", std::strerror(errno)));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->size = static_cast<size_t>(st.st_size);
  if (mapping->size > 0) {
    void* data = ::mmap(nullptr, mapping->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      ::close(fd);
      throw IoError(path, str_cat("cannot map ", mapping->size, " bytes: ", std::strerror(errno)));
    }
    mapping->data = data;
  }
  ::close(fd);  // the mapping stays valid
  file.mapping_ = mapping;
  const auto* bytes = static_cast<const uint8_t*>(mapping->data);
  file.tensors_ = parse_header(bytes ? bytes : reinterpret_cast<const uint8_t*>(""), mapping->size, path, &file.metadata_);
  file.data_start_ = 8 + read_u64_le(bytes);
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_[file.tensors_[i].name] = i;
  return file;
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) > 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  MICROLLM_CHECK(it != index_.end(), IndexError, path_, "no tensor named '", name, "'");
  return tensors_[it->second];
}

size_t SafetensorsFile::file_size() const { return mapping_ ? mapping_->size : 0; }

Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& t = info(name);
  char* data = static_cast<char*>(mapping_->data) + data_start_ + t.data_begin;
  if (t.data_end == t.data_begin) return Tensor::empty(t.shape, t.dtype);
  const Tensor view = Tensor::from_blob(data, t.shape, t.dtype, Device::cpu(), mapping_);
  // Misaligned data (a header not padded to 8 bytes) is copied, so kernels read aligned elements.
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(t.dtype) != 0) {
    Tensor aligned = Tensor::empty(t.shape, t.dtype);
    std::memcpy(aligned.data_ptr(), data, t.data_end - t.data_begin);
    return aligned;
  }
  return view;
}

const char* safetensors_dtype_name(DType dtype) {
  for (const DTypeName& d : kDTypeNames) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

// ---- checkpoints of several files ----
SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& file_or_directory) {
  SafetensorsCheckpoint checkpoint;
  const fs::path path(file_or_directory);
  auto add_file = [&](const std::string& file) {
    checkpoint.files_.push_back(SafetensorsFile::open(file));
    for (const TensorInfo& t : checkpoint.files_.back().tensors()) {
      MICROLLM_CHECK(checkpoint.file_of_.emplace(t.name, checkpoint.files_.size() - 1).second, ParseError, file,
                     "tensor '", t.name, "' also appears in another shard");
    }
  };
  if (!fs::is_directory(path)) {
    add_file(path.string());
    return checkpoint;
  }
  const fs::path index = path / "model.safetensors.index.json";
  if (fs::exists(index)) {
    json doc = detail::parse_json(read_text_file(index.string()), index.string(), "not valid JSON");
    MICROLLM_CHECK(doc.is_object() && doc.contains("weight_map") && doc["weight_map"].is_object(), ParseError,
                   index.string(), "weight_map is missing or not an object");
    std::vector<std::string> shards;
    for (const auto& [name, shard] : doc["weight_map"].items()) {
      MICROLLM_CHECK(shard.is_string(), ParseError, index.string(), "weight_map.", name, " is not a file name");
      const std::string file = shard.get<std::string>();
      MICROLLM_CHECK(file.find('/') == std::string::npos && file != ".." && !file.empty(), ParseError, index.string(),
                     "weight_map.", name, " names '", file, "', which is not a file in the directory");
      if (std::find(shards.begin(), shards.end(), file) == shards.end()) shards.push_back(file);
    }
    for (const std::string& shard : shards) {
      const fs::path shard_path = path / shard;
      MICROLLM_CHECK(fs::exists(shard_path), IoError, index.string(), "the shard ", shard, " is missing");
      add_file(shard_path.string());
    }
    for (const auto& [name, shard] : doc["weight_map"].items()) {
      MICROLLM_CHECK(checkpoint.contains(name), ParseError, index.string(), "weight_map names tensor '", name,
                     "' but ", shard.get<std::string>(), " does not contain it");
    }
    return checkpoint;
  }
  const fs::path single = path / "model.safetensors";
  MICROLLM_CHECK(fs::exists(single), IoError, path.string(),
                 "no model.safetensors or model.safetensors.index.json in the directory");
  add_file(single.string());
  return checkpoint;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : file_of_) out.push_back(name);
  return out;
}

bool SafetensorsCheckpoint::contains(const std::string& name) const { return file_of_.count(name) > 0; }

const TensorInfo& SafetensorsCheckpoint::info(const std::string& name) const {
  const auto it = file_of_.find(name);
  MICROLLM_CHECK(it != file_of_.end(), IndexError, "checkpoint", "no tensor named '", name, "'");
  return files_[it->second].info(name);
}

Tensor SafetensorsCheckpoint::get(const std::string& name) const {
  const auto it = file_of_.find(name);
  MICROLLM_CHECK(it != file_of_.end(), IndexError, "checkpoint", "no tensor named '", name, "'");
  return files_[it->second].get(name);
}

size_t SafetensorsCheckpoint::total_bytes() const {
  size_t total = 0;
  for (const SafetensorsFile& f : files_) total += f.file_size();
  return total;
}

// ---- writing ----
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host;
  uint64_t offset = 0;
  std::vector<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    MICROLLM_CHECK(!header.contains(name), ValueError, path, "tensor '", name, "' is listed twice");
    MICROLLM_CHECK(tensor.defined(), ValueError, path, "tensor '", name, "' is undefined");
    host.push_back(tensor.to(Device::cpu()).contiguous());
    const uint64_t bytes = host.back().nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(tensor.dtype())},
                    {"shape", tensor.shape().to_vector()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad: the data then starts 8-byte aligned
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  write_file_atomically(path, [&](int fd) {
    write_all(fd, length, 8, path);
    write_all(fd, text.data(), text.size(), path);
    for (const Tensor& t : host) {
      if (t.nbytes() > 0) write_all(fd, t.data_ptr(), t.nbytes(), path);
    }
  });
}

void save_safetensors_sharded(const std::string& directory, const std::string& stem,
                              const std::vector<std::pair<std::string, Tensor>>& tensors, size_t max_shard_bytes,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<std::vector<std::pair<std::string, Tensor>>> shards(1);
  size_t shard_bytes = 0, total = 0;
  for (const auto& entry : tensors) {
    const size_t bytes = entry.second.nbytes();
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(entry);
    shard_bytes += bytes;
    total += bytes;
  }
  json weight_map = json::object();
  char name[64];
  for (size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(name, sizeof name, "-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    const std::string file = stem + name;
    save_safetensors((fs::path(directory) / file).string(), shards[i], metadata);
    for (const auto& entry : shards[i]) weight_map[entry.first] = file;
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_text_atomically((fs::path(directory) / (stem + ".safetensors.index.json")).string(), index.dump(2));
}

}  // namespace microllm::io

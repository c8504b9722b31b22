// safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
// data. Reading maps the file and validates the header strictly (the rules of the reference Rust
// implementation): the length fits the file, names are valid UTF-8, dtypes are known, every tensor's
// bytes equal its shape times its dtype size, and the tensors tile the data buffer exactly: in bounds,
// no overlap, no hole. Errors name the file and the tensor or field.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "microllm/core/tensor.h"

namespace microllm::io {

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t data_begin;  // offset into the data buffer
  uint64_t data_end;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws IoError (cannot open or map) or ParseError (a bad header).
  static SafetensorsFile open(const std::string& path);
  // Validates a header from memory (the fuzz target and tests use this): `bytes` is the whole file.
  static std::vector<TensorInfo> parse_header(const uint8_t* bytes, size_t size, const std::string& origin,
                                              std::map<std::string, std::string>* metadata = nullptr);

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws IndexError naming the file
  // A CPU tensor that borrows the mapped bytes (no copy; the mapping lives as long as any tensor).
  Tensor get(const std::string& name) const;
  size_t file_size() const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_start_ = 0;
};

// A checkpoint of one or several safetensors files: a file, or a directory with model.safetensors or
// model.safetensors.index.json (its weight_map names the shard of each tensor; shards must exist).
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open(const std::string& file_or_directory);
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  Tensor get(const std::string& name) const;
  size_t total_bytes() const;
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> file_of_;  // tensor name -> index into files_
};

// The dtype names of the format ("F32", "BF16", ...).
const char* safetensors_dtype_name(DType dtype);

// Writes tensors (any device; copied to the host) to `path` atomically: a temporary file, fsync,
// rename. Names must be unique. Tensors are laid out in the given order.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Writes shards of at most `max_shard_bytes` (a single tensor larger than that gets its own shard) as
// <stem>-00001-of-0000N.safetensors plus <stem>.safetensors.index.json in `directory`.
void save_safetensors_sharded(const std::string& directory, const std::string& stem,
                              const std::vector<std::pair<std::string, Tensor>>& tensors, size_t max_shard_bytes,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace microllm::io

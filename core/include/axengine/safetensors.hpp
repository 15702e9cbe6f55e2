// safetensors: the checkpoint format of Hugging Face model directories and PEFT adapters.
//
// The format is an 8-byte little-endian header length N, N bytes of JSON mapping tensor names to
// {dtype, shape, data_offsets}, then the raw tensor bytes. We read it ourselves (memory-mapped) so that every
// field is validated before a byte of tensor data is touched: a corrupt, truncated or hostile file gives a
// UsageError naming the file and the tensor, never a crash or an out-of-bounds read.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ax::safetensors {

struct TensorInfo {
  std::string name;
  std::string dtype;            // as written in the file: "F32", "BF16", ...
  at::ScalarType scalar_type;   // the matching ATen dtype
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte span relative to the start of the data section
};

// One memory-mapped .safetensors file, validated on open.
class File {
 public:
  // Throws UsageError naming `path` (and the tensor, where one is at fault).
  static std::shared_ptr<File> open(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data-offset order
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A CPU tensor holding a copy of the bytes (the mapping may be unaligned for the dtype). Throws UsageError
  // naming the file when `name` is absent.
  at::Tensor get(const std::string& name) const;

 private:
  File() = default;
  std::string path_;
  int fd_ = -1;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (any device; copied to CPU, made contiguous) atomically, as write_file_atomic does.
// Names must be unique. Supported dtypes: those `File` reads.
void save(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata = {}, std::string_view writer = "file");

// Writes `content` atomically to `path`: a uniquely named temp file in the same directory, written, fsynced,
// renamed over `path`, then the directory fsynced. Whenever the process dies, `path` holds the old content or
// the new, never a mix. `writer` names the caller's crash points (axengine/crash_point.hpp):
// <writer>.file_opened, .file_half_written, .file_written, .file_synced, .file_renamed, .file_dir_synced.
void write_file_atomic(const std::string& path, const std::string& content, std::string_view writer = "file");

// A model directory's weights: `model.safetensors`, or the shards listed by `model.safetensors.index.json`
// (validated: every shard exists and holds exactly the tensors the index assigns to it).
class Checkpoint {
 public:
  static Checkpoint open_dir(const std::string& dir);
  static Checkpoint open_file(const std::string& path);

  std::vector<std::string> names() const;  // sorted
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // throws UsageError naming the dir when missing
  at::Tensor get(const std::string& name) const;          // CPU copy, file dtype
  const std::string& source() const { return source_; }   // the file or index, for messages
  std::string file_of(const std::string& name) const;
  // A view holding the tensors `rename` maps to a name (nullopt: left out), under those names; reads go to the
  // same files under the stored names. For a family whose checkpoints come in more than one layout.
  Checkpoint renamed(const std::function<std::optional<std::string>(const std::string&)>& rename) const;

 private:
  const std::string& stored(const std::string& name) const;  // the name in the file
  std::map<std::string, std::string> stored_;  // view name -> stored name, where they differ
  std::string source_;
  std::vector<std::shared_ptr<File>> files_;
  std::map<std::string, std::size_t> where_;  // tensor name -> index into files_
};

// "F32" <-> at::kFloat etc.; dtype_name throws UsageError for dtypes safetensors cannot hold.
std::string dtype_name(at::ScalarType t);

}  // namespace ax::safetensors

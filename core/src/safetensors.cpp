#include "axengine/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <set>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/crash_point.hpp"
#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"

namespace ax::safetensors {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Bigger than any real header (the Rust reference caps it at 100 MB): a garbage length is caught before
// we try to parse gigabytes.
constexpr uint64_t kMaxHeader = 100ull << 20;

struct DtypeEntry {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeEntry kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat},  {"F16", at::kHalf},   {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},    {"I16", at::kShort},  {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},  {"F8_E4M3", at::kFloat8_e4m3fn}, {"F8_E5M2", at::kFloat8_e5m2},
};

std::optional<at::ScalarType> parse_dtype(const std::string& s) {
  for (const auto& d : kDtypes)
    if (s == d.name) return d.type;
  return std::nullopt;
}

std::string sys_error() { return std::strerror(errno); }

}  // namespace

std::string dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw UsageError(str("safetensors cannot store dtype ", c10::toString(t)));
}

std::shared_ptr<File> File::open(const std::string& path) {
  std::shared_ptr<File> f(new File());
  f->path_ = path;
  auto bad = [&](const std::string& msg) { return UsageError(str(path, ": ", msg)); };

  {
    InputFile in(path);  // refuses a FIFO or device named like a checkpoint instead of blocking on it
    f->size_ = in.size();
    f->fd_ = in.release();
  }
  if (f->size_ < 8) throw bad(str("truncated: ", f->size_, " bytes, shorter than the 8-byte header length"));
  void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, f->fd_, 0);
  if (m == MAP_FAILED) throw bad(str("cannot mmap: ", sys_error()));
  f->map_ = static_cast<const uint8_t*>(m);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | f->map_[i];  // little-endian, independent of host order
  if (n > kMaxHeader) throw bad(str("header length ", n, " is implausible (limit ", kMaxHeader, ")"));
  if (n > f->size_ - 8)
    throw bad(str("truncated: header length ", n, " exceeds the ", f->size_ - 8, " bytes after it"));
  f->data_start_ = 8 + n;
  const uint64_t data_size = f->size_ - f->data_start_;

  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(f->map_ + 8), reinterpret_cast<const char*>(f->map_ + 8 + n));
  } catch (const json::exception& e) {
    throw bad(str("header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) throw bad("header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw bad("__metadata__ is not an object");
      for (auto m2 = v.begin(); m2 != v.end(); ++m2) {
        if (!m2.value().is_string()) throw bad(str("__metadata__ key '", m2.key(), "' is not a string"));
        f->metadata_[m2.key()] = m2.value().get<std::string>();
      }
      continue;
    }
    auto tbad = [&](const std::string& msg) { return bad(str("tensor '", name, "': ", msg)); };
    if (!v.is_object()) throw tbad("entry is not an object");
    for (auto k = v.begin(); k != v.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        throw tbad(str("unknown field '", k.key(), "'"));
    if (!v.contains("dtype") || !v["dtype"].is_string()) throw tbad("missing or non-string 'dtype'");
    if (!v.contains("shape") || !v["shape"].is_array()) throw tbad("missing or non-array 'shape'");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      throw tbad("'data_offsets' must be an array of two integers");
    TensorInfo t;
    t.name = name;
    t.dtype = v["dtype"].get<std::string>();
    auto st2 = parse_dtype(t.dtype);
    if (!st2) throw tbad(str("unsupported dtype '", t.dtype, "'"));
    t.scalar_type = *st2;
    // Element count with overflow checks: a hostile shape must not wrap around to a small byte count.
    uint64_t count = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw tbad("shape entries must be non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) throw tbad("shape entry too large");
      if (dim != 0 && count > std::numeric_limits<uint64_t>::max() / dim) throw tbad("shape overflows");
      count *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const auto& o : v["data_offsets"])
      if (!o.is_number_unsigned()) throw tbad("data_offsets must be non-negative integers");
    t.begin = v["data_offsets"][0].get<uint64_t>();
    t.end = v["data_offsets"][1].get<uint64_t>();
    if (t.end < t.begin) throw tbad(str("data_offsets end ", t.end, " is before begin ", t.begin));
    const uint64_t elem = c10::elementSize(t.scalar_type);
    if (count > std::numeric_limits<uint64_t>::max() / elem) throw tbad("byte size overflows");
    if (count * elem != t.end - t.begin)
      throw tbad(str("shape x dtype size is ", count * elem, " bytes but data_offsets span ", t.end - t.begin));
    if (t.end > data_size)
      throw tbad(str("data_offsets [", t.begin, ", ", t.end, ") run past the end of the data (", data_size,
                     " bytes): file truncated?"));
    f->tensors_.push_back(std::move(t));
  }

  // The spans must tile the data section exactly: no overlap (aliasing), no holes, nothing trailing.
  std::sort(f->tensors_.begin(), f->tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : f->tensors_) {
    if (t.begin < expect)
      throw bad(str("tensor '", t.name, "' overlaps tensor '", prev->name, "' (bytes ", t.begin, " < ", expect, ")"));
    if (t.begin > expect)
      throw bad(str("tensor '", t.name, "' starts at byte ", t.begin, ", leaving a hole after ",
                    prev ? str("tensor '", prev->name, "'") : std::string("the header"), " (expected ", expect, ")"));
    expect = t.end;
    prev = &t;
  }
  if (expect != data_size)
    throw bad(str("data section holds ", data_size, " bytes but the tensors cover ", expect));
  for (std::size_t i = 0; i < f->tensors_.size(); ++i) f->by_name_[f->tensors_[i].name] = i;
  return f;
}

File::~File() {
  if (map_) munmap(const_cast<uint8_t*>(map_), size_);
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo* File::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

at::Tensor File::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw UsageError(str(path_, ": no tensor '", name, "'"));
  at::Tensor out = at::empty(t->shape, at::TensorOptions().dtype(t->scalar_type));
  if (t->end > t->begin) std::memcpy(out.data_ptr(), map_ + data_start_ + t->begin, t->end - t->begin);
  return out;
}

void write_file_atomic(const std::string& path, const std::string& content, std::string_view writer) {
  fs::path target(path);
  fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::random_device rd;
  fs::path tmp = dir / str(".", target.filename().string(), ".tmp", rd());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw RuntimeError(str(tmp.string(), ": cannot create: ", sys_error()));
  crash_point(writer, "file_opened");
  auto write_all = [&](const char* p, std::size_t left) {
    while (left > 0) {
      ssize_t w = ::write(fd, p, left);
      if (w < 0) {
        if (errno == EINTR) continue;
        std::string err = sys_error();
        ::close(fd);
        fs::remove(tmp);
        throw RuntimeError(str(tmp.string(), ": write failed: ", err));
      }
      p += w;
      left -= static_cast<std::size_t>(w);
    }
  };
  // In two halves, so that a crash test can stop between them and leave a half-written temp file.
  const std::size_t half = content.size() / 2;
  write_all(content.data(), half);
  crash_point(writer, "file_half_written");
  write_all(content.data() + half, content.size() - half);
  crash_point(writer, "file_written");
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string err = sys_error();
    fs::remove(tmp);
    throw RuntimeError(str(tmp.string(), ": fsync/close failed: ", err));
  }
  crash_point(writer, "file_synced");
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    std::string err = sys_error();
    fs::remove(tmp);
    throw RuntimeError(str(path, ": rename failed: ", err));
  }
  crash_point(writer, "file_renamed");
  // Make the rename itself durable.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  crash_point(writer, "file_dir_synced");
}

void save(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata, std::string_view writer) {
  std::vector<std::pair<std::string, at::Tensor>> items;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || name.empty()) throw UsageError(str(path, ": invalid tensor name '", name, "'"));
    if (!seen.insert(name).second) throw UsageError(str(path, ": tensor '", name, "' given twice"));
    if (!t.defined()) throw UsageError(str(path, ": tensor '", name, "' is undefined"));
    dtype_name(t.scalar_type());  // throws for unsupported dtypes
    items.emplace_back(name, t.detach().to(at::kCPU).contiguous());
  }
  std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });

  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : items) {
    uint64_t nbytes = t.numel() * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');  // keeps the data section 8-byte aligned, as HF writes it
  std::string out;
  out.reserve(8 + h.size() + offset);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += h;
  for (const auto& [name, t] : items)
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  write_file_atomic(path, out, writer);
}

Checkpoint Checkpoint::open_file(const std::string& path) {
  Checkpoint c;
  c.source_ = path;
  c.files_.push_back(File::open(path));
  for (const auto& t : c.files_[0]->tensors()) c.where_[t.name] = 0;
  return c;
}

Checkpoint Checkpoint::open_dir(const std::string& dir) {
  fs::path d(dir);
  fs::path single = d / "model.safetensors";
  fs::path index = d / "model.safetensors.index.json";
  if (fs::exists(index)) {
    Checkpoint c;
    c.source_ = index.string();
    auto bad = [&](const std::string& msg) { return UsageError(str(index.string(), ": ", msg)); };
    json j;
    try {
      j = json::parse(read_regular_file(index.string()));
    } catch (const json::exception& e) {
      throw bad(str("not valid JSON: ", e.what()));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw bad("missing object 'weight_map'");
    std::map<std::string, std::size_t> file_index;
    std::map<std::string, std::set<std::string>> expected;  // shard -> tensors the index puts there
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) throw bad(str("weight_map['", it.key(), "'] is not a string"));
      std::string shard = it.value().get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        throw bad(str("weight_map['", it.key(), "'] names '", shard, "', not a file in the directory"));
      expected[shard].insert(it.key());
    }
    for (const auto& [shard, names] : expected) {
      fs::path p = d / shard;
      std::error_code ec;  // a name the file system refuses (too long, ...) is bad input, not an exception
      if (!fs::exists(p, ec))
        throw bad(str("shard '", shard, "' (holding e.g. '", *names.begin(), "') ", ec ? "cannot be opened: " + ec.message() : "does not exist"));
      auto f = File::open(p.string());
      for (const auto& n : names)
        if (!f->find(n)) throw UsageError(str(p.string(), ": no tensor '", n, "' though ", index.string(), " puts it here"));
      for (const auto& t : f->tensors())
        if (!names.count(t.name))
          throw UsageError(str(p.string(), ": tensor '", t.name, "' is not listed for this shard in ", index.string()));
      std::size_t k = c.files_.size();
      c.files_.push_back(f);
      for (const auto& n : names) c.where_[n] = k;
    }
    log::debug(str(index.string(), ": ", c.where_.size(), " tensors in ", c.files_.size(), " shards"));
    return c;
  }
  if (fs::exists(single)) return open_file(single.string());
  throw UsageError(str(dir, ": no model.safetensors or model.safetensors.index.json"));
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [n, i] : where_) out.push_back(n);
  return out;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw UsageError(str(source_, ": missing tensor '", name, "'"));
  return *files_[it->second]->find(stored(name));
}

at::Tensor Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw UsageError(str(source_, ": missing tensor '", name, "'"));
  return files_[it->second]->get(stored(name));
}

const std::string& Checkpoint::stored(const std::string& name) const {
  auto it = stored_.find(name);
  return it == stored_.end() ? name : it->second;
}

Checkpoint Checkpoint::renamed(const std::function<std::optional<std::string>(const std::string&)>& rename) const {
  Checkpoint c;
  c.source_ = source_;
  c.files_ = files_;
  for (const auto& [name, file] : where_) {
    std::optional<std::string> to = rename(name);
    if (!to) continue;
    if (c.where_.count(*to)) throw UsageError(str(source_, ": tensors '", stored(name), "' and '", c.stored(*to), "' are the same weight ('", *to, "')"));
    c.where_[*to] = file;
    if (*to != stored(name)) c.stored_[*to] = stored(name);
  }
  return c;
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? source_ : files_[it->second]->path();
}

}  // namespace ax::safetensors

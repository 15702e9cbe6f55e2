// The protobuf encoding is written here by hand rather than with libprotobuf + protoc: it is four messages with
// six fields (a double, a varint, two strings, a float, two nested messages), a few dozen lines, while the library
// would add a code generator and two Debian packages to every build machine (the GPU machine's bundle too) and a
// second protobuf beside the copy LibTorch's libtorch_cpu.so already exports symbols of (google::protobuf::*,
// another version), a clash waiting to happen. CRC32C comes from Boost.CRC (checkpoint_manifest.hpp).
#include "train/tensorboard.hpp"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "train/append_record.hpp"
#include "train/checkpoint_manifest.hpp"

namespace fs = std::filesystem;

namespace ax::train {
namespace {

constexpr std::string_view kPrefix = "events.out.tfevents.";

// Protobuf wire format (little-endian fixed-width fields, base-128 varints).
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void put_fixed(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((bits >> (8 * i)) & 0xff);
}

enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_key(std::string& out, uint32_t field, Wire wire) { put_varint(out, (field << 3) | wire); }

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kBytes);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_fixed(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_fixed(out, bits, 4);
}

// Event { double wall_time = 1; int64 step = 2; oneof what { string file_version = 3; Summary summary = 5; } }
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_double(e, 1, wall_time);
  if (step != 0) {  // proto3 leaves zero scalars out
    put_key(e, 2, kVarint);
    put_varint(e, static_cast<uint64_t>(step));  // two's complement, as int64 is encoded
  }
  return e;
}

double now_unix() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// metrics.jsonl key -> TensorBoard tag (HF Trainer's names, so runs compare side by side), and a scale.
struct TagOf {
  const char* key;
  const char* tag;
  double scale;
};
constexpr TagOf kTags[] = {
    {"loss", "train/loss", 1},
    {"lr", "train/learning_rate", 1},
    {"grad_norm", "train/grad_norm", 1},
    {"epoch", "train/epoch", 1},
    {"tokens_per_s", "train/tokens_per_second", 1},
    {"peak_memory_bytes", "train/peak_memory_gib", 1.0 / (1024.0 * 1024.0 * 1024.0)},
    {"eval_loss", "eval/loss", 1},
    {"exact_match", "eval/exact_match", 1},
};

std::string file_name(double wall_time) {
  char host[256] = {};
  std::string h = ::gethostname(host, sizeof host - 1) == 0 ? host : "";
  std::string safe;
  for (char c : h) safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  return ax::str(kPrefix, static_cast<int64_t>(wall_time), ".", safe.empty() ? "host" : safe, ".axengine");
}

// The TFRecord of one metrics record ("" when it holds no scalar); wall time: its "time", else `now`.
std::string record_event(const nlohmann::json& r, double now) {
  auto step = r.find("step");
  auto time = r.find("time");
  auto values = record_scalars(r);
  if (step == r.end() || !step->is_number_integer() || values.empty()) return {};
  return tfrecord(event_scalars(time != r.end() && time->is_number() ? time->get<double>() : now, step->get<int64_t>(), values));
}

}  // namespace

uint32_t masked_crc32c(std::string_view bytes) {
  uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string len, out;
  put_fixed(len, data.size(), 8);
  out.reserve(data.size() + 16);
  out += len;
  put_fixed(out, masked_crc32c(len), 4);
  out += data;
  put_fixed(out, masked_crc32c(data), 4);
  return out;
}

std::string event_file_version(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string event_scalars(double wall_time, int64_t step, const std::vector<Scalar>& values) {
  // Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
  std::string summary;
  for (const auto& s : values) {
    std::string v;
    put_bytes(v, 1, s.tag);
    put_float(v, 2, s.value);
    put_bytes(summary, 1, v);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::vector<Scalar> record_scalars(const nlohmann::json& record) {
  std::vector<Scalar> out;
  for (const auto& t : kTags) {
    auto it = record.find(t.key);
    if (it == record.end() || !it->is_number()) continue;
    out.push_back({t.tag, static_cast<float>(it->get<double>() * t.scale)});
  }
  return out;
}

TensorBoardLog::TensorBoardLog(const std::string& output_dir, const std::vector<nlohmann::json>& records, bool enabled) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir, ec))
    if (e.path().filename().string().rfind(kPrefix, 0) == 0) fs::remove(e.path(), ec);
  if (!enabled) return;
  const double now = now_unix();
  std::string bytes = tfrecord(event_file_version(now));
  for (const auto& r : records) bytes += record_event(r, now);
  // Not write_file_atomic: the file is rebuilt from metrics.jsonl at every start, so a crash mid-write costs
  // nothing, and a file still being written is what TensorBoard expects to read.
  path_ = (fs::path(output_dir) / file_name(now)).string();
  append_record(path_, bytes, "tensorboard", /*truncate=*/true);
}

void TensorBoardLog::append(const nlohmann::json& record) {
  if (path_.empty()) return;
  std::string bytes = record_event(record, now_unix());
  if (bytes.empty()) return;
  append_record(path_, bytes, "tensorboard");
}

}  // namespace ax::train

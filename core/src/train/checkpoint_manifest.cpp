// See checkpoint_manifest.hpp.
#include "train/checkpoint_manifest.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"

namespace fs = std::filesystem;

namespace ax::train {
namespace {

constexpr const char* kFormat = "axengine-checkpoint-manifest-v1";
// Boost.CRC's parameterised CRC with the Castagnoli polynomial (as iSCSI, ext4 and SSE4.2 use), reflected.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  Crc32c crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

uint32_t crc32c_file(const std::string& path, uint64_t& size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(str(path, ": cannot open: ", std::strerror(errno)));
  Crc32c crc;
  std::vector<char> buf(1 << 20);
  size = 0;
  while (true) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string err = std::strerror(errno);
      ::close(fd);
      throw RuntimeError(str(path, ": read failed: ", err));
    }
    if (n == 0) break;
    crc.process_bytes(buf.data(), static_cast<std::size_t>(n));
    size += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return crc.checksum();
}

void write_manifest(const std::string& dir, std::string_view writer) {
  std::map<std::string, nlohmann::json> files;  // sorted: the manifest's bytes depend on the files only
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == kManifestFile) continue;
    uint64_t size = 0;
    uint32_t crc = crc32c_file(e.path().string(), size);
    files[name] = {{"size", size}, {"crc32c", hex32(crc)}};
  }
  nlohmann::json m = {{"format", kFormat}, {"files", files}};
  safetensors::write_file_atomic((fs::path(dir) / kManifestFile).string(), m.dump(2) + "\n", writer);
}

bool verify_manifest(const std::string& dir, const std::initializer_list<const char*>& required) {
  const std::string path = (fs::path(dir) / kManifestFile).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return false;
  auto bad = [&](const std::string& msg) { return UsageError(str(path, ": ", msg)); };
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad("cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  auto m = nlohmann::json::parse(ss.str(), nullptr, false);
  if (m.is_discarded()) throw bad("not valid JSON (truncated?)");
  // Compared as JSON, not read with value<std::string>(): a "format" of another type must be "not a manifest"
  // (value() would throw json's type_error, which no caller expects).
  if (!m.is_object() || !m.contains("format") || m["format"] != kFormat || !m.contains("files") || !m["files"].is_object())
    throw bad(str("not a checkpoint manifest (expected {\"format\": \"", kFormat, "\", \"files\": {...}})"));
  const auto& files = m["files"];
  for (const char* r : required)
    if (!files.contains(r)) throw bad(str("does not list ", r));
  for (auto it = files.begin(); it != files.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      throw bad(str("lists '", name, "', not a file name"));
    if (!v.is_object() || !v.contains("size") || !v["size"].is_number_unsigned() || !v.contains("crc32c") ||
        !v["crc32c"].is_string())
      throw bad(str("entry for '", name, "' must be {\"size\": <bytes>, \"crc32c\": \"<8 hex digits>\"}"));
    const std::string file = (fs::path(dir) / name).string();
    if (!fs::is_regular_file(file, ec)) throw UsageError(str(file, ": missing (listed in ", kManifestFile, ")"));
    uint64_t size = 0;
    uint32_t crc = 0;
    try {
      crc = crc32c_file(file, size);
    } catch (const RuntimeError& e) {
      throw UsageError(e.what());
    }
    const uint64_t want = v["size"].get<uint64_t>();
    if (size != want)
      throw UsageError(str(file, ": ", size, " bytes, ", kManifestFile, " says ", want, " (truncated or overwritten)"));
    if (hex32(crc) != v["crc32c"].get<std::string>())
      throw UsageError(str(file, ": CRC-32C ", hex32(crc), ", ", kManifestFile, " says ", v["crc32c"].get<std::string>(),
                           " (the contents changed after the checkpoint was written)"));
  }
  return true;
}

}  // namespace ax::train

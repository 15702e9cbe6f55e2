// Typed access to tokenizer.json with errors that name the file and the JSON path ("model.merges[3]").
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "axengine/error.hpp"

namespace ax::tok {

using json = nlohmann::json;

struct JsonReader {
  std::string file;  // as given by the caller, e.g. "/models/qwen/tokenizer.json"

  [[noreturn]] void fail(const std::string& path, const std::string& message) const {
    throw UsageError(file + ": " + path + " " + message);
  }
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  static std::string index(const std::string& path, std::size_t i) { return path + "[" + std::to_string(i) + "]"; }

  const json& object(const json& j, const std::string& path) const {
    if (!j.is_object()) fail(path, "must be a JSON object, got " + std::string(j.type_name()));
    return j;
  }
  const json& array(const json& j, const std::string& path) const {
    if (!j.is_array()) fail(path, "must be a JSON array, got " + std::string(j.type_name()));
    return j;
  }
  const json& required(const json& j, const std::string& key, const std::string& path) const {
    object(j, path);
    auto it = j.find(key);
    if (it == j.end()) fail(join(path, key), "is missing");
    return *it;
  }
  std::string string(const json& j, const std::string& path) const {
    if (!j.is_string()) fail(path, "must be a string, got " + std::string(j.type_name()));
    return j.get<std::string>();
  }
  std::string string(const json& j, const std::string& key, const std::string& path) const {
    return string(required(j, key, path), join(path, key));
  }
  // A string field that may be absent or null.
  std::optional<std::string> optional_string(const json& j, const std::string& key, const std::string& path) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    return string(*it, join(path, key));
  }
  bool boolean(const json& j, const std::string& key, const std::string& path, bool fallback) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(join(path, key), "must be true or false, got " + std::string(it->type_name()));
    return it->get<bool>();
  }
  int64_t integer(const json& j, const std::string& path) const {
    if (!j.is_number_integer()) fail(path, "must be an integer, got " + std::string(j.type_name()));
    return j.get<int64_t>();
  }
  int64_t integer(const json& j, const std::string& key, const std::string& path, int64_t fallback) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    return integer(*it, join(path, key));
  }
  // A token id: a non-negative integer below 2^24 (real vocabularies stay far below; the bound keeps a corrupt
  // file from making us allocate gigabytes for the id -> token table).
  static constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;
  int32_t id(const json& j, const std::string& path) const {
    const int64_t v = integer(j, path);
    if (v < 0 || v > kMaxTokenId) fail(path, "is not a valid token id: " + std::to_string(v));
    return static_cast<int32_t>(v);
  }
  std::string type(const json& j, const std::string& path) const { return string(j, "type", path); }
  [[noreturn]] void unsupported(const std::string& path, const std::string& type) const {
    fail(join(path, "type"), "'" + type + "' is not supported");
  }
};

}  // namespace ax::tok

// Shared helpers of the tokenizer tests: file I/O, a scratch directory, and the HF-golden comparison.
#pragma once
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "axengine/hf_tokenizer.hpp"

namespace ax::test {

inline std::string tokenizer_data_dir(const std::string& name) {
  return std::string(AXENGINE_TEST_DATA_DIR) + "/tokenizers/" + name;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read ", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

// A fresh directory under the system temp dir, removed at scope exit.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& tag) {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("axengine_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Checks every case of tests/data/tokenizers/<name>/expected.json (written by
// scripts/goldens/make_tokenizer_goldens.py from HF tokenizers) against our tokenizer. Returns how many texts
// round-trip through encode/decode, so callers can insist the set is not trivial.
inline int check_against_hf_goldens(const std::string& name) {
  const std::string dir = tokenizer_data_dir(name);
  const auto tok = ax::load_hf_tokenizer(dir);
  const auto expected = nlohmann::json::parse(read_text(dir + "/expected.json"));
  CHECK(tok->vocab_size() == expected["vocab_size"].get<int64_t>());
  CHECK(tok->bos_id() == expected["bos_id"].get<int32_t>());
  CHECK(tok->eos_id() == expected["eos_id"].get<int32_t>());
  CHECK(tok->pad_id() == expected["pad_id"].get<int32_t>());
  int round_trips = 0;
  for (const auto& c : expected["cases"]) {
    const auto text = c["text"].get<std::string>();
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    INFO(name, " text: \"", text, "\"");
    CHECK(tok->encode(text, false) == ids);
    CHECK(tok->encode(text, true) == c["ids_with_special"].get<std::vector<int32_t>>());
    const auto decoded = tok->decode(ids, false);
    CHECK(decoded == c["decoded"].get<std::string>());
    CHECK(tok->decode(ids, true) == c["decoded_skip_special"].get<std::string>());
    if (decoded == text) ++round_trips;
  }
  return round_trips;
}

}  // namespace ax::test

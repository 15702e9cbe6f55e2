// The scattermoe tuning cache: which tile configuration (kernels/tile_configs.hpp) runs a GEMM of a given
// shape on a given GPU. Plain C++ (no CUDA, no torch): unit-tested on CPU (tests/unit/scattermoe_tuning_test.cpp).
//
// Keys: "<gpu>|<op>|E=<experts>|M=<rows, next power of two>|N=<n>|K=<k>|r=<rank>", where <gpu> is the
// device name and compute capability ("NVIDIA H200 sm_90"). Rows are bucketed so one entry serves the
// token counts of a run (tile choice depends on rows per expert coarsely); N, K, rank and the expert count
// are model constants and kept exact.
//
// Files: JSON {"version": 1, "entries": {"<key>": "<tile name>", ...}}. Shipped, pre-filled files are read
// from a directory next to the plugin (read-only); the user file (option tuning_cache of
// [kernels.options.scattermoe], else ~/.cache/axengine/scattermoe-tuning.json) holds what this machine
// tuned and takes precedence. Writes
// merge with the file on disk and replace it atomically (temporary file + rename). A corrupt file or
// unknown entries produce one warning per file and are ignored, never an error.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ax::scattermoe {

// What a GEMM call computes (its tile choice differs by kind even at equal sizes).
enum class GemmOp {
  forward,   // Y = X W (+ fused LoRA term)
  dx,        // dX = dY Wᵀ (+ fused LoRA term)
  thin,      // the rank-r products XA = X Aᵀ and YB = dY B (N = r)
  lora_add,  // split path: C = XA Bᵀ + base product (K = r)
  gram,      // dA, dB: per-expert reductions over rows
};
const char* to_string(GemmOp op);
std::optional<GemmOp> parse_gemm_op(std::string_view text);

// Rows bucket: the next power of two >= m (0 for m <= 0).
int64_t bucket_rows(int64_t m);

struct TuningKey {
  std::string gpu;  // device name and compute capability, e.g. "NVIDIA H200 sm_90"
  GemmOp op = GemmOp::forward;
  int64_t E = 0, M = 0, N = 0, K = 0, r = 0;  // M as given; str() buckets it
  std::string str() const;
};
// Parses a key string; nullopt when it is not one str() could have written.
std::optional<TuningKey> parse_key(std::string_view text);

// The default location of the user file (option tuning_cache unset): $XDG_CACHE_HOME/axengine/...,
// else $HOME/.cache/axengine/scattermoe-tuning.json (empty when neither is set).
std::filesystem::path default_user_cache_path();

class TuningCache {
 public:
  // Reads every *.json in `dir` (the shipped files). A missing directory is fine (no entries).
  void load_shipped_dir(const std::filesystem::path& dir);
  // Reads the user file (missing: no entries) and remembers it as the target of save().
  void load_user(const std::filesystem::path& file);

  // The tile name stored for a key: the user file's entry, else (with shipped) a shipped one.
  std::optional<std::string> lookup(const std::string& key, bool shipped = true) const;
  // Records a result (in memory; save() persists the user entries).
  void store(const std::string& key, const std::string& tile);
  // Writes the user entries to the user file: re-reads it (entries other processes added survive; ours
  // win on conflicts), then writes a temporary file beside it and renames it over. Returns false (and a
  // warning) when the file cannot be written.
  bool save();

  const std::filesystem::path& user_file() const { return user_file_; }
  std::size_t size() const;
  // Every warning issued so far (also sent to ax::log::warn when issued).
  std::vector<std::string> warnings() const;

  // Reads one file: its valid entries; `warning` gets one line when the file is corrupt or has invalid
  // entries (empty otherwise). A missing file reads as empty without a warning.
  static std::map<std::string, std::string> read_file(const std::filesystem::path& file, std::string& warning);
  // Writes entries atomically (ax::safetensors::write_file_atomic: a temporary file in the same directory,
  // fsynced, renamed over; crash points tuning_cache.file_*). Throws on failure.
  static void write_file(const std::filesystem::path& file, const std::map<std::string, std::string>& entries);

 private:
  void warn(const std::string& message);

  mutable std::mutex mu_;
  std::map<std::string, std::string> shipped_, user_;
  std::filesystem::path user_file_;
  std::vector<std::string> warnings_;
};

}  // namespace ax::scattermoe

// manifest.json: written last into a checkpoint (before its directory is renamed into place), it lists every
// file of the checkpoint with its size and CRC-32C, so that resume can tell a checkpoint that is whole from one
// damaged afterwards (a truncated adapter, a file deleted or overwritten) and fall back to an older one.
//   {"format": "axengine-checkpoint-manifest-v1",
//    "files": {"adapter_model.safetensors": {"size": 123, "crc32c": "e3069283"}, ...}}
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace ax::train {

inline constexpr const char* kManifestFile = "manifest.json";

// CRC-32C (Castagnoli) of a whole file, read in chunks; `size` gets its length. Throws RuntimeError naming it.
uint32_t crc32c_file(const std::string& path, uint64_t& size);
uint32_t crc32c(std::string_view bytes);

// Lists every regular file in `dir` (but the manifest) and writes the manifest there atomically (`writer` names
// its crash points).
void write_manifest(const std::string& dir, std::string_view writer);

// Checks `dir` against its manifest: every listed file present with its size and CRC-32C, and `required`
// files among them. False when `dir` has no manifest (a checkpoint from before manifests). Throws UsageError
// naming the file at fault.
bool verify_manifest(const std::string& dir, const std::initializer_list<const char*>& required);

}  // namespace ax::train

// A checkpoint as `run --resume` finds it: <output_dir>/checkpoints/step-N/ with trainer_state.json,
// trainer_state.safetensors and manifest.json, walked newest first by load_latest_checkpoint (every file
// checksummed against the manifest, every field of the trainer state checked, the tensors file opened),
// and the directory loaded directly as `resume_from = "<dir>"` does.
//
// Input: the first byte holds flags, then parts separated by kSeparator lines:
//   the directory's step number (digits; "step-" is prepended), trainer_state.json, trainer_state.safetensors,
//   manifest.json.
// Flags: bit 0 — replace the given manifest by a correct one (write_manifest), so that inputs reach the trainer
// state and tensors behind a matching checksum; bit 1 — also place an older, valid-looking step-0 directory
// holding only the manifest part (fallback path).
#include <cstdlib>
#include <filesystem>
#include <string>

#include "harness.hpp"
#include "train/checkpoint.hpp"
#include "train/checkpoint_manifest.hpp"

AX_FUZZ_HARNESS(checkpoint) {
  if (size == 0) return;
  const std::uint8_t flags = data[0];
  auto parts = ax::fuzz::split_parts({reinterpret_cast<const char*>(data + 1), size - 1}, 4);
  const std::string out = ax::fuzz::fresh_dir("run");
  const std::string root = out + "/checkpoints";
  std::string step(parts[0].substr(0, 24));
  for (char c : step)
    if (c == '/' || c == '\0') return;  // the harness only writes inside its own directory
  const std::string dir = root + "/step-" + step;
  if (!std::filesystem::create_directories(dir)) return;
  if (parts.size() > 1) ax::fuzz::write_file(dir + "/trainer_state.json", parts[1]);
  if (parts.size() > 2) ax::fuzz::write_file(dir + "/trainer_state.safetensors", parts[2]);
  if (flags & 1) ax::train::write_manifest(dir, "fuzz");
  else if (parts.size() > 3) ax::fuzz::write_file(dir + "/" + ax::train::kManifestFile, parts[3]);
  if ((flags & 2) && parts.size() > 3) {
    std::filesystem::create_directories(root + "/step-0");
    ax::fuzz::write_file(root + "/step-0/" + ax::train::kManifestFile, parts[3]);
  }

  auto latest = ax::train::load_latest_checkpoint(out);
  if (latest.loaded) {
    // What resume then trusts: the step agrees with the schedule it records.
    const auto& s = latest.loaded->state;
    if (s.step < 1 || s.step > s.total_steps || s.steps_per_epoch < 1) std::abort();
  }
  (void)ax::train::find_latest_checkpoint(out);
  (void)ax::train::load_checkpoint(dir);
}

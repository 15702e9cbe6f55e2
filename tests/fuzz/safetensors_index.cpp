// A sharded model directory: model.safetensors.index.json and the shards it names, opened as a model load does
// (Checkpoint::open_dir: every shard exists and holds exactly the tensors the index assigns to it), then every
// tensor read.
//
// Input: the index JSON, then up to three shards, each part being "<file name>\n<file bytes>", separated by
// kSeparator lines.
#include <cstdlib>

#include <ATen/ATen.h>

#include "axengine/safetensors.hpp"
#include "harness.hpp"

AX_FUZZ_HARNESS(safetensors_index) {
  auto parts = ax::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 4);
  const std::string dir = ax::fuzz::fresh_dir("model");
  ax::fuzz::write_file(dir + "/model.safetensors.index.json", parts[0]);
  for (std::size_t i = 1; i < parts.size(); ++i) {
    auto nl = parts[i].find('\n');
    if (nl == std::string_view::npos) continue;
    std::string name(parts[i].substr(0, nl));
    // Only plain names inside the directory: the harness must not write elsewhere.
    if (name.empty() || name.size() > 64 || name.find_first_of("/\\", 0) != std::string::npos || name == "." ||
        name == ".." || name.find('\0') != std::string::npos || name == "model.safetensors.index.json")
      continue;
    ax::fuzz::write_file(dir + "/" + name, parts[i].substr(nl + 1));
  }
  auto ckpt = ax::safetensors::Checkpoint::open_dir(dir);
  for (const auto& n : ckpt.names()) {
    const auto& info = ckpt.info(n);
    at::Tensor x = ckpt.get(n);
    if (static_cast<uint64_t>(x.nbytes()) != info.end - info.begin) std::abort();
    (void)ckpt.file_of(n);
  }
}

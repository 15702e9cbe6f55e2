// The runtime apply of [compile]: one setter per allow-listed key (allow_list.hpp), by the key's name.
// Process-wide knobs (tf32, cuDNN, determinism, TunableOp) are set in ATen's global context; the executor's
// knobs land in Runtime::executor.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <axengine/device.hpp>

#include "allow_list.hpp"

namespace ax::compile {

struct ExecutorSettings {
  bool cuda_graphs = false, static_shapes = false;
  int64_t warmup_steps = 3, max_graphs = 4;
};

struct Runtime {
  DeviceInfo device;
  std::string cache_dir;           // resolved tuning-cache directory
  ExecutorSettings executor;
  std::vector<std::string> notes;  // what was applied, for the run's log
};

using Setter = void (*)(Runtime& runtime, const Value& value);

// Every setter, by the key it applies.
const std::map<std::string, Setter>& setters();

// "" when the allow-list and the setters match one to one; else what is missing on which side.
std::string sentinel_mismatch();

// Applies `values` (CompileOptions::resolve for the device) in allow-list order. cache_dir first: the
// tuning setters read it.
void apply_settings(Runtime& runtime, const std::map<std::string, Value>& values);

// The default tuning-cache directory: $XDG_CACHE_HOME/axengine, else $HOME/.cache/axengine.
std::string default_cache_dir();

}  // namespace ax::compile

// A model directory's config.json, read as a model load reads it (read_json_file + parse_hf_config), then the
// derived quantities the decoder builds from it: which layers are MoE, and the RoPE inverse frequencies.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <ATen/ATen.h>

#include "harness.hpp"
#include "models/hf_config.hpp"

AX_FUZZ_HARNESS(hf_config) {
  const std::string path = ax::fuzz::scratch() + "/config.json";
  ax::fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  auto c = ax::models::parse_hf_config(ax::models::read_json_file(path), path);
  for (int64_t layer = 0; layer < std::min<int64_t>(c.num_layers, 64); ++layer) (void)c.is_moe_layer(layer);
  // A config that parses must give finite rotary frequencies, or every forward pass is NaN. (Bounded so the
  // harness does not allocate what the model itself would refuse later; real head_dims are <= 256.)
  if (c.head_dim > 0 && c.head_dim <= 4096) {
    at::Tensor inv = ax::models::rope_inv_freq(c);
    if (!at::isfinite(inv).all().item<bool>()) {
      std::fprintf(stderr, "hf_config: parsed config gives non-finite RoPE frequencies\n");
      std::abort();
    }
  }
}

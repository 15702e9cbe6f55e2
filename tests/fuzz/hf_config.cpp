// A model directory's config.json, read as a model load reads it (read_json_file + parse_hf_config), then the
// derived quantities the decoder builds from it: which layers are MoE, and the RoPE inverse frequencies.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <ATen/ATen.h>

#include "harness.hpp"
#include "models/hf_config.hpp"
#include "models/qwen2_5_vl.hpp"

AX_FUZZ_HARNESS(hf_config) {
  const std::string path = ax::fuzz::scratch() + "/config.json";
  ax::fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  const nlohmann::json j = ax::models::read_json_file(path);
  // qwen2_5_vl (its own parser, models/qwen2_5_vl_config.cpp): the text decoder it yields gets the checks below.
  const bool vl = j.is_object() && j.contains("model_type") && j["model_type"] == "qwen2_5_vl";
  auto c = vl ? ax::models::parse_qwen2_5_vl_config(j, path).text : ax::models::parse_hf_config(j, path);
  if (vl) {
    int64_t sum = 0;
    for (int64_t s : c.mrope_section) sum += s;
    if (c.mrope_section.size() != 3 || 2 * sum != c.head_dim) std::abort();  // the decoder slices inv_freq by it
  }
  for (int64_t layer = 0; layer < std::min<int64_t>(c.num_layers, 64); ++layer) (void)c.is_moe_layer(layer);
  // A config that parses must give finite rotary frequencies, or every forward pass is NaN. (Bounded so the
  // harness does not allocate what the model itself would refuse later; real head_dims are <= 256.)
  if (c.head_dim > 0 && c.head_dim <= 4096) {
    at::Tensor inv = ax::models::rope_inv_freq(c);
    if (!at::isfinite(inv).all().item<bool>()) {
      std::fprintf(stderr, "hf_config: parsed config gives non-finite RoPE frequencies\n");
      std::abort();
    }
    // Dynamic RoPE beyond max_position_embeddings: finite frequencies or a UsageError, never NaN.
    if (c.rope.type == "dynamic")
      for (int64_t len : {c.rope.max_position + 1, std::min<int64_t>(c.rope.max_position, int64_t(1) << 40) * 3 + 7}) {
        at::Tensor d = ax::models::rope_inv_freq(c, len);
        if (!at::isfinite(d).all().item<bool>()) std::abort();
      }
    // gemma3_text's sliding layers rotate with a RoPE of their own: the same guarantee.
    if (c.has_local_rope && (!at::isfinite(ax::models::rope_inv_freq(c, c.rope_local)).all().item<bool>() ||
                             !std::isfinite(c.rope_local.attention_factor) || !(c.rope_local.attention_factor > 0))) {
      std::fprintf(stderr, "hf_config: parsed config gives a non-finite local RoPE\n");
      std::abort();
    }
    if (!std::isfinite(c.rope.attention_factor) || !(c.rope.attention_factor > 0)) {
      std::fprintf(stderr, "hf_config: parsed config gives attention factor %g\n", c.rope.attention_factor);
      std::abort();
    }
  }
  for (int64_t layer = 0; layer < std::min<int64_t>(c.num_layers, 64); ++layer) (void)c.window(layer);
}

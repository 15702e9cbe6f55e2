// A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors), as `lora.init_from`,
// `merge-lora` and inference load it (load_peft: config fields, rank/alpha patterns, every tensor's name and
// shape against the model's LoRA sites), then each module's weight delta.
//
// The sites are those of the tiny Llama test model (tests/data/models/llama: 2 layers, hidden 20, 4 heads of 6,
// 2 KV heads, intermediate 28), whose PEFT adapter is a seed.
// Input: adapter_config.json, then adapter_model.safetensors, separated by a kSeparator line.
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "harness.hpp"
#include "models/lora.hpp"

namespace {

std::vector<ax::models::LoraSite> llama_sites() {
  const int64_t hidden = 20, q = 4 * 6, kv = 2 * 6, inter = 28;
  struct Leaf {
    const char* block;
    const char* leaf;
    int64_t in, out;
  };
  const Leaf leaves[] = {{"self_attn", "q_proj", hidden, q},    {"self_attn", "k_proj", hidden, kv},
                         {"self_attn", "v_proj", hidden, kv},   {"self_attn", "o_proj", q, hidden},
                         {"mlp", "gate_proj", hidden, inter},   {"mlp", "up_proj", hidden, inter},
                         {"mlp", "down_proj", inter, hidden}};
  std::vector<ax::models::LoraSite> sites;
  for (int layer = 0; layer < 2; ++layer)
    for (const auto& l : leaves) {
      ax::models::LoraSite s;
      s.path = "model.layers." + std::to_string(layer) + "." + l.block + "." + l.leaf;
      s.leaf = l.leaf;
      s.in_features = l.in;
      s.out_features = l.out;
      sites.push_back(s);
    }
  return sites;
}

}  // namespace

AX_FUZZ_HARNESS(peft_adapter) {
  static const auto sites = llama_sites();
  auto parts = ax::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 2);
  const std::string dir = ax::fuzz::fresh_dir("adapter");
  ax::fuzz::write_file(dir + "/adapter_config.json", parts[0]);
  if (parts.size() > 1) ax::fuzz::write_file(dir + "/adapter_model.safetensors", parts[1]);
  auto set = ax::models::load_peft(dir, "llama", sites, at::kFloat, at::kCPU);
  for (const auto& m : set.modules) {
    at::Tensor d = ax::models::lora_delta(m);
    if (d.size(-1) != m.site.in_features || d.size(-2) != m.site.out_features) std::abort();
  }
}

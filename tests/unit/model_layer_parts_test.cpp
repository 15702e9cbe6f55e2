// A decoder layer is an assembly of parts chosen once from the config (models/layer_parts.hpp): for every family
// preset, each layer's parts are the ones its architecture names (hybrid layers, MLA, MoE kinds, shared experts,
// gemma3_text's sandwich norms and GELU MLP), and the tensors, LoRA sites and decode cache the model holds are
// exactly its parts' (the load, LoRA and the op plan walk the same assembly: the op plan test holds the calls to
// what runs).
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "axengine/models.hpp"
#include "axengine/strings.hpp"
#include "models/decoder.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/family.hpp"
#include "models/hf_config.hpp"
#include "models/layer_parts.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;
using namespace ax::models;

namespace {

HfConfig preset_config(const std::string& preset) {
  const fs::path dir = ax::test::scratch_dir("layer_parts") / preset;
  ax::init_model_dir(preset, dir.string(), 7);
  return parse_hf_config(read_json_file((dir / "config.json").string()), (dir / "config.json").string());
}

// Layer i's parts, "norms mixer ffn [shared_expert]" with "local" where it rotates with the local RoPE.
std::string describe(const LayerParts& l) {
  std::string s = ax::str(l.norms->name, " ", l.mixer->name, " ", l.ffn->name);
  if (l.shared_expert) s += ax::str(" ", l.shared_expert->name);
  if (l.local_rope) s += " local";
  return s;
}

}  // namespace

TEST_CASE("layer parts: every family preset's layers are assembled from the parts its architecture names") {
  // The tiny presets (two layers each; families/<name>.cpp): which mixer, feed-forward part and norms each layer has.
  const std::map<std::string, std::vector<std::string>> want = {
      {"tiny-llama", {"prenorm attention swiglu_mlp", "prenorm attention swiglu_mlp"}},
      {"tiny-qwen2", {"prenorm attention swiglu_mlp", "prenorm attention swiglu_mlp"}},
      {"tiny-mistral", {"prenorm attention swiglu_mlp", "prenorm attention swiglu_mlp"}},
      {"tiny-qwen3", {"prenorm attention swiglu_mlp", "prenorm attention swiglu_mlp"}},
      {"tiny-qwen3-moe", {"prenorm attention moe_softmax_topk", "prenorm attention moe_softmax_topk"}},
      {"tiny-mixtral", {"prenorm attention moe_softmax_topk", "prenorm attention moe_softmax_topk"}},
      {"tiny-gemma3", {"sandwich attention gelu_mlp local", "sandwich attention gelu_mlp"}},
      {"tiny-olmoe", {"prenorm attention moe_softmax_topk", "prenorm attention moe_softmax_topk"}},
      {"tiny-gpt-oss", {"prenorm attention moe_gpt_oss", "prenorm attention moe_gpt_oss"}},
      {"tiny-qwen3_5", {"prenorm gated_deltanet swiglu_mlp", "prenorm attention swiglu_mlp"}},
      {"tiny-qwen3_5-moe",
       {"prenorm gated_deltanet moe_softmax_topk shared_expert", "prenorm attention moe_softmax_topk shared_expert"}},
      {"tiny-qwen3-next",
       {"prenorm gated_deltanet moe_softmax_topk shared_expert", "prenorm attention moe_softmax_topk shared_expert"}},
      {"tiny-glm4-moe", {"prenorm attention swiglu_mlp", "prenorm attention moe_group_topk shared_expert"}},
      {"tiny-deepseek-v3", {"prenorm mla swiglu_mlp", "prenorm mla moe_group_topk shared_expert"}},
  };
  std::size_t presets = 0;  // every family's tiny presets (bench-qwen3-moe-0.9b is tiny-qwen3-moe's family, too big here)
  for (const Family* f : families())
    for (const auto& p : f->presets) presets += p.name.rfind("tiny-", 0) == 0;
  CHECK(want.size() == presets);
  for (const auto& [preset, layers] : want) {
    CAPTURE(preset);
    const HfConfig c = preset_config(preset);
    const auto parts = assemble_layers(c);
    std::vector<std::string> got;
    for (const auto& l : parts) got.push_back(describe(l));
    CHECK(got == layers);
  }
}

TEST_CASE("layer parts: the model's tensors and LoRA sites are its layers' parts', in order") {
  for (const Family* f : families()) {
    CAPTURE(f->name);
    const HfConfig c = preset_config(f->presets.front().name);
    const auto parts = assemble_layers(c);
    REQUIRE(static_cast<int64_t>(parts.size()) == c.num_layers);
    TensorShapes layers;
    std::vector<LoraSite> sites;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      layer_tensors(c, parts[i], layer_prefix(static_cast<int64_t>(i)), layers);
      layer_lora_sites(c, parts[i], layer_prefix(static_cast<int64_t>(i)), sites);
    }
    // internal_tensors: the embeddings, the layers' parts, the final norm (and the head when untied).
    const TensorShapes all = internal_tensors(c);
    REQUIRE(all.size() == layers.size() + (c.tie_word_embeddings ? 2 : 3));
    CHECK(all.front().first == "model.embed_tokens.weight");
    for (std::size_t k = 0; k < layers.size(); ++k) CHECK(all[k + 1] == layers[k]);
    const auto lora = lora_sites(c);
    REQUIRE(lora.size() == sites.size());
    for (std::size_t k = 0; k < sites.size(); ++k) CHECK(lora[k].path == sites[k].path);
    // Each mixer's decode cache: attention and MLA keep k/v, a Gated DeltaNet a conv window and a state.
    for (const auto& l : parts) {
      const MixerCache m = l.mixer->cache(c, 2, 16);
      CHECK((m.k.empty() && m.v.empty()) == !m.state.empty());
      CHECK(m.conv.empty() == m.state.empty());
    }
  }
}

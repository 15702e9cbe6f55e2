#include "models/family.hpp"

#include "models/hf_config.hpp"

namespace ax::models {

// One per file of families/.
const Family& llama_family();
const Family& mistral_family();
const Family& qwen2_family();
const Family& qwen3_family();
const Family& qwen3_moe_family();
const Family& mixtral_family();
const Family& olmoe_family();
const Family& gemma3_text_family();
const Family& gpt_oss_family();
const Family& qwen3_5_family();
const Family& qwen3_5_moe_family();
const Family& qwen3_next_family();
const Family& glm4_moe_family();
const Family& deepseek_v3_family();

const std::vector<const Family*>& families() {
  // In init-model's order of presets (and docs/models.md's table).
  static const std::vector<const Family*> all = {&llama_family(),       &qwen2_family(), &mistral_family(),
                                                 &qwen3_family(),       &qwen3_moe_family(), &mixtral_family(),
                                                 &gemma3_text_family(), &olmoe_family(), &gpt_oss_family(),
                                                 &qwen3_5_family(),     &qwen3_5_moe_family(),
                                                 &qwen3_next_family(),  &glm4_moe_family(), &deepseek_v3_family()};
  return all;
}

const Family* find_family(const std::string& model_type) {
  for (const Family* f : families()) {
    if (f->name == model_type) return f;
    for (const auto& t : f->also_types)
      if (t == model_type) return f;
  }
  return nullptr;
}

const Family& family_of(const HfConfig& c) { return *find_family(c.model_type); }

std::string refused_type_message(const std::string& model_type) {
  for (const Family* f : families())
    for (const auto& [type, message] : f->refused_types)
      if (type == model_type) return message;
  return "";
}

}  // namespace ax::models

#include "train/lora_config.hpp"

#include "axengine/strings.hpp"
#include "data/entry.hpp"

namespace ax::train {
namespace {

void bind_lora(TableBinder& t, LoraConfig& c) {
  LoraSpec& s = c.spec;
  t.field("targets", s.targets, "module names that get an adapter, as peft's target_modules (q_proj ... down_proj; MoE experts: gate_up_proj/down_proj or gate_proj/up_proj/down_proj)");
  t.bounded("r", s.r, 1, 4096, "adapter rank");
  t.field("alpha", s.alpha, "scaling numerator: the update is (alpha / r) * B A");
  t.field("dropout", s.dropout, "dropout on the adapter's input while training (not on experts, as in peft)");
  t.field("rslora", s.rslora, "rank-stabilised scaling alpha / sqrt(r)");
  t.choice("dtype", s.dtype, {"fp32", "compute"}, "adapter weights in fp32 (mixed precision master weights) or in the compute dtype");
  t.field("init_from", c.init_from, "a PEFT adapter directory to continue training instead of a fresh adapter (relative to the config file)");
  if (s.dropout < 0 || s.dropout >= 1) t.fail(t.table() ? t.table()->get("dropout") : nullptr, "'lora.dropout' must be in [0, 1)");
}

LoraConfig defaults() {
  LoraConfig c;
  c.spec.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  c.spec.r = 16;
  c.spec.alpha = 32;
  return c;
}

void bind_lora_section(TableBinder& t, RunConfig&) {
  LoraConfig c = defaults();
  bind_lora(t, c);
}

struct Registrar {
  Registrar() { register_config_section({"lora", "the LoRA adapter that training creates (or continues) on the base model", bind_lora_section}); }
} registrar;

}  // namespace

LoraConfig read_lora_config(const RunConfig& config) {
  LoraConfig c = defaults();
  const toml::node* n = config.document.get("lora");
  TableBinder t(n ? n->as_table() : nullptr, "lora", BindContext{config.file, nullptr});
  bind_lora(t, c);
  c.spec.seed = static_cast<uint64_t>(config.run.seed);
  c.init_from = data::resolve_against(config.dir, c.init_from);
  return c;
}

}  // namespace ax::train

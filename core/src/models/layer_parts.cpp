#include "models/layer_parts.hpp"

#include "axengine/strings.hpp"

namespace ax::models {

std::string layer_prefix(int64_t i) { return str("model.layers.", i, "."); }

namespace {

const FfnPart& moe_part(MoeKind kind) {
  switch (kind) {
    case MoeKind::softmax_topk: return Parts::moe_softmax_topk();
    case MoeKind::topk_softmax_clamped: return Parts::moe_gpt_oss();
    case MoeKind::group_topk_sigmoid: return Parts::moe_group_topk();
  }
  return Parts::moe_softmax_topk();  // unreachable: every kind is listed
}

}  // namespace

std::vector<LayerParts> assemble_layers(const HfConfig& c) {
  std::vector<LayerParts> out;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerParts l;
    l.norms = c.sandwich_norms ? &Parts::sandwich() : &Parts::prenorm();
    l.mixer = c.is_linear_layer(i) ? &Parts::gated_deltanet() : c.is_mla() ? &Parts::mla() : &Parts::attention();
    if (c.is_moe_layer(i)) {
      l.ffn = &moe_part(c.moe_kind);
      if (c.shared_expert_intermediate_size > 0) l.shared_expert = &Parts::shared_expert();
    } else {
      // gemma3_text: gelu_pytorch_tanh, for which there is no fused op; every other family's is SiLU (swiglu).
      l.ffn = c.mlp_act == "gelu_pytorch_tanh" ? &Parts::gelu_mlp() : &Parts::swiglu_mlp();
    }
    l.local_rope = c.has_local_rope && c.window(i) > 0;
    out.push_back(l);
  }
  return out;
}

namespace {

// The layer's parts in forward order, the shared expert where there is one.
std::vector<const PartFacets*> parts_of(const LayerParts& l) {
  std::vector<const PartFacets*> out = {l.norms, l.mixer, l.ffn};
  if (l.shared_expert) out.push_back(l.shared_expert);
  return out;
}

}  // namespace

void layer_tensors(const HfConfig& c, const LayerParts& l, const std::string& prefix, TensorShapes& out) {
  l.norms->tensors(c, prefix, out);
  l.mixer->tensors(c, prefix, out);
  if (l.norms->ffn_tensors) l.norms->ffn_tensors(c, prefix, out);
  l.ffn->tensors(c, prefix, out);
  if (l.shared_expert) l.shared_expert->tensors(c, prefix, out);
}

void layer_lora_sites(const HfConfig& c, const LayerParts& l, const std::string& prefix, std::vector<LoraSite>& out) {
  for (const PartFacets* p : parts_of(l))
    if (p->lora_sites) p->lora_sites(c, prefix, out);
}

void layer_calls(const HfConfig& c, const LayerParts& l, const std::string& prefix, const HeldFormats& formats,
                 std::vector<OpCall>& out) {
  for (const PartFacets* p : parts_of(l))
    if (p->calls) p->calls(c, prefix, formats, out);
}

}  // namespace ax::models

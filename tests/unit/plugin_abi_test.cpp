// The plugin ABI (version.hpp, docs/plugins.md "The plugin ABI"): the rule the loader enforces, real
// plugins built against other ABI numbers, and a guard on what plugins and the host exchange.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <sstream>

#include "axengine/chat_media.hpp"
#include "axengine/dataset.hpp"
#include "axengine/model.hpp"
#include "axengine/op_spec.hpp"
#include "axengine/ops/attention.hpp"
#include "axengine/ops/dequant.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/norm_rope.hpp"
#include "axengine/ops/quantizer.hpp"
#include "axengine/optimizer.hpp"
#include "axengine/plugin.hpp"
#include "axengine/plugin_loader.hpp"
#include "axengine/tokenizer.hpp"
#include "axengine/version.hpp"
#include "plugins/abi_rule.hpp"
#include "test_util.hpp"

using ax::PluginReport;
using namespace ax_test;

namespace {

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

std::string host_abi() { return std::to_string(ax::kPluginAbiMajor) + "." + std::to_string(ax::kPluginAbiMinor); }

}  // namespace

TEST_CASE("abi: same major and a minor no newer than the host's loads, anything else is refused") {
  for (int minor = 0; minor <= 3; ++minor) CHECK_FALSE(ax::abi_refusal(1, minor, 1, 3));
  auto newer = ax::abi_refusal(1, 4, 1, 3);
  REQUIRE(newer);
  CHECK(contains(*newer, "plugin ABI 1.4 (host: plugin ABI 1.3): a newer minor"));
  auto next = ax::abi_refusal(2, 0, 1, 3);
  REQUIRE(next);
  CHECK(contains(*next, "plugin ABI 2.0 (host: plugin ABI 1.3): another major"));
  CHECK(ax::abi_refusal(0, 3, 1, 3));
  CHECK(ax::abi_refusal(2, 3, 1, 3));
  CHECK_FALSE(ax::abi_refusal(ax::kPluginAbiMajor, ax::kPluginAbiMinor));  // the host's own default
}

TEST_CASE("abi: a plugin built for the host's major with minor 0 loads and works") {
  // While the host's minor is 0 this is the equal case; after a minor bump it is the older-minor case with
  // no change here (tests/plugins/CMakeLists.txt reads the numbers from version.hpp).
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  const auto& r = loader.load_file(test_plugin("test_abi_minor0"), "command line");
  INFO(r.reason);
  REQUIRE(r.status == PluginReport::Status::loaded);
  CHECK(r.providers == std::vector<std::string>{"optimizer test_abi_minor0_sgd"});
  CHECK(registry.get<ax::OptimizerProvider>(ax::ProviderKind::optimizer, "test_abi_minor0_sgd") != nullptr);
}

TEST_CASE("abi: a newer minor, the next major and the previous major are refused, their code never runs") {
  struct Case {
    std::string plugin, abi, why;
  };
  const int major = ax::kPluginAbiMajor, minor = ax::kPluginAbiMinor;
  const std::vector<Case> cases{
      {"test_abi_newer_minor", std::to_string(major) + "." + std::to_string(minor + 1), "a newer minor"},
      {"test_abi_next_major", std::to_string(major + 1) + ".0", "another major"},
      {"test_abi_prev_major", std::to_string(major - 1) + "." + std::to_string(minor), "another major"},
  };
  for (const auto& c : cases) {
    ax::Registry registry;
    ax::PluginLoader loader(registry);
    const auto& r = loader.load_file(test_plugin(c.plugin), "command line");  // aborts if its code runs
    INFO(c.plugin << ": " << r.reason);
    CHECK(r.status == PluginReport::Status::refused);
    CHECK(contains(r.reason, "plugin ABI " + c.abi + " (host: plugin ABI " + host_abi() + "): " + c.why));
  }
}

// ---------------------------------------------------------------------------------------------------------
// The ABI guard. Plugins and the host exchange these structs by reference and call these virtual functions
// through vtables laid out at the plugin's compile time. Changing a size, an offset, a virtual's slot or its
// signature breaks every plugin built before: that needs a plugin ABI MAJOR bump (version.hpp) — then update
// the numbers here. Signatures are pinned by the member-pointer types (a change does not compile); slots by
// the Itanium C++ ABI, in which a pointer to a virtual member holds 1 + its byte offset in the vtable. A
// virtual added after the last one recorded here is not caught: the rule still applies.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"  // offsetof on non-standard-layout types: GCC and Clang define it

namespace {

#define AX_FIELD(f) << " " #f "@" << offsetof(T, f)
#define AX_LAYOUT(Type, fields)                           \
  [] {                                                    \
    using T = Type;                                       \
    std::ostringstream os;                                \
    os << sizeof(T) << "/" << alignof(T) << ":" fields;   \
    return os.str();                                      \
  }()

template <class MemberPointer>
std::size_t slot(MemberPointer member) {
  static_assert(sizeof(MemberPointer) == 2 * sizeof(void*), "Itanium C++ ABI member function pointer");
  std::uintptr_t bits[2];
  std::memcpy(bits, &member, sizeof bits);
  REQUIRE((bits[0] & 1) == 1);  // virtual
  return (bits[0] - 1) / sizeof(void*);
}

// The protected run_* virtuals, reachable from a derived class.
struct MoeProbe : ax::ops::MoeExperts {
  using Fwd = ax::ops::MoeExpertsResult (ax::ops::MoeExperts::*)(const ax::ops::MoeExpertsArgs&);
  using Bwd = ax::ops::MoeExpertsGrads (ax::ops::MoeExperts::*)(const ax::ops::MoeExpertsArgs&,
                                                                 const ax::ops::MoeExpertsBackwardArgs&);
  static std::string slots() {
    return std::to_string(slot(Fwd(&MoeProbe::run_forward))) + " " + std::to_string(slot(Bwd(&MoeProbe::run_backward)));
  }
};
struct AttentionProbe : ax::ops::Attention {
  using Fwd = ax::ops::AttentionResult (ax::ops::Attention::*)(const ax::ops::AttentionArgs&);
  using Bwd = ax::ops::AttentionGrads (ax::ops::Attention::*)(const ax::ops::AttentionArgs&,
                                                               const ax::ops::AttentionBackwardArgs&);
  static std::string slots() {
    return std::to_string(slot(Fwd(&AttentionProbe::run_forward))) + " " + std::to_string(slot(Bwd(&AttentionProbe::run_backward)));
  }
};
struct LinearLoraProbe : ax::ops::LinearLora {
  using Fwd = at::Tensor (ax::ops::LinearLora::*)(const ax::ops::LinearLoraArgs&);
  using Bwd = ax::ops::LinearLoraGrads (ax::ops::LinearLora::*)(const ax::ops::LinearLoraArgs&,
                                                                 const ax::ops::LinearLoraBackwardArgs&);
  static std::string slots() {
    return std::to_string(slot(Fwd(&LinearLoraProbe::run_forward))) + " " + std::to_string(slot(Bwd(&LinearLoraProbe::run_backward)));
  }
};
struct NormRopeProbe : ax::ops::NormRope {
  using Fwd = at::Tensor (ax::ops::NormRope::*)(const ax::ops::NormRopeArgs&);
  using Bwd = ax::ops::NormRopeGrads (ax::ops::NormRope::*)(const ax::ops::NormRopeArgs&,
                                                             const ax::ops::NormRopeBackwardArgs&);
  static std::string slots() {
    return std::to_string(slot(Fwd(&NormRopeProbe::run_forward))) + " " + std::to_string(slot(Bwd(&NormRopeProbe::run_backward)));
  }
};
struct DequantProbe : ax::ops::Dequant {
  using Run = at::Tensor (ax::ops::Dequant::*)(const ax::ops::DequantArgs&);
  static std::string slots() { return std::to_string(slot(Run(&DequantProbe::run))); }
};

}  // namespace

TEST_CASE("abi guard: layouts of the structs plugins exchange with the host") {
  using namespace ax;
  using namespace ax::ops;
  using Staged = PluginRegistrar::Staged;
  CHECK(AX_LAYOUT(PluginRegistrar, ) == "48/8:");
  CHECK(AX_LAYOUT(PluginConfigTable, AX_FIELD(path) AX_FIELD(doc) AX_FIELD(bind) AX_FIELD(plugin)) ==
        "128/8: path@0 doc@32 bind@64 plugin@96");
  // Plugins bind their tables through TableBinder, whose accessors are inline.
  CHECK(AX_LAYOUT(TableBinder, ) == "104/8:");
  CHECK(AX_LAYOUT(BindContext, AX_FIELD(file) AX_FIELD(docs)) == "40/8: file@0 docs@32");
  // ABI 2.0: ops are registered data (op_spec.hpp); kernel providers say whether they are graph safe.
  CHECK(AX_LAYOUT(OpTolerance, AX_FIELD(dtype) AX_FIELD(forward) AX_FIELD(backward)) == "48/8: dtype@0 forward@32 backward@40");
  CHECK(AX_LAYOUT(OpSpec, AX_FIELD(id) AX_FIELD(config_key) AX_FIELD(summary) AX_FIELD(dtypes) AX_FIELD(formats)
                              AX_FIELD(layouts) AX_FIELD(tolerances) AX_FIELD(reference) AX_FIELD(reference_summary)
                                  AX_FIELD(conformance)) ==
        "272/8: id@0 config_key@32 summary@64 dtypes@96 formats@120 layouts@144 tolerances@168 reference@192 "
        "reference_summary@208 conformance@240");
  CHECK(AX_LAYOUT(ProviderInfo, AX_FIELD(kind) AX_FIELD(op) AX_FIELD(name) AX_FIELD(needs) AX_FIELD(plugin)
                                    AX_FIELD(origin) AX_FIELD(summary) AX_FIELD(graph_safe)) ==
        "280/8: kind@0 op@8 name@40 needs@72 plugin@176 origin@208 summary@240 graph_safe@272");
  CHECK(AX_LAYOUT(Staged, AX_FIELD(kind) AX_FIELD(op) AX_FIELD(name) AX_FIELD(object)) ==
        "88/8: kind@0 op@8 name@40 object@72");
  CHECK(AX_LAYOUT(WeightTensor, AX_FIELD(format) AX_FIELD(block_rows) AX_FIELD(shape) AX_FIELD(values) AX_FIELD(codes)
                                    AX_FIELD(scales) AX_FIELD(blocksize) AX_FIELD(axis) AX_FIELD(nested_scales)
                                        AX_FIELD(nested_code) AX_FIELD(nested_offset) AX_FIELD(nested_blocksize)
                                            AX_FIELD(global_scale)) ==
        "112/8: format@0 block_rows@4 shape@8 values@32 codes@40 scales@48 blocksize@56 axis@64 nested_scales@72 "
        "nested_code@80 nested_offset@88 nested_blocksize@96 global_scale@104");
  CHECK(AX_LAYOUT(MoeRouting, AX_FIELD(sorted_expert_idxs) AX_FIELD(sorted_scattered_idxs) AX_FIELD(expert_offsets)
                                  AX_FIELD(top_k)) ==
        "32/8: sorted_expert_idxs@0 sorted_scattered_idxs@8 expert_offsets@16 top_k@24");
  CHECK(AX_LAYOUT(MoeExpertsArgs, AX_FIELD(x) AX_FIELD(routing) AX_FIELD(weight) AX_FIELD(layout) AX_FIELD(lora_a)
                                      AX_FIELD(lora_b) AX_FIELD(scaling) AX_FIELD(bias) AX_FIELD(gates)
                                          AX_FIELD(grouped_in) AX_FIELD(grouped_out) AX_FIELD(out)
                                              AX_FIELD(check_values)) ==
        "224/8: x@0 routing@8 weight@40 layout@152 lora_a@160 lora_b@168 scaling@176 bias@184 gates@192 "
        "grouped_in@200 grouped_out@201 out@208 check_values@216");
  CHECK(AX_LAYOUT(MoeExpertsResult, AX_FIELD(y) AX_FIELD(saved)) ==
        "32/8: y@0 saved@8");
  CHECK(AX_LAYOUT(MoeExpertsGrads, AX_FIELD(dx) AX_FIELD(dlora_a) AX_FIELD(dlora_b) AX_FIELD(dgates)) ==
        "32/8: dx@0 dlora_a@8 dlora_b@16 dgates@24");
  CHECK(AX_LAYOUT(MoeExpertsBackwardArgs, AX_FIELD(grad_y) AX_FIELD(saved) AX_FIELD(need_dx) AX_FIELD(need_dlora)
                                              AX_FIELD(need_dgates) AX_FIELD(out)) ==
        "72/8: grad_y@0 saved@8 need_dx@32 need_dlora@33 need_dgates@34 out@40");
  CHECK(AX_LAYOUT(AttentionArgs, AX_FIELD(q) AX_FIELD(k) AX_FIELD(v) AX_FIELD(cu_seqlens) AX_FIELD(max_seqlen)
                                     AX_FIELD(softmax_scale) AX_FIELD(causal) AX_FIELD(window_left) AX_FIELD(out)
                                         AX_FIELD(check_values) AX_FIELD(sinks) AX_FIELD(groups) AX_FIELD(cu_seqlens_k)
                                             AX_FIELD(max_seqlen_k)) ==
        "112/8: q@0 k@8 v@16 cu_seqlens@24 max_seqlen@32 softmax_scale@40 causal@48 window_left@56 out@64 "
        "check_values@72 sinks@80 groups@88 cu_seqlens_k@96 max_seqlen_k@104");  // ABI 3.0: sinks; 8.0: groups; 10.0: keys' own boundaries
  CHECK(AX_LAYOUT(AttentionResult, AX_FIELD(out) AX_FIELD(lse) AX_FIELD(saved)) ==
        "40/8: out@0 lse@8 saved@16");
  CHECK(AX_LAYOUT(AttentionGrads, AX_FIELD(dq) AX_FIELD(dk) AX_FIELD(dv) AX_FIELD(dsinks)) ==
        "32/8: dq@0 dk@8 dv@16 dsinks@24");
  CHECK(AX_LAYOUT(AttentionBackwardArgs, AX_FIELD(grad_out) AX_FIELD(out) AX_FIELD(lse) AX_FIELD(saved)
                                             AX_FIELD(grads_out)) ==
        "80/8: grad_out@0 out@8 lse@16 saved@24 grads_out@48");
  CHECK(AX_LAYOUT(DequantArgs, AX_FIELD(weight) AX_FIELD(dtype) AX_FIELD(experts) AX_FIELD(out)
                                   AX_FIELD(check_values)) ==
        "144/8: weight@0 dtype@112 experts@120 out@128 check_values@136");
  CHECK(AX_LAYOUT(LinearLoraArgs, AX_FIELD(x) AX_FIELD(weight) AX_FIELD(bias) AX_FIELD(lora_a) AX_FIELD(lora_b)
                                      AX_FIELD(scaling) AX_FIELD(out)) ==
        "160/8: x@0 weight@8 bias@120 lora_a@128 lora_b@136 scaling@144 out@152");
  CHECK(AX_LAYOUT(LinearLoraGrads, AX_FIELD(dx) AX_FIELD(dlora_a) AX_FIELD(dlora_b)) ==
        "24/8: dx@0 dlora_a@8 dlora_b@16");
  CHECK(AX_LAYOUT(LinearLoraBackwardArgs, AX_FIELD(grad_y) AX_FIELD(need_dx) AX_FIELD(need_dlora) AX_FIELD(out)) ==
        "40/8: grad_y@0 need_dx@8 need_dlora@9 out@16");
  CHECK(AX_LAYOUT(NormRopeArgs, AX_FIELD(x) AX_FIELD(weight) AX_FIELD(eps) AX_FIELD(weight_offset) AX_FIELD(cos)
                                    AX_FIELD(sin) AX_FIELD(position_ids) AX_FIELD(inv_freq)
                                        AX_FIELD(attention_scaling) AX_FIELD(out)) ==
        "80/8: x@0 weight@8 eps@16 weight_offset@24 cos@32 sin@40 position_ids@48 inv_freq@56 "
        "attention_scaling@64 out@72");
  CHECK(AX_LAYOUT(NormRopeGrads, AX_FIELD(dx) AX_FIELD(dweight)) ==
        "16/8: dx@0 dweight@8");
  CHECK(AX_LAYOUT(NormRopeBackwardArgs, AX_FIELD(grad_y) AX_FIELD(need_dx) AX_FIELD(need_dweight) AX_FIELD(out)) ==
        "32/8: grad_y@0 need_dx@8 need_dweight@9 out@16");
  CHECK(AX_LAYOUT(Batch, AX_FIELD(input_ids) AX_FIELD(labels) AX_FIELD(position_ids) AX_FIELD(cu_seqlens)
                             AX_FIELD(max_seqlen) AX_FIELD(extras) AX_FIELD(cu_seqlens_host) AX_FIELD(min_token_id)
                                 AX_FIELD(max_token_id) AX_FIELD(input_ids_host) AX_FIELD(extras_host)) ==
        "168/8: input_ids@0 labels@8 position_ids@16 cu_seqlens@24 max_seqlen@32 extras@40 cu_seqlens_host@88 "
        "min_token_id@96 max_token_id@104 input_ids_host@112 extras_host@120");
  CHECK(AX_LAYOUT(ModelOutput, AX_FIELD(logits) AX_FIELD(loss) AX_FIELD(aux_loss)) ==
        "24/8: logits@0 loss@8 aux_loss@16");
  CHECK(AX_LAYOUT(LoraSpec, AX_FIELD(targets) AX_FIELD(vision_targets) AX_FIELD(r) AX_FIELD(alpha) AX_FIELD(dropout)
                                AX_FIELD(rslora) AX_FIELD(dtype) AX_FIELD(seed)) ==
        "120/8: targets@0 vision_targets@24 r@48 alpha@56 dropout@64 rslora@72 dtype@80 seed@112");
  CHECK(AX_LAYOUT(ModelLoadOptions, AX_FIELD(dir) AX_FIELD(dtype) AX_FIELD(device) AX_FIELD(kernels) AX_FIELD(lora)
                                        AX_FIELD(adapter_dir) AX_FIELD(activation_checkpointing) AX_FIELD(weights)
                                            AX_FIELD(expert_parallel)) ==
        "368/8: dir@0 dtype@32 device@64 kernels@96 lora@112 adapter_dir@240 activation_checkpointing@272 weights@280 "
        "expert_parallel@352");
  CHECK(AX_LAYOUT(WeightPolicy, AX_FIELD(format) AX_FIELD(skip_modules) AX_FIELD(blocksize) AX_FIELD(double_quant)) ==
        "72/8: format@0 skip_modules@32 blocksize@56 double_quant@64");
  CHECK(AX_LAYOUT(WeightStats, AX_FIELD(format) AX_FIELD(params) AX_FIELD(bytes) AX_FIELD(packed_params)
                                   AX_FIELD(packed_bytes) AX_FIELD(peak_bytes) AX_FIELD(kept)) ==
        "96/8: format@0 params@32 bytes@40 packed_params@48 packed_bytes@56 peak_bytes@64 kept@72");
  CHECK(AX_LAYOUT(QuantizeSpec, AX_FIELD(format) AX_FIELD(blocksize) AX_FIELD(double_quant) AX_FIELD(axis)
                                    AX_FIELD(per_expert_scale)) ==
        "40/8: format@0 blocksize@8 double_quant@16 axis@24 per_expert_scale@32");
  CHECK(AX_LAYOUT(ParamGroup, AX_FIELD(params) AX_FIELD(weight_decay)) ==
        "32/8: params@0 weight_decay@24");
  CHECK(AX_LAYOUT(Sample, AX_FIELD(input_ids) AX_FIELD(labels) AX_FIELD(extras) AX_FIELD(materialise)) ==
        "128/8: input_ids@0 labels@24 extras@48 materialise@96");
  CHECK(AX_LAYOUT(DatasetContext, AX_FIELD(tokenizer) AX_FIELD(config_file) AX_FIELD(base_dir) AX_FIELD(model_dir)
                                       AX_FIELD(image_processor)) ==
        "136/8: tokenizer@0 config_file@8 base_dir@40 model_dir@72 image_processor@104");
  CHECK(AX_LAYOUT(ChatImageOptions, AX_FIELD(min_pixels) AX_FIELD(max_pixels)) == "16/8: min_pixels@0 max_pixels@8");
}

TEST_CASE("abi guard: vtable slots and signatures of the interfaces plugins implement") {
  using namespace ax;
  // Slots 0 and 1 are the virtual destructor (complete and deleting).
  CHECK(MoeProbe::slots() == "2 3");
  CHECK(AttentionProbe::slots() == "3 4");  // 4.0: decline() takes slot 2
  CHECK(LinearLoraProbe::slots() == "2 3");
  CHECK(NormRopeProbe::slots() == "2 3");
  CHECK(DequantProbe::slots() == "2");

  using ModelLoad = std::unique_ptr<Model> (ModelFamily::*)(const nlohmann::json&, const ModelLoadOptions&) const;
  CHECK(slot(ModelLoad(&ModelFamily::load)) == 2);
  using ModelForward = ModelOutput (Model::*)(const Batch&, bool);
  using Params = std::vector<std::pair<std::string, at::Tensor>> (Model::*)() const;
  using SetTraining = void (Model::*)(bool);
  using SaveAdapter = void (Model::*)(const std::string&) const;
  CHECK(slot(ModelForward(&Model::forward)) == 2);
  CHECK(slot(Params(&Model::named_parameters)) == 3);
  CHECK(slot(Params(&Model::trainable_parameters)) == 4);
  CHECK(slot(SetTraining(&Model::set_training)) == 5);
  CHECK(slot(SaveAdapter(&Model::save_adapter)) == 6);
  using Stats = WeightStats (Model::*)() const;
  CHECK(slot(Stats(&Model::weight_stats)) == 7);
  using Quantize = ops::WeightTensor (ops::Quantizer::*)(const at::Tensor&, const ops::QuantizeSpec&);
  CHECK(slot(Quantize(&ops::Quantizer::quantize)) == 2);

  using Create = std::unique_ptr<Optimizer> (OptimizerProvider::*)(std::vector<ParamGroup>, const toml::table&) const;
  CHECK(slot(Create(&OptimizerProvider::create)) == 2);
  using Step = void (Optimizer::*)(double);
  using ZeroGrad = void (Optimizer::*)();
  using StateDict = std::map<std::string, at::Tensor> (Optimizer::*)() const;
  using LoadStateDict = void (Optimizer::*)(const std::map<std::string, at::Tensor>&);
  CHECK(slot(Step(&Optimizer::step)) == 2);
  CHECK(slot(ZeroGrad(&Optimizer::zero_grad)) == 3);
  CHECK(slot(StateDict(&Optimizer::state_dict)) == 4);
  CHECK(slot(LoadStateDict(&Optimizer::load_state_dict)) == 5);
  using StepUnlessInf = void (Optimizer::*)(double, const at::Tensor&);
  CHECK(slot(StepUnlessInf(&Optimizer::step)) == 6);

  using KnownKeys = std::vector<std::string> (DatasetType::*)() const;
  using Open = std::shared_ptr<Dataset> (DatasetType::*)(const toml::table&, const DatasetContext&) const;
  CHECK(slot(KnownKeys(&DatasetType::known_keys)) == 2);
  CHECK(slot(Open(&DatasetType::open)) == 3);
  using Collate = std::map<std::string, at::Tensor> (DatasetType::*)(const BatchLayout&) const;
  CHECK(slot(Collate(&DatasetType::collate)) == 4);
  using Size = std::size_t (Dataset::*)() const;
  using Get = Sample (Dataset::*)(std::size_t) const;
  CHECK(slot(Size(&Dataset::size)) == 2);
  CHECK(slot(Get(&Dataset::get)) == 3);
  CHECK(slot(Size(&Dataset::skipped_rows)) == 4);
  // 11.0: a processor kind (DatasetContext::image_processor), no longer a model_type.
  using ChatImageProcessorOf = std::shared_ptr<const ChatImageProcessor> (ChatImageSupport::*)(
      const std::string&, const ChatImageOptions&, const DatasetContext&) const;
  using ChatImageKinds = std::vector<std::string> (ChatImageSupport::*)() const;
  CHECK(slot(ChatImageProcessorOf(&ChatImageSupport::chat_image_processor)) == 2);
  CHECK(slot(ChatImageKinds(&ChatImageSupport::chat_image_processors)) == 3);
  using Marker = std::string (ChatImageProcessor::*)() const;
  using Expand = std::string (ChatImageProcessor::*)(const std::string&) const;
  using ImageTokens = std::vector<int32_t> (ChatImageProcessor::*)() const;
  using AddExtras = void (ChatImageProcessor::*)(const std::vector<std::string>&, Sample&) const;
  CHECK(slot(Marker(&ChatImageProcessor::image_marker)) == 2);
  CHECK(slot(Expand(&ChatImageProcessor::expand)) == 3);
  CHECK(slot(ImageTokens(&ChatImageProcessor::image_token_ids)) == 4);
  CHECK(slot(AddExtras(&ChatImageProcessor::add_extras)) == 5);

  using Encode = std::vector<int32_t> (Tokenizer::*)(const std::string&, bool) const;
  using Decode = std::string (Tokenizer::*)(const std::vector<int32_t>&, bool) const;
  using VocabSize = int64_t (Tokenizer::*)() const;
  using TokenId = int32_t (Tokenizer::*)() const;
  using Fingerprint = std::string (Tokenizer::*)() const;
  CHECK(slot(Encode(&Tokenizer::encode)) == 2);
  CHECK(slot(Decode(&Tokenizer::decode)) == 3);
  CHECK(slot(VocabSize(&Tokenizer::vocab_size)) == 4);
  CHECK(slot(TokenId(&Tokenizer::bos_id)) == 5);
  CHECK(slot(TokenId(&Tokenizer::eos_id)) == 6);
  CHECK(slot(TokenId(&Tokenizer::pad_id)) == 7);
  CHECK(slot(Fingerprint(&Tokenizer::fingerprint)) == 8);

  // The entry point's type, and the descriptor section's name, are part of the ABI too.
  static_assert(std::is_same_v<ax::PluginRegisterFn, void(ax::PluginRegistrar&)>);
  CHECK(std::string(AXENGINE_DESCRIPTOR_SECTION) == "axengine_plugin");
}

#pragma GCC diagnostic pop

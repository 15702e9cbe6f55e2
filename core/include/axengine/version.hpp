// axengine version and the plugin ABI version.
//
// The plugin ABI is what a plugin .so and the host must agree on: the layout of the descriptor, the
// registration entry point and every interface in core/include/axengine. The rule (docs/plugins.md,
// "The plugin ABI"):
//   MAJOR bumps on any change to a public struct's layout (a member added, removed, reordered or retyped),
//   to a virtual function of a public interface (added — also at the end —, removed, reordered, signature
//   changed), to the registration entry point or PluginRegistrar, or to the descriptor's layout or the
//   meaning of an existing descriptor key;
//   MINOR bumps on additions old plugins never see: new free functions or classes, new provider kinds or
//   ops, new optional descriptor keys.
// The loader accepts a plugin whose ABI major equals the host's and whose minor is not newer than the
// host's. tests/unit/plugin_abi_test.cpp records the layouts and vtable slots plugins depend on, so a
// silent change turns it red: bump the major and update it there.
#pragma once

#define AXENGINE_VERSION_STRING "0.1.0"
// 3.0: attention sinks (AttentionArgs::sinks, AttentionGrads::dsinks); DatasetContext::model_dir.
// 4.0: Attention::decline (a new virtual ahead of run_forward); the moe.mlp op and its MoeMlp interface;
//      the provider kind "executor" (axengine/executor.hpp, PluginRegistrar::executor).
// 5.0: Batch::input_ids_host and Batch::extras_host (host copies a device forward builds its tables from);
//      to_device_async; ModelLoadOptions::expert_parallel and the ExpertComm interface (expert_parallel.hpp).
// 6.0: Sample::materialise (a streamed sample's costly extras, made by the rank that trains it).
// 7.0: ModelCheck::ops holds OpCalls (op, weight format, layout) and ModelCheck::quantize is new (model_check.hpp).
// 8.0: AttentionArgs::groups (bidirectional groups: gemma3's image tokens).
// 9.0: WeightTensor::block_rows and WeightFormat::fp8 (block-scaled FP8 weights kept packed).
// 10.0: AttentionArgs::cu_seqlens_k and max_seqlen_k (key-side varlen boundaries: ring attention's blocks).
// 11.0: DatasetContext::image_processor; ChatImageSupport takes a processor kind (chat_image_processor(kind, ...),
//       chat_image_processors()) instead of a model_type; LoraSpec::vision_targets.
#define AXENGINE_PLUGIN_ABI_MAJOR 11
#define AXENGINE_PLUGIN_ABI_MINOR 0

namespace ax {
inline constexpr const char* kVersion = AXENGINE_VERSION_STRING;
inline constexpr int kPluginAbiMajor = AXENGINE_PLUGIN_ABI_MAJOR;
inline constexpr int kPluginAbiMinor = AXENGINE_PLUGIN_ABI_MINOR;
}  // namespace ax

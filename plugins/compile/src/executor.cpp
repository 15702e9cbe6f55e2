#include "executor.hpp"

#include <axengine/log.hpp>
#include <axengine/strings.hpp>

namespace ax::compile {

std::string graph_unsafe_backends(const Registry& registry, const std::vector<Resolution>& resolutions) {
  std::vector<std::string> unsafe;
  for (const Resolution& r : resolutions) {
    if (r.chosen.empty() || r.op == "quantize") continue;  // quantizers run at load, never in a step
    const Provider* p = registry.find(ProviderKind::kernel, r.op, r.chosen);
    if (!p || !p->info.graph_safe) unsafe.push_back(ax::str(r.op, "/", r.chosen));
  }
  if (unsafe.empty()) return "";
  return ax::str("the selected kernel backend", unsafe.size() > 1 ? "s " : " ", ax::join(unsafe, ", "),
                 unsafe.size() > 1 ? " are" : " is", " not declared graph_safe");
}

std::string shape_signature(const std::vector<Batch>& batches) {
  std::string s;
  auto add = [&](const char* name, const at::Tensor& t) {
    if (!t.defined()) return;
    s += ax::str(name, t.sizes(), c10::toString(t.scalar_type()), ";");
  };
  for (const Batch& b : batches) {
    add("ids", b.input_ids);
    add("labels", b.labels);
    add("pos", b.position_ids);
    add("cu", b.cu_seqlens);
    s += ax::str("max", b.max_seqlen, ";");  // a host value: launch geometry of varlen attention
    for (const auto& [name, t] : b.extras) add(name.c_str(), t);
    s += "|";
  }
  return s;
}

CompileExecutor::CompileExecutor(const ExecutorContext& context, Runtime runtime)
    : context_(context), runtime_(std::move(runtime)) {
  for (const auto& note : runtime_.notes) log::info("compile: " + note);
  const ExecutorSettings& s = runtime_.executor;
  if (!s.cuda_graphs) return;
  if (context_.packed && !s.static_shapes)
    log::warn(ax::str("compile: cuda_graphs with packed rows and static_shapes = false: cu_seqlens' length changes from "
                      "batch to batch, so steps replay only where a shape repeats (at most max_graphs = ", s.max_graphs,
                      " graphs); set static_shapes = true"));
  if (!context_.device.is_cuda()) {
    fall_back(ax::str("CUDA graphs need a CUDA device; this run is on ", context_.device.arch_name()));
    return;
  }
  std::string why;
  graphs_ = make_graph_runner(context_, s, why);
  if (!graphs_) fall_back(why);
}

std::string CompileExecutor::name() const {
  return runtime_.executor.cuda_graphs ? (graphs_ ? "compile (cuda graphs)" : "compile (cuda graphs declined: eager)")
                                       : "compile (eager)";
}

void CompileExecutor::fall_back(const std::string& why) {
  if (!fallback_.empty()) return;
  fallback_ = why;
  log::warn("compile: cuda_graphs: " + why + "; steps run eagerly");
}

at::Tensor CompileExecutor::step(StepProgram& program, const std::vector<Batch>& batches, double lr) {
  if (!graphs_) return program.run(batches, lr, at::Tensor());
  std::string why;
  at::Tensor stats = graphs_->step(program, batches, lr, why);
  if (!why.empty()) fall_back(why);
  return stats;
}

}  // namespace ax::compile

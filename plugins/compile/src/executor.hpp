// The compile plugin's step executor: applies [compile] for the run's device and, with cuda_graphs, runs the
// steps through a CUDA-graph runner (graph_runner.hpp); every reason it runs a step eagerly instead is
// logged once and kept in fallback_reason().
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <axengine/executor.hpp>

#include "setters.hpp"

namespace ax::compile {

// Runs steps in CUDA graphs: captured per shape signature after warm-up, replayed with the batches copied
// into the captured inputs. CUDA builds: graph_runner_cuda.cpp; elsewhere make_graph_runner says why not.
class GraphRunner {
 public:
  virtual ~GraphRunner() = default;
  // Runs the step. Sets `fallback` (once) when graphs are given up for the rest of the run.
  virtual at::Tensor step(StepProgram& program, const std::vector<Batch>& batches, double lr, std::string& fallback) = 0;
};
std::unique_ptr<GraphRunner> make_graph_runner(const ExecutorContext& context, const ExecutorSettings& settings,
                                               std::string& why_not);

// The kernel backends of `resolutions` not declared graph_safe, as one reason ("" when all are).
std::string graph_unsafe_backends(const Registry& registry, const std::vector<Resolution>& resolutions);

// The shape signature of a step: every tensor's sizes and dtype, and the host values baked into a capture.
std::string shape_signature(const std::vector<Batch>& batches);

class CompileExecutor final : public StepExecutor {
 public:
  CompileExecutor(const ExecutorContext& context, Runtime runtime);
  std::string name() const override;
  bool static_shapes() const override { return runtime_.executor.static_shapes; }
  at::Tensor step(StepProgram& program, const std::vector<Batch>& batches, double lr) override;
  std::string fallback_reason() const override { return fallback_; }

 private:
  void fall_back(const std::string& why);

  ExecutorContext context_;
  Runtime runtime_;
  std::unique_ptr<GraphRunner> graphs_;
  std::string fallback_;
};

}  // namespace ax::compile

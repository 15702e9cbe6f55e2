// The CUDA-graph runner (executor.hpp). Per shape signature: warmup_steps eager steps (lazy initialisation,
// tuning and allocator growth happen there), then one capture of the whole step on a side stream into a
// private memory pool, replayed for every later step of that signature with its batches copied into the
// captured inputs and its learning rate into a device scalar. A capture only records: the captured step is
// then replayed once to run it.
#include <map>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <axengine/log.hpp>
#include <axengine/strings.hpp>

#include "executor.hpp"

namespace ax::compile {

namespace {

std::string message_of(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

// `waiter` runs its later work after what `done` has queued so far.
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& done) {
  at::cuda::CUDAEvent ev;
  ev.record(done);
  ev.block(waiter);
}

void copy_into(Batch& dst, const Batch& src) {
  auto copy = [](at::Tensor& d, const at::Tensor& s) {
    if (d.defined()) d.copy_(s, /*non_blocking=*/true);
  };
  copy(dst.input_ids, src.input_ids);
  copy(dst.labels, src.labels);
  copy(dst.position_ids, src.position_ids);
  copy(dst.cu_seqlens, src.cu_seqlens);
  for (auto& [name, t] : dst.extras) copy(t, src.extras.at(name));
}

class CudaGraphRunner final : public GraphRunner {
 public:
  CudaGraphRunner(const ExecutorContext& ctx, const ExecutorSettings& s) : ctx_(ctx), s_(s) {
    device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(ctx.device.index));
    lr_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  }

  at::Tensor step(StepProgram& program, const std::vector<Batch>& batches, double lr, std::string& fallback) override {
    if (!given_up_.empty()) return eager(program, batches, lr);
    if (!program.device_lr()) return give_up(program, batches, lr, fallback,
                                            "the optimizer cannot take its learning rate from the device (AdamW does with "
                                            "its fused CUDA kernel: optimizer.implementation = \"auto\" or \"fused\")");
    const std::string key = shape_signature(batches);
    if (auto it = graphs_.find(key); it != graphs_.end()) {
      for (std::size_t j = 0; j < batches.size(); ++j) copy_into(it->second.inputs[j], batches[j]);
      lr_.fill_(lr);
      it->second.graph->replay();
      return it->second.stats;
    }
    if (++seen_[key] <= s_.warmup_steps) return eager(program, batches, lr);
    // The backends are all resolved by now (the warm-up ran the model).
    if (!checked_backends_) {
      checked_backends_ = true;
      std::string unsafe = ctx_.resolutions ? graph_unsafe_backends(*ctx_.registry, ctx_.resolutions()) : "";
      if (!unsafe.empty()) return give_up(program, batches, lr, fallback, unsafe);
    }
    if (static_cast<int64_t>(graphs_.size()) >= s_.max_graphs) {
      if (!said_cap_) {
        said_cap_ = true;
        log::warn(ax::str("compile: more than max_graphs = ", s_.max_graphs,
                          " step shapes; steps of new shapes run eagerly (static_shapes = true gives one shape)"));
      }
      return eager(program, batches, lr);
    }
    return capture(program, batches, lr, key, fallback);
  }

 private:
  struct Graph {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    std::vector<Batch> inputs;
    at::Tensor stats;
  };

  // Eager steps read the rate from the device too: the optimizer's step count lives there from the first one.
  at::Tensor eager(StepProgram& program, const std::vector<Batch>& batches, double lr) {
    lr_.fill_(lr);
    return program.run(batches, lr, program.device_lr() ? lr_ : at::Tensor());
  }

  at::Tensor give_up(StepProgram& program, const std::vector<Batch>& batches, double lr, std::string& fallback,
                     const std::string& why) {
    program.abandon();  // a failed capture may have left gradients that were never computed
    given_up_ = why;
    fallback = why;
    return eager(program, batches, lr);
  }

  at::Tensor capture(StepProgram& program, const std::vector<Batch>& batches, double lr, const std::string& key,
                     std::string& fallback) {
    c10::cuda::CUDAGuard guard(device_);
    Graph g;
    for (const Batch& b : batches) g.inputs.push_back(b.to(device_));  // the static inputs, host facts kept
    lr_.fill_(lr);
    g.graph = std::make_unique<at::cuda::CUDAGraph>();
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device_.index());
    wait_for(side, c10::cuda::getCurrentCUDAStream(device_.index()));  // the inputs' copies first
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      g.graph->capture_begin();
      try {
        g.stats = program.run(g.inputs, lr, lr_);
      } catch (const std::exception& e) {
        const std::string why = message_of(e);
        try {
          g.graph->capture_end();
        } catch (...) {  // invalidated already: the reason above is what matters
        }
        return give_up(program, batches, lr, fallback,
                       ax::str("the step cannot be captured (a host sync or a call not allowed in a capture): ",
                               why.substr(0, 300)));
      }
      try {
        g.graph->capture_end();
      } catch (const std::exception& e) {
        return give_up(program, batches, lr, fallback,
                       ax::str("the capture was invalidated (a host sync in the step): ", message_of(e).substr(0, 300)));
      }
    }
    wait_for(c10::cuda::getCurrentCUDAStream(device_.index()), side);
    log::info(ax::str("compile: captured the training step in CUDA graph ", graphs_.size() + 1, " (shape ",
                      batches.empty() ? std::string() : ax::str(batches[0].input_ids.sizes()), ")"));
    Graph& kept = graphs_[key] = std::move(g);
    kept.graph->replay();  // the capture only recorded this step: now run it
    return kept.stats;
  }

  ExecutorContext ctx_;
  ExecutorSettings s_;
  at::Device device_{at::kCUDA};
  at::Tensor lr_;  // float32 scalar on the device: the learning rate every captured step reads
  std::map<std::string, Graph> graphs_;
  std::map<std::string, int64_t> seen_;
  bool checked_backends_ = false, said_cap_ = false;
  std::string given_up_;
};

}  // namespace

std::unique_ptr<GraphRunner> make_graph_runner(const ExecutorContext& ctx, const ExecutorSettings& s, std::string& why_not) {
  if (!ctx.device.is_cuda()) {
    why_not = ax::str("CUDA graphs need a CUDA device; this run is on ", ctx.device.arch_name());
    return nullptr;
  }
  return std::make_unique<CudaGraphRunner>(ctx, s);
}

}  // namespace ax::compile

// AdamW (Loshchilov & Hutter), as torch.optim.AdamW computes it:
//   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
// On CUDA the fused ATen kernel (_fused_adamw_) does all of it in one launch per dtype group; on CPU the
// same arithmetic runs as plain in-place ATen ops, in a fixed order, so a run (and its resume) is
// bitwise reproducible.
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/error.hpp"
#include "axengine/optimizer.hpp"
#include "axengine/strings.hpp"
#include "train/optimizers.hpp"

namespace ax::train {

void bind_adamw_options(TableBinder& t, AdamWOptions& o) {
  t.field("beta1", o.beta1, "AdamW first-moment decay");
  t.field("beta2", o.beta2, "AdamW second-moment decay");
  t.positive("eps", o.eps, "AdamW denominator epsilon");
  t.choice("implementation", o.implementation, {"auto", "fused", "reference"},
           "auto = the fused ATen kernel on CUDA, the reference (bitwise-deterministic) one on CPU");
  auto in01 = [&](const char* k, double v) {
    if (!(v >= 0 && v < 1)) t.fail(t.table() ? t.table()->get(k) : nullptr, ax::str("'optimizer.", k, "' must be in [0, 1)"));
  };
  in01("beta1", o.beta1);
  in01("beta2", o.beta2);
}

namespace {

class AdamW final : public Optimizer, public DeviceLrOptimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions o) : groups_(std::move(groups)), o_(o) {
    for (const auto& g : groups_)
      for (const auto& p : g.params) {
        if (!p.defined() || !p.requires_grad()) throw RuntimeError("adamw: a parameter does not require grad");
        exp_avg_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
        exp_avg_sq_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (o_.implementation == "fused" && !p.is_cuda())
          throw UsageError("optimizer.implementation = \"fused\" needs the parameters on CUDA");
      }
  }

  void step(double lr) override { step(lr, at::Tensor()); }

  // Skipped when found_inf is 1: parameters, moments and the step count stay as they were (torch's fused AdamW
  // under GradScaler takes the count back, its other paths are not called). Decided where the parameters live:
  // inside the fused CUDA kernel, which returns early on found_inf, with the count then kept on the device
  // (advanced, and taken back by found_inf, by kernels: no sync); otherwise on the host, by reading the flag
  // (on the CPU no device to wait for; the reference path on CUDA syncs, its bias corrections are host values).
  void step(double lr, const at::Tensor& found_inf) override {
    at::NoGradGuard no_grad;
    bool all_fused = true;
    for (const auto& g : groups_)
      for (const auto& p : g.params)
        all_fused = all_fused && uses_fused(p);
    const bool device_skip = found_inf.defined() && !found_inf.is_cpu() && all_fused;
    if (found_inf.defined() && !device_skip && found_inf.item<double>() != 0) return;
    if (device_skip && !step_device_.defined())
      step_device_ = at::full({}, static_cast<double>(step_), found_inf.options().dtype(at::kFloat));
    ++step_;
    if (step_device_.defined()) step_device_.add_(1);  // after device steps the fused kernel reads this count
    std::size_t k = 0;
    for (const auto& g : groups_) {
      std::vector<std::size_t> idx;
      for (std::size_t i = 0; i < g.params.size(); ++i, ++k)
        if (g.params[i].grad().defined()) idx.push_back(k);
      if (idx.empty()) continue;
      if (uses_fused(g.params[0])) fused_step(g, idx, k - g.params.size(), lr, device_skip ? found_inf : at::Tensor());
      else reference_step(g, k - g.params.size(), lr);
    }
    if (device_skip) step_device_.sub_(found_inf.to(step_device_.options()));
  }

  bool device_lr_supported() const override {
    if (o_.implementation == "reference") return false;
    for (const auto& g : groups_)
      for (const auto& p : g.params)
        if (!p.is_cuda()) return false;
    return true;
  }

  // The fused step with the rate and the count on the device: the count is a device scalar advanced by a
  // kernel (made from the host count at the first such step), so a replayed graph advances it too.
  void step_device_lr(const at::Tensor& lr, const at::Tensor& found_inf) override {
    if (!device_lr_supported()) throw RuntimeError("adamw: a device learning rate needs the fused CUDA kernel");
    at::NoGradGuard no_grad;
    if (!step_device_.defined())
      step_device_ = at::full({}, static_cast<double>(step_), lr.options().dtype(at::kFloat));
    step_device_.add_(1);
    std::size_t k = 0;
    for (const auto& g : groups_) {
      std::vector<std::size_t> idx;
      for (std::size_t i = 0; i < g.params.size(); ++i, ++k)
        if (g.params[i].grad().defined()) idx.push_back(k);
      if (!idx.empty()) fused_step(g, idx, k - g.params.size(), lr, found_inf);
    }
    if (found_inf.defined()) step_device_.sub_(found_inf.to(step_device_.options()));  // a skipped step is not counted
  }

  void zero_grad() override {
    for (auto& g : groups_)
      for (auto& p : g.params)
        if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }

  std::map<std::string, at::Tensor> state_dict() const override {
    std::map<std::string, at::Tensor> s;
    // After device steps the count is on the device (read back: a sync, as a checkpoint is anyway).
    const int64_t step = step_device_.defined() ? static_cast<int64_t>(step_device_.item<double>()) : step_;
    s["step"] = at::tensor({step}, at::kLong);
    std::size_t k = 0;
    for (std::size_t gi = 0; gi < groups_.size(); ++gi)
      for (std::size_t pi = 0; pi < groups_[gi].params.size(); ++pi, ++k) {
        s[ax::str("g", gi, ".p", pi, ".exp_avg")] = exp_avg_[k];
        s[ax::str("g", gi, ".p", pi, ".exp_avg_sq")] = exp_avg_sq_[k];
      }
    return s;
  }

  void load_state_dict(const std::map<std::string, at::Tensor>& s) override {
    auto get = [&](const std::string& key, const at::Tensor& like) {
      auto it = s.find(key);
      if (it == s.end()) throw UsageError(ax::str("optimizer state: '", key, "' is missing"));
      if (like.defined() && !it->second.sizes().equals(like.sizes()))
        throw UsageError(ax::str("optimizer state: '", key, "' has shape ", it->second.sizes(), ", the parameter ", like.sizes()));
      return it->second;
    };
    step_ = get("step", at::Tensor()).item<int64_t>();
    if (step_device_.defined()) step_device_.fill_(static_cast<double>(step_));
    std::size_t k = 0;
    for (std::size_t gi = 0; gi < groups_.size(); ++gi)
      for (std::size_t pi = 0; pi < groups_[gi].params.size(); ++pi, ++k) {
        exp_avg_[k].copy_(get(ax::str("g", gi, ".p", pi, ".exp_avg"), exp_avg_[k]));
        exp_avg_sq_[k].copy_(get(ax::str("g", gi, ".p", pi, ".exp_avg_sq"), exp_avg_sq_[k]));
      }
  }

 private:
  void reference_step(const ParamGroup& g, std::size_t first, double lr) {
    const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(step_));
    const double bc2_sqrt = std::sqrt(1.0 - std::pow(o_.beta2, static_cast<double>(step_)));
    for (std::size_t i = 0; i < g.params.size(); ++i) {
      at::Tensor p = g.params[i];
      at::Tensor grad = p.grad();
      if (!grad.defined()) continue;
      at::Tensor& m = exp_avg_[first + i];
      at::Tensor& v = exp_avg_sq_[first + i];
      if (g.weight_decay != 0) p.mul_(1.0 - lr * g.weight_decay);
      m.lerp_(grad, 1.0 - o_.beta1);
      v.mul_(o_.beta2).addcmul_(grad, grad, 1.0 - o_.beta2);
      at::Tensor denom = (v.sqrt() / bc2_sqrt).add_(o_.eps);
      p.addcdiv_(m, denom, -lr / bc1);
    }
  }

  // The fused kernel wants lists of one dtype and device, and a float step tensor per parameter. It only
  // reads the step (torch.optim increments it before the call): pass the count including this step, or
  // the bias corrections 1 - beta^0 are zero and the update is NaN.
  // `lr` is a double, or a device scalar (step_device_lr: the count is then step_device_, not step_).
  template <class Lr>
  void fused_step(const ParamGroup& g, const std::vector<std::size_t>& idx, std::size_t first, const Lr& lr,
                  const at::Tensor& found_inf) {
    std::map<std::pair<int, int>, std::vector<std::size_t>> by_kind;  // (dtype, device) -> indices
    for (std::size_t k : idx) {
      const auto& p = g.params[k - first];
      by_kind[{static_cast<int>(p.scalar_type()), p.device().index()}].push_back(k);
    }
    for (const auto& [kind, ks] : by_kind) {
      std::vector<at::Tensor> ps, gs, ms, vs, steps;
      // The kernel only reads the steps, so every parameter of the group shares one tensor: one fill
      // kernel a step instead of one per parameter (~500 on a 36-layer LoRA model).
      const at::Tensor step = step_device_.defined() ? step_device_
                                                     : at::full({}, static_cast<double>(step_), g.params[ks.front() - first].options().dtype(at::kFloat));
      for (std::size_t k : ks) {
        const auto& p = g.params[k - first];
        ps.push_back(p);
        gs.push_back(p.grad());
        ms.push_back(exp_avg_[k]);
        vs.push_back(exp_avg_sq_[k]);
        steps.push_back(step);
      }
      // found_inf must be a float on the parameters' device; the kernel leaves everything as is when it is 1.
      std::optional<at::Tensor> inf;
      if (found_inf.defined()) inf = found_inf.to(ps[0].device(), at::kFloat).reshape({});
      at::_fused_adamw_(ps, gs, ms, vs, {}, steps, lr, o_.beta1, o_.beta2, g.weight_decay, o_.eps,
                        /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, inf);
    }
  }

  bool uses_fused(const at::Tensor& p) const { return o_.implementation == "fused" || (o_.implementation == "auto" && p.is_cuda()); }

  std::vector<ParamGroup> groups_;
  AdamWOptions o_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
  at::Tensor step_device_;  // the count on the device, from the first step_device_lr on
};

class AdamWProvider final : public OptimizerProvider {
 public:
  std::unique_ptr<Optimizer> create(std::vector<ParamGroup> groups, const toml::table& options) const override {
    AdamWOptions o;
    TableBinder t(&options, "optimizer", BindContext{});
    bind_adamw_options(t, o);
    t.finish();
    return std::make_unique<AdamW>(std::move(groups), o);
  }
};

}  // namespace

void register_builtin_optimizers(Registry& registry) {
  Provider p;
  p.info.kind = ProviderKind::optimizer;
  p.info.name = "adamw";
  p.info.summary = "AdamW; fused ATen kernel on CUDA, bitwise-deterministic reference on CPU";
  p.object = std::make_shared<AdamWProvider>();
  registry.add(std::move(p));
}

}  // namespace ax::train

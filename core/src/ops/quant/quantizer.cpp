// The helpers of quantizer.hpp and core's reference quantizer (ops::quantize_* of quant.hpp).
#include "axengine/ops/quantizer.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <set>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/strings.hpp"

namespace ax::ops {

std::string quantize_misfit(const std::vector<int64_t>& shape, const QuantizeSpec& spec) {
  if (shape.empty()) return "a scalar has no blocks";
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  switch (spec.format) {
    case WeightFormat::dense: return "";
    case WeightFormat::nf4:
      if (numel % spec.blocksize != 0) return str(numel, " elements are not a multiple of blocksize ", spec.blocksize);
      return "";
    case WeightFormat::mxfp4:
    case WeightFormat::nvfp4: {
      const int64_t block = spec.format == WeightFormat::mxfp4 ? 32 : 16;
      const int64_t n = static_cast<int64_t>(shape.size());
      const int64_t axis = spec.axis < 0 ? spec.axis + n : spec.axis;
      if (axis < 0 || axis >= n) return str("axis ", spec.axis, " is outside a ", n, "-dim tensor");
      if (shape[static_cast<size_t>(axis)] % block != 0)
        return str("dim ", axis, " (", shape[static_cast<size_t>(axis)], ") is not a multiple of ", block);
      return "";
    }
  }
  return "unknown format";
}

int64_t weight_bytes(const WeightTensor& w) {
  int64_t total = 0;
  std::set<const void*> seen;  // fields may share a storage
  for (const at::Tensor* t : {&w.values, &w.codes, &w.scales, &w.nested_scales, &w.nested_code, &w.global_scale}) {
    if (!t->defined()) continue;
    const auto& st = t->storage();
    if (seen.insert(st.data()).second) total += static_cast<int64_t>(st.nbytes());
  }
  return total;
}

namespace {

class ReferenceQuantizer final : public Quantizer {
 public:
  WeightTensor quantize(const at::Tensor& w, const QuantizeSpec& s) override {
    if (std::string why = quantize_misfit(w.sizes().vec(), s); !why.empty())
      throw UsageError(str("quantize ", to_string(s.format), ": ", why));
    switch (s.format) {
      case WeightFormat::nf4: {
        WeightTensor q = quantize_nf4(w, s.blocksize, s.double_quant);
        if (q.nested_code.defined()) q.nested_code = shared_code(q.nested_code);
        return q;
      }
      case WeightFormat::mxfp4: return quantize_mxfp4(w, s.axis);
      case WeightFormat::nvfp4: return quantize_nvfp4(w, s.axis, s.per_expert_scale);
      case WeightFormat::dense: break;
    }
    throw UsageError("quantize: the dense format packs nothing");
  }

 private:
  // The double-quant code (bitsandbytes' 256-entry dynamic map) is the same for every weight: one copy per
  // device instead of 1 KiB per weight.
  at::Tensor shared_code(const at::Tensor& code) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = codes_.emplace(code.device().str(), code);
    return it->second;
  }
  std::mutex mu_;
  std::map<std::string, at::Tensor> codes_;
};

}  // namespace

std::shared_ptr<Quantizer> make_reference_quantizer() { return std::make_shared<ReferenceQuantizer>(); }

}  // namespace ax::ops

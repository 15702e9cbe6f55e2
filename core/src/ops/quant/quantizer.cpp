// Core's reference quantizer (ops::quantize_* of quant.hpp), a built-in provider. The helpers quantizer.hpp
// declares (quantize_misfit, weight_bytes) are in quant.cpp, in core, where a plugin quantizer finds them.
#include "axengine/ops/quantizer.hpp"

#include <map>
#include <memory>
#include <mutex>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/strings.hpp"

namespace ax::ops {

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
      case WeightFormat::dense:
      case WeightFormat::fp8: break;  // quantize_misfit refused it above
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

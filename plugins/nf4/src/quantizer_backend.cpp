// The nf4 quantizer provider (ops::Quantizer, docs/weights.md "Quantizers are providers"): packs a CUDA
// tensor with nf4::quantize, bit-exact with the reference quantizer on the same device.
#include <axengine/error.hpp>
#include <axengine/strings.hpp>

#include "backends.hpp"
#include "nf4.hpp"

namespace ax::nf4 {
namespace {

class Nf4Quantizer final : public ops::Quantizer {
 public:
  ops::WeightTensor quantize(const at::Tensor& w, const ops::QuantizeSpec& spec) override {
    if (spec.format != ops::WeightFormat::nf4)
      throw UsageError(str("quantizer[nf4]: format: only nf4 is produced, got ", ops::to_string(spec.format)));
    return nf4::quantize(w, spec.blocksize, spec.double_quant);
  }
};

}  // namespace

std::shared_ptr<ops::Quantizer> make_quantizer() { return std::make_shared<Nf4Quantizer>(); }

}  // namespace ax::nf4

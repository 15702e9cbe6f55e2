#include "models/layer_bytes.hpp"

#include <iomanip>
#include <sstream>

#include "axengine/error.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/weight_policy.hpp"

namespace ax::models {

double MoeLayerBytes::bytes(const std::string& format) const {
  double per = 2.0;  // bf16
  if (format == "nf4") per = 0.5 + 4.0 / 64;
  else if (format == "mxfp4") per = 0.5 + 1.0 / 32;
  else if (format == "fp8") per = 1.0 + 4.0 / double(fp8_block);
  else if (format != "bf16") throw RuntimeError("moe_layer_bytes: unknown format " + format);
  const int64_t other_fp8 = format == "fp8" ? other_projection_params : 0;
  return double(expert_params) * per + double(other_fp8) * per + double(other_params - other_fp8) * 2.0;
}

MoeLayerBytes moe_layer_bytes(const HfConfig& c) {
  MoeLayerBytes out;
  for (int64_t i = 0; i < c.num_layers && out.layer < 0; ++i)
    if (c.is_moe_layer(i)) out.layer = i;
  if (out.layer < 0) return out;
  if (c.fp8.present) out.fp8_block = c.fp8.block_rows * c.fp8.block_cols;
  const std::string p = "model.layers." + std::to_string(out.layer) + ".";
  for (const auto& [name, shape] : expected_checkpoint_tensors(c)) {
    if (name.compare(0, p.size(), p) != 0) continue;
    int64_t n = 1;
    for (auto d : shape) n *= d;
    // Expert projections: mlp.experts.* (fused or per expert) and the shared experts' (not their sigmoid gate).
    const bool expert = name.find(".mlp.experts.") != std::string::npos ||
                        (name.find(".mlp.shared_expert") != std::string::npos && name.find("proj") != std::string::npos);
    (expert ? out.expert_params : out.other_params) += n;
    if (!expert && is_projection(name)) out.other_projection_params += n;
  }
  return out;
}

std::string moe_layer_bytes_line(const HfConfig& c) {
  const MoeLayerBytes b = moe_layer_bytes(c);
  if (b.layer < 0) return "";
  std::ostringstream os;
  os << std::setprecision(4);
  auto gb = [&](const std::string& f) { return b.bytes(f) / 1e9; };
  os << "MoE layer " << b.layer << "    " << b.expert_params + b.other_params << " params (experts " << b.expert_params
     << ", other " << b.other_params << "): bf16 " << b.bytes_per_param("bf16") << " B/param (" << gb("bf16")
     << " GB); nf4 experts " << b.bytes_per_param("nf4") << " B/param (" << gb("nf4") << " GB); mxfp4 experts "
     << b.bytes_per_param("mxfp4") << " B/param (" << gb("mxfp4") << " GB); fp8 projections " << b.bytes_per_param("fp8")
     << " B/param (" << gb("fp8") << " GB)\n";
  return os.str();
}

}  // namespace ax::models

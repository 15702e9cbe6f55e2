// Multi-head latent attention (models/parts/mla.hpp) against transformers' DeepseekV3Attention:
// scripts/goldens/make_mla_goldens.py (eager, fp32, two packed sequences; forward and every gradient).
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "axengine/builtins.hpp"
#include "axengine/registry.hpp"
#include "models/parts/mla.hpp"
#include "unit/ops_test_util.hpp"

using namespace ax;
using namespace ax::models;

namespace {

std::shared_ptr<ops::Attention> reference_attention() {
  static Registry reg = [] {
    Registry r;
    register_builtins(r);
    return r;
  }();
  return reg.kernel<ops::Attention>("reference");
}

}  // namespace

TEST_CASE("mla: packed rows equal transformers' DeepseekV3Attention, forward and gradients (q LoRA + interleaved "
          "RoPE; q_proj + YaRN)") {
  auto g = test::load_safetensors(test::data_path("models/mla.safetensors"));
  for (std::string c : {"lora_interleave", "qproj_yarn"}) {
    CAPTURE(c);
    const bool q_lora = c == "lora_interleave";
    MlaOptions o;
    o.num_heads = 4;
    o.q_lora_rank = q_lora ? 24 : 0;
    o.kv_lora_rank = 16;
    o.qk_nope_head_dim = 8;
    o.qk_rope_head_dim = 4;
    o.v_head_dim = 6;
    o.rope_interleave = q_lora;
    o.rope_attention_factor = g[c + ".scalars"][0].item<double>();
    // The softmax scale from the rope settings the goldens were made with (yarn factor 4, mscale_all_dim 1).
    o.softmax_scale = q_lora ? mla_softmax_scale(12, true, 1.0, 0.0) : mla_softmax_scale(12, false, 4.0, 1.0);
    CHECK(o.softmax_scale == doctest::Approx(g[c + ".scalars"][1].item<double>()).epsilon(1e-12));

    std::map<std::string, at::Tensor> w;
    std::vector<std::string> names;
    for (auto& [k, t] : g)
      if (k.rfind(c + ".", 0) == 0 && k.size() > 7 && k.compare(k.size() - 7, 7, ".weight") == 0 &&
          k.rfind(c + ".d.", 0) != 0) {
        const std::string name = k.substr(c.size() + 1);
        w[name] = t.clone().requires_grad_(true);
        names.push_back(name);
      }
    CHECK(names.size() == (q_lora ? 7u : 5u));
    MlaModules m;
    m.linear = [&](const at::Tensor& x, const std::string& mod) { return at::linear(x, w.at(mod + ".weight")); };
    m.norm = [&](const at::Tensor& x, const std::string& n, double eps) {  // transformers' RMSNorm
      at::Tensor f = x.to(at::kFloat);
      return w.at(n + ".weight") * (f * at::rsqrt(f.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
    };
    at::Tensor x = g[c + ".x"].clone().requires_grad_(true);
    at::Tensor pos = at::cat({at::arange(5), at::arange(3)}).to(at::kFloat);
    at::Tensor freqs = pos.unsqueeze(1) * g[c + ".inv_freq"].unsqueeze(0);
    at::Tensor cu = at::tensor({0, 5, 8}, at::kInt);
    at::Tensor y = mla_attention(o, m, x, freqs, cu, 5, reference_attention());
    CHECK(test::rel_err(y, g[c + ".out"]) < 1e-5);

    std::vector<at::Tensor> inputs{x};
    for (const auto& n : names) inputs.push_back(w[n]);
    auto grads = torch::autograd::grad({y}, inputs, {g[c + ".grad_out"]});
    CHECK(test::rel_err(grads[0], g[c + ".dx"]) < 1e-5);
    for (std::size_t i = 0; i < names.size(); ++i) {
      CAPTURE(names[i]);
      CHECK(test::rel_err(grads[i + 1], g[c + ".d." + names[i]]) < 1e-5);
    }
  }
}

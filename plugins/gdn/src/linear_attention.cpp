// The host side of the gdn linear_attention backend: core's shared chunked gated delta rule
// (axengine/ops/linear_attention_chunked.hpp: the chunk-parallel math as batched cuBLAS GEMMs) with the two
// sequential scans as the plugin's kernels (kernels/chunk_math.cuh), one launch per direction instead of a
// few launches per chunk. No host sync (every grid size comes from shapes): graph-safe. Deterministic:
// fixed-order loops, no atomics.
#include "linear_attention.hpp"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <axengine/ops/linear_attention_chunked.hpp>
#include <axengine/strings.hpp>

namespace ax::gdn {
namespace {

const float* ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }
float* mut(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// The shape part of Params, from the layout and a state tensor [.., H, Dk, Dv].
Params shape_of(const ops::ChunkLayout& l, const at::Tensor& state) {
  Params p;
  p.NC = l.NC;
  p.N = l.chunk_begin.size(0) - 1;
  p.H = static_cast<int>(state.size(1));
  p.Dk = static_cast<int>(state.size(2));
  p.Dv = static_cast<int>(state.size(3));
  p.chunk_begin = l.chunk_begin.data_ptr<int64_t>();
  return p;
}

int cuda_index(const at::Tensor& t) { return t.is_cuda() ? t.device().index() : -1; }

// Two operand buffers where the scan's block fits them on the device, else one (chunk_math.cuh).
bool overlap_fits(const Kernels& k, int Dk, bool backward, int device) {
  return scan_smem_bytes(Dk, backward, /*overlap=*/true) <= k.smem_limit(device);
}

void* stream_of(const at::Tensor& t) {
  if (!t.is_cuda()) return nullptr;  // the host kernels (tests)
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

class GdnLinearAttention final : public ops::ChunkedLinearAttention {
 public:
  explicit GdnLinearAttention(const Kernels& k) : k_(k) {}

  std::optional<std::string> decline(const ops::LinearAttentionArgs& a) const override {
    const int64_t Dk = a.q.size(2);
    if (Dk > kMaxKeyDim) return str("key head dim ", Dk, " > ", kMaxKeyDim, " (the scan's shared memory)");
    const int64_t need = scan_smem_bytes(static_cast<int>(Dk), /*backward=*/true, /*overlap=*/false);
    const int64_t limit = k_.smem_limit(cuda_index(a.q));
    if (need > limit)
      return str("key head dim ", Dk, ": the scan needs ", need, " bytes of shared memory a block, the device allows ", limit);
    if (a.q.scalar_type() == at::kDouble) return std::string("fp64 (the kernels compute in fp32)");
    return std::nullopt;
  }

 protected:
  void scan_forward(ops::GdrScanForward& s) override {
    Params p = shape_of(*s.layout, s.S_in);
    p.W = ptr(s.W), p.Kd = ptr(s.Kd), p.gamma = ptr(s.gamma), p.U = ptr(s.U), p.S0 = ptr(s.S0);
    p.S_in = mut(s.S_in), p.Vn = mut(s.Vn);
    p.overlap = overlap_fits(k_, p.Dk, false, cuda_index(s.U));
    k_.scan_forward(p, stream_of(s.U));
  }

  void scan_backward(ops::GdrScanBackward& b) override {
    Params p = shape_of(*b.layout, b.dS_out);
    p.W = ptr(b.W), p.Kd = ptr(b.Kd), p.gamma = ptr(b.gamma);
    p.dVn_local = ptr(b.dVn_local), p.dS_local = ptr(b.dS_local), p.GF = ptr(b.GF);
    p.dS_out = mut(b.dS_out), p.dS_in = mut(b.dS_in), p.dVn = mut(b.dVn);
    p.overlap = overlap_fits(k_, p.Dk, true, cuda_index(b.W));
    k_.scan_backward(p, stream_of(b.W));
  }

 private:
  const Kernels k_;  // a copy: tests pass tables they build
};

}  // namespace

std::shared_ptr<ops::LinearAttention> make_linear_attention(const Kernels& kernels) {
  return std::make_shared<GdnLinearAttention>(kernels);
}

}  // namespace ax::gdn

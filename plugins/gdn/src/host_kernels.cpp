// The gdn kernels on the host: every thread block of kernels/linear_attention.cu in turn, each as one thread
// (kernels/chunk_math.cuh's bodies compiled by the host compiler). Slow, and blind to races between threads
// of a block, but the same math and indexing: the plugin's tests check it against the reference on any machine.
#include <vector>

#include "../kernels/kernels.hpp"

namespace ax::gdn {
namespace {

struct HostBlock {
  int tid() const { return 0; }
  int n() const { return 1; }
  void sync() const {}
};

void ut(const Params& p, void*) {
  std::vector<float> smem(static_cast<size_t>(ut_transform_smem(p)));
  for (int64_t c = 0; c < p.NC; ++c)
    for (int h = 0; h < p.H; ++h) ut_transform(HostBlock{}, p, c, h, smem.data());
}

void scan_fwd(const Params& p, void*) {
  std::vector<float> smem(static_cast<size_t>(scan_smem(p)));
  for (int64_t b = 0; b < p.N; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int t = 0; t < col_tiles(p); ++t) scan_forward(HostBlock{}, p, b, h, t, smem.data());
}

void out_fwd(const Params& p, void*) {
  for (int64_t c = 0; c < p.NC; ++c)
    for (int h = 0; h < p.H; ++h) output_forward(HostBlock{}, p, c, h);
}

void scan_bwd(const Params& p, void*) {
  std::vector<float> smem(static_cast<size_t>(scan_smem(p)));
  for (int64_t b = 0; b < p.N; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int t = 0; t < col_tiles(p); ++t) scan_backward(HostBlock{}, p, b, h, t, smem.data());
}

void chunk_bwd(const Params& p, void*) {
  std::vector<float> smem(static_cast<size_t>(chunk_backward_smem(p)));
  for (int64_t c = 0; c < p.NC; ++c)
    for (int h = 0; h < p.H; ++h) chunk_backward(HostBlock{}, p, c, h, smem.data());
}

}  // namespace

const Kernels& host_kernels() {
  static const Kernels k{"host", ut, scan_fwd, out_fwd, scan_bwd, chunk_bwd};
  return k;
}

}  // namespace ax::gdn

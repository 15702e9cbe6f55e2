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

template <class Body>
void every_block(const Params& p, Body body) {
  std::vector<float> smem(static_cast<size_t>(scan_smem(p)));
  for (int64_t b = 0; b < p.N; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int t = 0; t < col_tiles(p); ++t) body(b, h, t, smem.data());
}

void scan_fwd(const Params& p, void*) {
  every_block(p, [&](int64_t b, int h, int t, float* smem) { scan_forward(HostBlock{}, p, b, h, t, smem); });
}

void scan_bwd(const Params& p, void*) {
  every_block(p, [&](int64_t b, int h, int t, float* smem) { scan_backward(HostBlock{}, p, b, h, t, smem); });
}

}  // namespace

const Kernels& host_kernels() {
  static const Kernels k{"host", scan_fwd, scan_bwd};
  return k;
}

}  // namespace ax::gdn

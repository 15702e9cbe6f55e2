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
void every_block(const Params& p, bool backward, Body body) {
  std::vector<float> smem(static_cast<size_t>(scan_layout(p.Dk, backward, p.overlap).floats));
  for (int64_t b = 0; b < p.N; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int t = 0; t < col_tiles(p); ++t) body(b, h, t, smem.data());
}

void scan_fwd(const Params& p, void*) {
  every_block(p, false, [&](int64_t b, int h, int t, float* smem) { scan_forward(HostBlock{}, p, b, h, t, smem); });
}

void scan_bwd(const Params& p, void*) {
  every_block(p, true, [&](int64_t b, int h, int t, float* smem) { scan_backward(HostBlock{}, p, b, h, t, smem); });
}

// The host runs the staging an H100 runs (sm_90's 227 KiB a block); tests swap in smaller limits.
int64_t smem_limit(int) { return 227 * 1024; }

}  // namespace

const Kernels& host_kernels() {
  static const Kernels k{"host", scan_fwd, scan_bwd, smem_limit};
  return k;
}

}  // namespace ax::gdn

// A host emulation of the kernels' contract (../kernels/gather_gemm.hpp), row by row in fp32, for the CPU
// test of the block's ATen orchestration (sonicmoe_emulation_test.cpp): written from the header's
// semantics, not from the kernel, so the test checks the glue's conventions (weight orientations, LoRA
// operands, padding, GLU pairing, dGLU, the rowsum) against the reference backend. Rows outside every
// expert's segment are left unwritten, as the kernels leave them.
#include <c10/util/BFloat16.h>

#include <cmath>
#include <vector>

#include "../kernels/combine.hpp"
#include "../kernels/gather_gemm.hpp"

namespace ax::sonicmoe {
namespace {

float load(const void* p, int64_t i) { return static_cast<float>(static_cast<const c10::BFloat16*>(p)[i]); }
void store(void* p, int64_t i, float v) { static_cast<c10::BFloat16*>(p)[i] = c10::BFloat16(v); }
float rounded(float v) { return static_cast<float>(c10::BFloat16(v)); }
float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

// h, dg, dv of the GLU at (g, v) for dh.
void glu(const GatherGemmArgs& a, float g, float v, float dh, float& h, float& dg, float& dv) {
  if (!a.clamped) {
    const float s = sigmoid(g);
    h = g * s * v;
    dg = dh * v * s * (1.f + g * (1.f - s));
    dv = dh * g * s;
    return;
  }
  const float gc = std::fmin(g, a.limit), vc = std::fmin(std::fmax(v, -a.limit), a.limit);
  const float s = sigmoid(a.alpha * gc);
  h = (vc + 1.f) * gc * s;
  dg = g <= a.limit ? dh * (vc + 1.f) * (s + gc * a.alpha * s * (1.f - s)) : 0.f;
  dv = (v >= -a.limit && v <= a.limit) ? dh * gc * s : 0.f;
}

}  // namespace

int gather_gemm_col_tiles(const GatherGemmArgs& a) {
  if (a.epi == Epi::glu && !a.interleaved) return (a.N / 2 + 127) / 128;
  return (a.N + 255) / 256;
}

const char* gather_gemm_unavailable(int) { return nullptr; }

const char* launch_gather_gemm(const GatherGemmArgs& a, cudaStream_t) {
  // The kernels' preconditions, so the glue is exercised under them.
  if (a.K <= 0 || a.K % 64 != 0) return "K must be a positive multiple of 64";
  if (a.N <= 0 || a.N % 8 != 0) return "N must be a positive multiple of 8";
  if (a.r < 0 || a.r > 64 || a.r % 8 != 0) return "the LoRA rank must be padded to a multiple of 8, at most 64";
  if (a.lda % 8 != 0 || a.ldw % 8 != 0 || a.ldo % 8 != 0 || (a.r > 0 && a.ldw2 % 8 != 0)) return "unaligned rows";
  const int64_t N = a.N, K = a.K, r = a.r;
  const int64_t I = a.epi == Epi::dglu ? N : N / 2;
  auto gate_col = [&](int64_t j) { return a.interleaved ? 2 * j : j; };
  auto up_col = [&](int64_t j) { return a.interleaved ? 2 * j + 1 : I + j; };
  std::vector<float> c(N);
  for (int e = 0; e < a.E; ++e) {
    for (int64_t m = a.seg[e]; m < a.seg[e + 1]; ++m) {
      const bool active = a.row_expert[m] >= 0;
      std::fill(c.begin(), c.end(), 0.f);
      if (active) {
        const int64_t src = a.a_idx != nullptr ? a.a_idx[m] / a.a_div : m;
        for (int64_t k = 0; k < K; ++k) {
          const float x = load(a.a, src * a.lda + k);
          for (int64_t n = 0; n < N; ++n)
            c[n] += x * load(a.w, a.w_kmajor ? (e * N + n) * a.ldw + k : (e * K + k) * a.ldw + n);
        }
        for (int64_t j = 0; j < r; ++j) {
          const float x = load(a.a2, m * r + j);
          for (int64_t n = 0; n < N; ++n)
            c[n] += x * load(a.w2, a.w2_kmajor ? n * a.ldw2 + e * r + j : (e * r + j) * a.ldw2 + n);
        }
      }
      auto bias = [&](int64_t n) { return a.bias != nullptr ? load(a.bias, e * a.bias_estride + n) : 0.f; };
      switch (a.epi) {
        case Epi::store:
          for (int64_t n = 0; n < N; ++n) store(a.out, m * a.ldo + n, active ? c[n] + bias(n) : 0.f);
          break;
        case Epi::glu:
          if (a.u_out != nullptr)
            for (int64_t n = 0; n < N; ++n)
              store(a.u_out, m * a.ldu_out + n, active ? c[n] + bias(n) : 0.f);
          if (a.out != nullptr)
            for (int64_t j = 0; j < I; ++j) {
              float h = 0, dg, dv;
              glu(a, c[gate_col(j)] + bias(gate_col(j)), c[up_col(j)] + bias(up_col(j)), 0.f, h, dg, dv);
              store(a.out, m * a.ldo + j, active ? h : 0.f);
            }
          break;
        case Epi::dglu: {
          const int tiles = gather_gemm_col_tiles(a);
          std::vector<float> sums(tiles, 0.f);
          const float scale = active ? a.row_scale[m] : 0.f;
          for (int64_t j = 0; j < I; ++j) {
            float h, dg, dv;
            glu(a, load(a.u, m * a.ldu + gate_col(j)), load(a.u, m * a.ldu + up_col(j)), scale * c[j], h, dg, dv);
            store(a.out, m * a.ldo + gate_col(j), active ? dg : 0.f);
            store(a.out, m * a.ldo + up_col(j), active ? dv : 0.f);
            sums[j / 256] += c[j] * rounded(h);
            if (a.h_out != nullptr) store(a.h_out, m * a.ldh_out + j, active ? h : 0.f);
          }
          for (int t = 0; t < tiles; ++t) a.rowsum[m * a.ld_rowsum + t] = active ? sums[t] : 0.f;
          break;
        }
      }
    }
  }
  return nullptr;
}

const char* launch_combine(const CombineArgs& a, cudaStream_t) {
  if (a.N % 8 != 0 || a.ld_rows % 8 != 0 || a.ld_y % 8 != 0) return "combine: unaligned rows";
  if (a.k < 1 || a.k > 16) return "combine: top-k must be 1..16";
  for (int64_t t = 0; t < a.T; ++t)
    for (int64_t n = 0; n < a.N; ++n) {
      float acc = 0.f;
      for (int j = 0; j < a.k; ++j) {
        const int64_t r = a.inv[t * a.k + j];
        if (r < 0) continue;
        acc += (a.gates != nullptr ? load(a.gates, t * a.k + j) : 1.f) * load(a.rows, r * a.ld_rows + n);
      }
      store(a.y, t * a.ld_y + n, acc);
    }
  return nullptr;
}

}  // namespace ax::sonicmoe

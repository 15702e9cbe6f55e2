// CPU check of the packed-weight tile loader (kernels/weight_formats.cuh, PackedTile): the header's own
// code, compiled for the host with the few CUDA built-ins it uses replaced below, is run for all 256
// "threads" of every tile of every expert — fetch() then store(), aligned path and element-wise path,
// forward (W_e) and dX (W_eᵀ) orientation, EKN and ENK, both tile widths — and each decoded tile must
// equal ops::dequantize(w) rounded to bf16 bit for bit, with zeros outside the matrix. It cannot check
// the kernel's pipelining (tests/scattermoe_test.cpp does that on a GPU), only the index and bit
// arithmetic of decoding, which is where a format bug would hide.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <axengine/ops/quant.hpp>

// Host stand-ins for the device built-ins weight_formats.cuh uses. threadIdx is one "thread" at a time;
// __shared__ becomes a function-local static (one code table, as one block's).
struct EmulatedThread {
  unsigned x;
};
static EmulatedThread emulated_thread;
#define threadIdx emulated_thread
#undef __shared__
#define __shared__ static
#undef __device__
#define __device__
#undef __forceinline__
#define __forceinline__ inline
template <class T>
T __ldg(const T* p) {
  return *p;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;  // no contraction into an FMA with a following add
  return r;
}
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}
inline int __ffs(int v) { return __builtin_ffs(v); }
inline void __syncthreads() {}

#include "kernels/weight_formats.cuh"  // plugins/scattermoe is on the include path

namespace {

using namespace ax::scattermoe;
using namespace ax::scattermoe::detail;
using T = __nv_bfloat16;
constexpr int kBK = 32, kThreads = 256;
int failures = 0, checks = 0;

// GEMM view W(k, n) of expert e, [a.K, a.N], assembled from the shared-memory tiles the loader writes.
template <WeightFormat F, bool BLK, int BN, bool KMAJ>
at::Tensor decode(const GroupedGemmArgs& a, int e, bool vec) {
  constexpr int ROWS = KMAJ ? BN : kBK, COLS = KMAJ ? kBK : BN;
  at::Tensor out = at::empty({a.K, a.N}, at::kFloat);
  auto o = out.accessor<float, 2>();
  std::vector<T> sm(ROWS * (COLS + 8));
  for (int n0 = 0; n0 < a.N; n0 += BN) {
    std::vector<PackedTile<T, F, BLK, ROWS, COLS, KMAJ, kThreads>> th(kThreads);
    for (unsigned t = 0; t < kThreads; ++t) {
      emulated_thread.x = t;
      th[t].init(e, n0, vec);
    }
    for (int k0 = 0; k0 < a.K; k0 += kBK) {
      for (auto& x : sm) x = __float2bfloat16(777.0f);  // anything not written shows
      for (unsigned t = 0; t < kThreads; ++t) {
        emulated_thread.x = t;
        th[t].fetch(a, k0);
      }
      for (unsigned t = 0; t < kThreads; ++t) {
        emulated_thread.x = t;
        th[t].store(a, sm.data(), k0);
      }
      for (int r = 0; r < ROWS; ++r)
        for (int c = 0; c < COLS; ++c) {
          const int k = k0 + (KMAJ ? c : r), n = n0 + (KMAJ ? r : c);
          const float v = __bfloat162float(sm[r * (COLS + 8) + c]);
          if (k < a.K && n < a.N) {
            o[k][n] = v;
          } else if (v != 0.f) {
            std::printf("FAIL: element (k %d, n %d) outside the matrix holds %g, not 0\n", k, n, v);
            ++failures;
          }
        }
    }
  }
  return out;
}

template <WeightFormat F, bool BLK, int BN>
void check(const std::string& name, const ax::ops::WeightTensor& w, bool enk, bool dx, bool vec) {
  const int64_t E = w.shape[0], K = enk ? w.shape[2] : w.shape[1], N = enk ? w.shape[1] : w.shape[2];
  const at::Tensor ref = ax::ops::dequantize(w, at::kBFloat16).to(at::kFloat);
  std::vector<at::Tensor> keep;
  auto ptr = [&](const at::Tensor& t) {
    keep.push_back(t.contiguous());
    return keep.back().data_ptr();
  };
  GroupedGemmArgs a;  // filled as scattermoe_plugin.cpp does
  PackedWeight& p = a.wq;
  p.format = F;
  p.codes = static_cast<const uint8_t*>(ptr(w.codes));
  p.scales = ptr(w.scales);
  p.blocksize = static_cast<int>(w.blocksize);
  p.blocks_along_rows = !enk;
  if (w.double_quant()) {
    p.nested_code = static_cast<const float*>(ptr(w.nested_code));
    p.nested_scales = static_cast<const float*>(ptr(w.nested_scales));
    p.nested_offset = static_cast<float>(w.nested_offset);
    p.nested_blocksize = static_cast<int>(w.nested_blocksize);
  }
  if (w.global_scale.defined()) {
    p.global_scale = static_cast<const float*>(ptr(w.global_scale));
    p.global_per_expert = w.global_scale.numel() > 1;
  }
  const bool kmaj = dx ? !enk : enk;  // forward: ENK is k-major; dX reads the other way
  a.K = static_cast<int>(dx ? N : K);
  a.N = static_cast<int>(dx ? K : N);
  if (vec && !packed_vec_ok(p, kmaj ? a.K : a.N)) return;  // the host would not take the aligned path
  ++checks;
  for (int e = 0; e < E; ++e) {
    const at::Tensor got = kmaj ? decode<F, BLK, BN, true>(a, e, vec) : decode<F, BLK, BN, false>(a, e, vec);
    const at::Tensor We = enk ? ref[e].t() : ref[e];  // the op's [K, N]
    const at::Tensor want = (dx ? We.t() : We).contiguous();
    if (!at::equal(got, want)) {
      std::printf("FAIL: %s layout %s %s path %s tile %d: expert %d differs (max |diff| %g)\n", name.c_str(),
                  enk ? "ENK" : "EKN", dx ? "dX" : "forward", vec ? "aligned" : "element-wise", BN, e,
                  (got - want).abs().nan_to_num(1e30).max().item<float>());
      ++failures;
      return;
    }
  }
}

template <int BN>
void run_shape(int64_t E, int64_t K, int64_t N) {
  for (bool enk : {false, true}) {
    at::Tensor w = at::randn(enk ? std::vector<int64_t>{E, N, K} : std::vector<int64_t>{E, K, N});
    const int64_t kaxis = enk ? 2 : 1;
    std::vector<std::pair<std::string, ax::ops::WeightTensor>> ws;
    if ((E * K * N) % 64 == 0) {
      ws.emplace_back("nf4", ax::ops::quantize_nf4(w, 64, false));
      ws.emplace_back("nf4-dq", ax::ops::quantize_nf4(w, 64, true));
    }
    if (K % 32 == 0) ws.emplace_back("mxfp4", ax::ops::quantize_mxfp4(w, kaxis));
    if (K % 16 == 0) {
      ws.emplace_back("nvfp4", ax::ops::quantize_nvfp4(w, kaxis, false));
      ws.emplace_back("nvfp4-pe", ax::ops::quantize_nvfp4(w, kaxis, true));
    }
    using F = ax::ops::WeightFormat;
    for (auto& [name, wq] : ws)
      for (bool dx : {false, true})
        for (bool vec : {true, false}) {
          if (wq.format == F::nf4) check<WeightFormat::nf4, false, BN>(name, wq, enk, dx, vec);
          else if (wq.format == F::mxfp4 && enk) check<WeightFormat::mxfp4, false, BN>(name, wq, enk, dx, vec);
          else if (wq.format == F::mxfp4) check<WeightFormat::mxfp4, true, BN>(name, wq, enk, dx, vec);
          else if (enk) check<WeightFormat::nvfp4, false, BN>(name, wq, enk, dx, vec);
          else check<WeightFormat::nvfp4, true, BN>(name, wq, enk, dx, vec);
        }
  }
}

}  // namespace

int main() {
  at::manual_seed(1);
  run_shape<128>(3, 128, 192);  // aligned, several tiles in both directions
  run_shape<128>(3, 128, 90);   // N % 8 != 0: EKN rows unaligned
  run_shape<128>(2, 96, 130);   // partial n tiles
  run_shape<16>(3, 64, 24);     // the thin 128x16 tile
  run_shape<128>(4, 100, 16);   // nf4 only: K % 8 != 0, partial k tile
  run_shape<128>(4, 80, 40);    // nvfp4: partial k tile
  run_shape<16>(4, 80, 40);
  // E8M0 edge codes: 0 is 2^-127 (a denormal), 255 NaN, as ops::e8m0_decode.
  if (e8m0_value(0) != std::ldexp(1.0f, -127) || !std::isnan(e8m0_value(255)) || e8m0_value(127) != 1.0f) {
    std::printf("FAIL: E8M0 edge values\n");
    ++failures;
  }
  std::printf("%d tile-decoding checks, %d failures\n", checks, failures);
  return failures == 0 && checks > 0 ? 0 : 1;
}

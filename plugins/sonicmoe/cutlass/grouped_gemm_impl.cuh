// The CUTLASS kernel behind grouped_gemm.hpp, as a template over its tile, cluster and schedule: bf16 operands,
// fp32 accumulation, A row-major (the sorted rows), B K-major (W_e stored [N, K], the checkpoint's [E, out, in]),
// D row-major, CUTLASS 3's sm90 pointer-array collectives. Each schedule is instantiated in a translation unit of
// its own (grouped_gemm_<schedule>.cu): CUTLASS templates are heavy to compile and CI has 2 cores.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "grouped_gemm.hpp"

namespace ax::sonicmoe::cutlass_gemm::detail {

using namespace cute;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // per group (M, N, K)
using Problem = ProblemShape::UnderlyingProblemShape;
using Bf16 = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;  // B is K x N with K contiguous: W_e as [N, K] rows
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlign = 8;                      // 16 bytes of bf16

inline size_t up16(size_t n) { return (n + 15) / 16 * 16; }
// CUTLASS's workspace holds the TMA descriptors it rewrites per group (CUtensorMap: 64-byte aligned; the
// collectives' MinTensorMapWorkspaceAlignment). The first run on an H100 (2026-12-07) started it 16-byte
// aligned, after the tables, and stopped with "misaligned address": it starts on 128 bytes now.
constexpr size_t kWorkspaceAlign = 128;

inline int device_sms() {
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  return n;
}

// The per-expert arrays a kernel reads, in the scratch buffer (each 16-byte aligned).
template <class StrideA, class StrideB, class StrideC, class StrideD>
struct Tables {
  Problem* problems;
  const Bf16** a;
  const Bf16** b;
  const Bf16** c;
  Bf16** d;
  StrideA* sa;
  StrideB* sb;
  StrideC* sc;
  StrideD* sd;
  void* workspace;

  static size_t bytes(int E) {
    const size_t n = up16(E * sizeof(Problem)) + 4 * up16(E * sizeof(void*)) + up16(E * sizeof(StrideA)) +
                     up16(E * sizeof(StrideB)) + up16(E * sizeof(StrideC)) + up16(E * sizeof(StrideD));
    return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  }
  static Tables carve(void* scratch, int E) {
    char* p = static_cast<char*>(scratch);
    auto take = [&](size_t n) { void* q = p; p += up16(n); return q; };
    Tables t;
    t.problems = static_cast<Problem*>(take(E * sizeof(Problem)));
    t.a = static_cast<const Bf16**>(take(E * sizeof(void*)));
    t.b = static_cast<const Bf16**>(take(E * sizeof(void*)));
    t.c = static_cast<const Bf16**>(take(E * sizeof(void*)));
    t.d = static_cast<Bf16**>(take(E * sizeof(void*)));
    t.sa = static_cast<StrideA*>(take(E * sizeof(StrideA)));
    t.sb = static_cast<StrideB*>(take(E * sizeof(StrideB)));
    t.sc = static_cast<StrideC*>(take(E * sizeof(StrideC)));
    t.sd = static_cast<StrideD*>(take(E * sizeof(StrideD)));
    t.workspace = static_cast<char*>(scratch) + bytes(E);
    return t;
  }
};

// One thread per expert: its rows' shape, pointers and strides from seg, on the device (no host sync).
template <class T>
__global__ void setup_tables(GroupedGemmArgs g, T t) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= g.E) return;
  const int64_t m0 = g.seg[e], rows = g.seg[e + 1] - m0;
  t.problems[e] = Problem(static_cast<int>(rows), g.N, g.K);
  t.a[e] = static_cast<const Bf16*>(g.a) + m0 * g.lda;
  t.b[e] = static_cast<const Bf16*>(g.w) + static_cast<int64_t>(e) * g.N * g.ldw;
  t.c[e] = static_cast<const Bf16*>(g.c ? g.c : g.d) + m0 * (g.c ? g.ldc : g.ldd);
  t.d[e] = static_cast<Bf16*>(g.d) + m0 * g.ldd;
  std::remove_pointer_t<decltype(t.sa)> sa{};
  std::remove_pointer_t<decltype(t.sb)> sb{};
  std::remove_pointer_t<decltype(t.sc)> sc{};
  std::remove_pointer_t<decltype(t.sd)> sd{};
  get<0>(sa) = g.lda;
  get<0>(sb) = g.ldw;
  get<0>(sc) = g.c ? g.ldc : g.ldd;
  get<0>(sd) = g.ldd;
  t.sa[e] = sa;
  t.sb[e] = sb;
  t.sc[e] = sc;
  t.sd[e] = sd;
}

// One schedule: the collectives CUTLASS's builders pick for this tile, cluster and (mainloop, epilogue) schedule.
template <class TileShape, class ClusterShape, class MainloopSchedule, class EpilogueSchedule>
struct GroupedGemm {
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Bf16, LayoutD*, kAlign, Bf16, LayoutD*, kAlign,
      EpilogueSchedule, cutlass::epilogue::fusion::LinearCombination<Bf16, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA*, kAlign, Bf16, LayoutB*, kAlign, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using T = Tables<typename Kernel::InternalStrideA, typename Kernel::InternalStrideB, typename Kernel::InternalStrideC,
                   typename Kernel::InternalStrideD>;

  static typename Gemm::Arguments arguments(const GroupedGemmArgs& g, const T& t, int sms) {
    cutlass::KernelHardwareInfo hw;
    cudaGetDevice(&hw.device_id);
    hw.sm_count = sms;
    typename Gemm::Arguments args;
    decltype(args.epilogue.thread) fusion;
    fusion.alpha = 1.f;
    fusion.beta = g.c ? g.beta : 0.f;
    fusion.alpha_ptr = nullptr;
    fusion.beta_ptr = nullptr;
    fusion.alpha_ptr_array = nullptr;
    fusion.beta_ptr_array = nullptr;
    fusion.dAlpha = {_0{}, _0{}, 0};
    fusion.dBeta = {_0{}, _0{}, 0};
    // No host problem shapes: the persistent scheduler fills `sms` CTAs and reads the shapes on the device.
    args = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                    {g.E, t.problems, nullptr},
                                    {t.a, t.sa, t.b, t.sb},
                                    {fusion, t.c, t.sc, t.d, t.sd},
                                    hw};
    return args;
  }

  static size_t scratch_bytes(int E, int sms) {
    GroupedGemmArgs g;
    g.E = E;
    T t{};
    return T::bytes(E) + up16(Gemm::get_workspace_size(arguments(g, t, sms > 0 ? sms : device_sms())));
  }

  static const char* launch(const GroupedGemmArgs& g, cudaStream_t stream) {
    const int sms = g.sms > 0 ? g.sms : device_sms();
    const T t = T::carve(g.scratch, g.E);
    setup_tables<<<(g.E + 127) / 128, 128, 0, stream>>>(g, t);
    if (cudaGetLastError() != cudaSuccess) return "grouped_gemm: the setup kernel did not launch";
    Gemm gemm;
    const auto args = arguments(g, t, sms);
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return "grouped_gemm: CUTLASS cannot implement this call";
    if (gemm.initialize(args, t.workspace, stream) != cutlass::Status::kSuccess) return "grouped_gemm: initialize failed";
    if (gemm.run(stream) != cutlass::Status::kSuccess) return "grouped_gemm: the kernel did not launch";
    return nullptr;
  }
};

}  // namespace ax::sonicmoe::cutlass_gemm::detail

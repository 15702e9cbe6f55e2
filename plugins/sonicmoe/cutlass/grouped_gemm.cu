// The CUTLASS instantiation behind grouped_gemm.hpp: bf16 operands, fp32 accumulation, A row-major (the
// sorted rows), B K-major (W_e stored [N, K], the checkpoint's [E, out, in]), D row-major; tile 128x128x64,
// no cluster (experts of ~128 rows leave little to share), the ptr-array ping-pong schedule: two consumer
// warp groups alternate tiles, so one's epilogue overlaps the other's mainloop.
// One instantiation in this translation unit (CUTLASS templates are heavy to compile; CI has 2 cores).
#include "grouped_gemm.hpp"

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace ax::sonicmoe::cutlass_gemm {
namespace {

using namespace cute;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // per group (M, N, K)
using Bf16 = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;  // B is K x N with K contiguous: W_e as [N, K] rows
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlign = 8;                      // 16 bytes of bf16
using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_1, _1, _1>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, Bf16, LayoutD*, kAlign, Bf16, LayoutD*, kAlign,
    cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
    cutlass::epilogue::fusion::LinearCombination<Bf16, float>>::CollectiveOp;
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA*, kAlign, Bf16, LayoutB*, kAlign, float,
    TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

using StrideA = typename Kernel::InternalStrideA;
using StrideB = typename Kernel::InternalStrideB;
using StrideC = typename Kernel::InternalStrideC;
using StrideD = typename Kernel::InternalStrideD;
using Problem = ProblemShape::UnderlyingProblemShape;

// The per-expert arrays the kernel reads, in the scratch buffer (each 16-byte aligned).
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
};
size_t up16(size_t n) { return (n + 15) / 16 * 16; }
// CUTLASS's workspace holds the TMA descriptors it rewrites per group (CUtensorMap: 64-byte aligned; the
// collectives' MinTensorMapWorkspaceAlignment). The first run on an H100 (2026-12-07) started it 16-byte
// aligned, after the tables, and stopped with "misaligned address": it starts on 128 bytes now.
constexpr size_t kWorkspaceAlign = 128;
size_t table_bytes(int E) {
  const size_t n = up16(E * sizeof(Problem)) + 4 * up16(E * sizeof(void*)) + up16(E * sizeof(StrideA)) +
                   up16(E * sizeof(StrideB)) + up16(E * sizeof(StrideC)) + up16(E * sizeof(StrideD));
  return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}
Tables carve(void* scratch, int E) {
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
  t.workspace = static_cast<char*>(scratch) + table_bytes(E);
  return t;
}

// One thread per expert: its rows' shape, pointers and strides from seg, on the device (no host sync).
__global__ void setup_tables(GroupedGemmArgs g, Tables t) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= g.E) return;
  const int64_t m0 = g.seg[e], rows = g.seg[e + 1] - m0;
  t.problems[e] = Problem(static_cast<int>(rows), g.N, g.K);
  t.a[e] = static_cast<const Bf16*>(g.a) + m0 * g.lda;
  t.b[e] = static_cast<const Bf16*>(g.w) + static_cast<int64_t>(e) * g.N * g.ldw;
  t.c[e] = static_cast<const Bf16*>(g.c ? g.c : g.d) + m0 * (g.c ? g.ldc : g.ldd);
  t.d[e] = static_cast<Bf16*>(g.d) + m0 * g.ldd;
  StrideA sa{};
  get<0>(sa) = g.lda;
  StrideB sb{};
  get<0>(sb) = g.ldw;
  StrideC sc{};
  get<0>(sc) = g.c ? g.ldc : g.ldd;
  StrideD sd{};
  get<0>(sd) = g.ldd;
  t.sa[e] = sa;
  t.sb[e] = sb;
  t.sc[e] = sc;
  t.sd[e] = sd;
}

typename Gemm::Arguments arguments(const GroupedGemmArgs& g, const Tables& t, int sms) {
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

int device_sms() {
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  return n;
}

}  // namespace

size_t grouped_gemm_scratch_bytes(int E, int sms) {
  if (sms <= 0) sms = device_sms();
  GroupedGemmArgs g;
  g.E = E;
  Tables t{};
  return table_bytes(E) + up16(Gemm::get_workspace_size(arguments(g, t, sms)));
}

const char* launch_grouped_gemm(const GroupedGemmArgs& g, cudaStream_t stream) {
  if (g.E <= 0 || !g.seg || !g.a || !g.w || !g.d || !g.scratch) return "grouped_gemm: missing argument";
  if (reinterpret_cast<uintptr_t>(g.scratch) % kWorkspaceAlign) return "grouped_gemm: scratch must be 128-byte aligned";
  if (g.K % kAlign || g.N % kAlign || g.lda % kAlign || g.ldw % kAlign || g.ldd % kAlign || (g.c && g.ldc % kAlign))
    return "grouped_gemm: K, N and every row stride must be multiples of 8 elements (16-byte TMA rows)";
  const int sms = g.sms > 0 ? g.sms : device_sms();
  const Tables t = carve(g.scratch, g.E);
  setup_tables<<<(g.E + 127) / 128, 128, 0, stream>>>(g, t);
  if (cudaGetLastError() != cudaSuccess) return "grouped_gemm: the setup kernel did not launch";
  Gemm gemm;
  const auto args = arguments(g, t, sms);
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return "grouped_gemm: CUTLASS cannot implement this call";
  if (gemm.initialize(args, t.workspace, stream) != cutlass::Status::kSuccess) return "grouped_gemm: initialize failed";
  if (gemm.run(stream) != cutlass::Status::kSuccess) return "grouped_gemm: the kernel did not launch";
  return nullptr;
}

}  // namespace ax::sonicmoe::cutlass_gemm

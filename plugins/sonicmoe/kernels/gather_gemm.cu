// Host side of the sonicmoe grouped GEMM: argument checks, TMA descriptors, dispatch to the
// instantiations (gather_gemm_{store,glu,dglu}.cu, one epilogue each so they compile in parallel).
#include <cmath>
#include <string>

#include "gather_gemm.cuh"

namespace ax::sonicmoe {
namespace detail {

void launch_store(bool w_kmajor, bool w2_kmajor, const Maps& m, const Params& p, size_t smem, int grid, cudaStream_t s);
void launch_glu(bool w_kmajor, const Maps& m, const Params& p, size_t smem, int grid, cudaStream_t s);
void launch_dglu(bool w_kmajor, const Maps& m, const Params& p, size_t smem, int grid, cudaStream_t s);

EncodeFn encode_fn() {
  static EncodeFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    cudaGetLastError();
    return reinterpret_cast<EncodeFn>(f);
  }();
  return fn;
}

bool encode(CUtensorMap* m, const void* base, int64_t rows, int64_t cols, int64_t ld, int box_cols, int box_rows) {
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(ld) * 2};
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  return encode_fn()(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

namespace {
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
bool ok16(const void* p, int64_t ld) { return p != nullptr && aligned16(p) && ld % 8 == 0; }
}  // namespace

const char* prepare(const GatherGemmArgs& a, Maps& maps, Params& p, size_t& smem, int& grid) {
  if (encode_fn() == nullptr) return "the driver has no cuTensorMapEncodeTiled";
  if (a.E <= 0 || a.M <= 0 || a.M >= (int64_t{1} << 31)) return "rows or experts out of range";
  if (a.K <= 0 || a.K % kBK != 0) return "K must be a positive multiple of 64";
  if (a.N <= 0 || a.N % 8 != 0) return "N must be a positive multiple of 8";
  // The epilogues write (and dglu reads u in) 16-byte column groups: the GLU's half width I a multiple of 8.
  if (a.epi == Epi::glu && a.N % 16 != 0) return "the GLU width 2I must be a multiple of 16";
  if (!ok16(a.a, a.lda) || !ok16(a.w, a.ldw)) return "operands must be 16-byte aligned";
  if (a.epi == Epi::glu ? (a.out == nullptr && a.u_out == nullptr) : a.out == nullptr) return "no output";
  if ((a.out != nullptr && !ok16(a.out, a.ldo)) || (a.u_out != nullptr && !ok16(a.u_out, a.ldu_out)) ||
      (a.h_out != nullptr && !ok16(a.h_out, a.ldh_out)))
    return "outputs must be 16-byte aligned";
  if ((a.u_out != nullptr && a.epi != Epi::glu) || (a.h_out != nullptr && a.epi != Epi::dglu))
    return "u_out is glu's, h_out dglu's";
  if (a.r < 0 || a.r > 64 || a.r % 8 != 0) return "the LoRA rank must be padded to a multiple of 8, at most 64";
  if (a.r > 0 && (!ok16(a.a2, a.r) || !ok16(a.w2, a.ldw2))) return "LoRA operands must be 16-byte aligned";
  if (a.bias != nullptr && (a.bias_estride % 4 != 0 || (reinterpret_cast<uintptr_t>(a.bias) & 7u) != 0))
    return "bias rows must be 8-byte aligned";
  if (a.epi == Epi::dglu && (!ok16(a.u, a.ldu) || a.row_scale == nullptr || a.rowsum == nullptr))
    return "dglu needs u, row_scale and rowsum";
  const int64_t u_cols = a.epi == Epi::glu ? a.N : a.N;  // B's columns: u's 2I (glu), else N
  const int64_t w_rows = a.w_kmajor ? int64_t(a.E) * u_cols : int64_t(a.E) * a.K;
  if (w_rows >= (int64_t{1} << 31)) return "the weight has more than 2^31 rows";
  if (a.epi == Epi::store && a.a_idx != nullptr) return "the store epilogue reads A in row order (no gather)";
  bool ok = a.w_kmajor ? encode(&maps.b, a.w, w_rows, a.K, a.ldw, kBK, 128) : encode(&maps.b, a.w, w_rows, u_cols, a.ldw, 64, kBK);
  if (a.epi == Epi::store) ok = ok && encode(&maps.a, a.a, a.M, a.K, a.lda, kBK, kBM);
  else maps.a = maps.b;  // unused: the gathered A is copied with cp.async
  if (a.r > 0) {
    ok = ok && encode(&maps.a2, a.a2, a.M, a.r, a.r, kBK, kBM);
    ok = ok && (a.w2_kmajor ? encode(&maps.b2, a.w2, u_cols, int64_t(a.r) * a.E, a.ldw2, kBK, 128)
                            : encode(&maps.b2, a.w2, int64_t(a.r) * a.E, u_cols, a.ldw2, 64, kBK));
  } else {
    maps.a2 = maps.b;
    maps.b2 = maps.b;
  }
  if (!ok) return "cuTensorMapEncodeTiled refused an operand";
  p = Params{};
  p.seg = a.seg;
  p.row_expert = a.row_expert;
  p.a = static_cast<const __nv_bfloat16*>(a.a);
  p.lda = a.lda;
  p.a_idx = a.a_idx;
  p.a_div = a.a_div;
  p.E = a.E;
  p.N = a.N;
  p.k_tiles = a.K / kBK;
  p.n_tiles = gather_gemm_col_tiles(a);
  p.M = a.M;
  p.w_erows = a.w_kmajor ? u_cols : a.K;
  p.r = a.r;
  p.interleaved = a.interleaved;
  p.alpha = a.clamped ? a.alpha : 1.f;  // act's one formula: SiLU-GLU is (1, inf, 0)
  p.limit = a.clamped ? a.limit : INFINITY;
  p.beta = a.clamped ? 1.f : 0.f;
  p.bias = static_cast<const __nv_bfloat16*>(a.bias);
  p.bias_estride = a.bias_estride;
  p.out = static_cast<__nv_bfloat16*>(a.out);
  p.ldo = a.ldo;
  p.uo = static_cast<__nv_bfloat16*>(a.u_out);
  p.lduo = a.ldu_out;
  p.ho = static_cast<__nv_bfloat16*>(a.h_out);
  p.ldho = a.ldh_out;
  p.u = static_cast<const __nv_bfloat16*>(a.u);
  p.ldu = a.ldu;
  p.row_scale = a.row_scale;
  p.rowsum = a.rowsum;
  p.ld_rowsum = a.ld_rowsum;
  smem = kSmemFixed + sizeof(int) * (a.E + 1);
  if (smem > 232448) return "too many experts for the shared-memory tile table";
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  grid = sms > 0 ? sms : 1;
  return nullptr;
}

}  // namespace detail

int gather_gemm_col_tiles(const GatherGemmArgs& a) {
  if (a.epi == Epi::glu && !a.interleaved) return (a.N / 2 + 127) / 128;  // 128 gate + 128 up columns a tile
  return (a.N + detail::kBN - 1) / detail::kBN;
}

const char* launch_gather_gemm(const GatherGemmArgs& a, cudaStream_t stream) {
  detail::Maps maps{};
  detail::Params p{};
  size_t smem = 0;
  int grid = 0;
  if (const char* why = detail::prepare(a, maps, p, smem, grid)) return why;
  switch (a.epi) {
    case Epi::store: detail::launch_store(a.w_kmajor, a.w2_kmajor, maps, p, smem, grid, stream); break;
    case Epi::glu:
      if (a.r > 0 && !a.w2_kmajor) return "glu takes lora_b (K-major) as B2";
      detail::launch_glu(a.w_kmajor, maps, p, smem, grid, stream);
      break;
    case Epi::dglu:
      if (a.r > 0 && a.w2_kmajor) return "dglu takes lora_a (MN-major) as B2";
      detail::launch_dglu(a.w_kmajor, maps, p, smem, grid, stream);
      break;
  }
  return nullptr;
}

const char* gather_gemm_unavailable(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return "cannot read the compute capability";
  }
  if (major != 9 || minor != 0) return "wgmma and setmaxnreg need sm_90 (the cubin is sm_90a)";
  if (detail::encode_fn() == nullptr) return "the driver has no cuTensorMapEncodeTiled";
  // The kernel body exists only in an sm_90a cubin; any other build of it is empty, recognisable by its
  // register count (the real one holds 128 fp32 accumulators per consumer thread).
  static const bool compiled = [] {
    cudaFuncAttributes fa{};
    const bool ok = cudaFuncGetAttributes(&fa, detail::gather_gemm_kernel<true, true, 1, int(Epi::glu)>) == cudaSuccess &&
                    fa.numRegs >= 128;
    cudaGetLastError();
    return ok;
  }();
  return compiled ? nullptr : "the plugin was built without an sm_90a cubin";
}

}  // namespace ax::sonicmoe

// The fine-grained FP8 decode kernel's launcher and arguments: a plain struct of pointers shared by the .cu
// kernel (no torch headers) and the ATen glue (../src/dequant_backend.cpp), which validates the weight.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ax::fp8 {

enum class DType { fp32, bf16, fp16 };

// Slice s of an fp8 weight [..., R, C] (the leading dims flattened into slices) into out[s]: element (r, c) is
// float(codes[r, c]) · scales[r / block_rows, c / block_cols] (scales [ceil(R/br), ceil(C/bc)] per slice), the
// product rounded in fp32, then once to `dtype`: ops::dequantize's arithmetic, bit for bit. Slice s reads
// source slice experts[s] when `experts` is set (dequant's selective form: the ids are read on the device),
// else s.
struct Fp8DequantLaunch {
  const uint8_t* codes = nullptr;  // float8_e4m3fn bits
  const float* scales = nullptr;
  void* out = nullptr;
  DType dtype = DType::bf16;
  int64_t rows = 0, cols = 0, block_rows = 128, block_cols = 128;
  int64_t slices = 1;
  const int64_t* experts = nullptr;
};
void launch_fp8_dequant(const Fp8DequantLaunch& p, cudaStream_t stream);

}  // namespace ax::fp8

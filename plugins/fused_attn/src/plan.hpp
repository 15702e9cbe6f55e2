// Host-side launch planning of the fused_attn kernels: which path (16-byte vectors or scalar) a call may
// take, how lead dimensions collapse into one row stride, block shapes, grid sizes and linear_ce's chunk.
// Plain C++ (no CUDA, no ATen) so that tests/plan_test.cpp checks every rule on a machine without a GPU;
// the kernels (../kernels/*.cu) trust what these functions decide, so a wrong answer here is an
// out-of-bounds access there.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

namespace ax::fused_attn::plan {

constexpr int kVectorBytes = 16;   // one 128-bit load / store
constexpr int kMaxHeadDim = 256;   // norm_rope: D up to 256 (registers sized for it)
constexpr int kMaxHidden = 16384;  // rms_norm: H up to 16384 (registers sized for it)
constexpr int kNormRopeThreads = 256;
constexpr int kReduceRowsMax = 1 << 20;  // grid cap of the row loops (they stride over the rest)

// One operand of a launch as the vector path would address it: the address of its first element, the
// stride between consecutive columns and the strides between rows (all in elements).
struct Operand {
  std::uintptr_t address = 0;
  int64_t col_stride = 1;
  std::vector<int64_t> row_strides;
};

// Elements per 16-byte vector of an element of `elem_bytes` bytes (8 for bf16/fp16, 4 for fp32).
int vector_width(int elem_bytes);

// True when every operand can be moved in 16-byte vectors along `cols` columns: cols a multiple of the
// vector width, unit column stride, 16-byte aligned first element, every row stride a multiple of the
// vector width (so every row starts aligned). Otherwise the kernels take their scalar path.
bool vectorisable(int64_t cols, int elem_bytes, std::initializer_list<Operand> operands);

// The single stride with which dims [0, n) of a tensor (sizes, strides) can be walked as one flattened
// index, or nothing when they do not collapse (a padded or permuted view). Dims of size 1 do not
// constrain; no dims, or only size-1 dims, collapse with stride 0; a zero-size dim collapses trivially.
std::optional<int64_t> collapse(const int64_t* sizes, const int64_t* strides, int n);

// norm_rope: lanes per row (16: a half-warp; 32: a warp) for D columns moved `vec` at a time, and the
// rows a 256-thread block works on at once.
int norm_rope_lanes(int64_t D, int vec);
int norm_rope_rows_in_parallel(int lanes);
// Tokens (lead indices) a block handles per iteration: enough that its H-head rows fill the block's
// parallel row slots, at most 16 (the cos/sin table in shared memory holds one row of R per token).
int norm_rope_tokens_per_iteration(int64_t heads, int rows_in_parallel);
// Dynamic shared memory of a norm_rope block (bytes): the cos/sin table, one staging row per slot and
// the scale w' (also reused by the backward's dweight reduction).
int64_t norm_rope_smem_bytes(int tokens_per_iteration, int64_t R, int rows_in_parallel, int64_t D);
// The three together, as the launchers and the glue both use them.
struct NormRopeShape {
  int lanes = 0, rows_in_parallel = 0, tokens_per_iteration = 0;
};
NormRopeShape norm_rope_shape(int64_t D, int64_t heads, int vec);

// The heads-major path (kernels/norm_rope.cu, norm_rope_*_heads): a group of D / vec lanes (8 or 16) owns
// one (token, run of kNormRopeHeadRun heads) item, its cos/sin in registers and the rotation partner a
// whole lane away. It takes 16-byte vectors of a 2-byte type, D of 64 or 128 and R a multiple of 16 (so
// R/2 is whole vectors); 0 when the call needs the general path.
constexpr int kNormRopeHeadRun = 8;
int norm_rope_group_lanes(int64_t D, int64_t R, int vec, bool vectorised);
// Items of the heads-major path: tokens · ceil(heads / kNormRopeHeadRun); a 256-thread block holds
// 256 / lanes groups.
int64_t norm_rope_items(int64_t tokens, int64_t heads);

// Chunks per lane the norm_rope kernels hold in registers (a half-warp only serves rows of <= 16 chunks).
constexpr int norm_rope_chunk_cap(int lanes, int vec) {
  return lanes == 16 ? 1 : (kMaxHeadDim + 32 * vec - 1) / (32 * vec);
}

// rms_norm's register budget: 16-byte vectors 4 chunks per thread, single elements 16; blocks of up to
// 512 threads for 16-bit vectors (32 values per thread), 1024 otherwise. Both cover H = 16384.
constexpr int rms_norm_chunk_cap(int vec) { return vec > 1 ? 4 : 16; }
constexpr int rms_norm_max_threads(int vec) { return vec == 8 ? 512 : 1024; }

// rms_norm: a block per row, `threads` threads each owning up to `chunks` vectors (or elements) of the
// row in registers. chunks_cap is the kernel's compile-time register budget per thread.
struct RowShape {
  int threads = 0;
  int chunks = 0;
};
RowShape rms_norm_shape(int64_t H, int vec, int chunks_cap);

// Blocks of a launch that reduces over rows into per-block partials ([blocks, cols] fp32), deterministic
// for a given shape and GPU: one per `rows_per_block` rows, at most `blocks_per_sm` per SM.
int reduction_blocks(int64_t rows, int64_t rows_per_block, int sm_count, int blocks_per_sm);
// Blocks of a plain row loop: one per `rows_per_block` rows, capped (the kernels stride over the rest).
int64_t row_blocks(int64_t rows, int64_t rows_per_block);

// swiglu: a 256-thread block of bx (along a row's vectors) x by (rows); bx a power of two.
struct Tile {
  int bx = 0, by = 0;
};
Tile swiglu_tile(int64_t vectors_per_row);

// linear_ce: tokens per chunk so that the chunk's logits [Tc, V] (elem_bytes each) stay within
// chunk_bytes; a multiple of 64 (at least 64), and never more than T.
int64_t linear_ce_chunk_rows(int64_t T, int64_t V, int elem_bytes, int64_t chunk_bytes);

}  // namespace ax::fused_attn::plan

// fused_attn's host-side decisions, checked on CPU: the kernels trust them (src/plan.hpp), so each rule
// that keeps a launch in bounds — vector path only when every row starts 16-byte aligned, register
// arrays that cover every row the path admits, shared memory under the 48 KiB default, chunks that fit
// the budget — is asserted here over the whole range the kernels accept.
#include "../src/plan.hpp"

#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <cstdint>

#include "../src/views.hpp"

namespace plan = ax::fused_attn::plan;
using ax::fused_attn::operand;
using ax::fused_attn::view1;
using ax::fused_attn::view2;
using ax::fused_attn::view3;

namespace {
// The conformance suite's views: every other column of a wider buffer, and an output window padded
// on every side (core/src/conformance/harness.cpp).
at::Tensor every_other_column(const at::Tensor& t) {
  auto sizes = t.sizes().vec();
  sizes.back() *= 2;
  return at::zeros(sizes, t.options()).slice(-1, 0, sizes.back(), 2);
}
at::Tensor padded_window(at::IntArrayRef shape, at::ScalarType dt, int64_t guard = 3) {
  std::vector<int64_t> padded;
  for (auto s : shape) padded.push_back(s + 2 * guard);
  at::Tensor v = at::zeros(padded, at::TensorOptions().dtype(dt));
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) v = v.narrow(d, guard, shape[d]);
  return v;
}
}  // namespace

TEST_CASE("fused_attn plan: vector path only for aligned rows of whole vectors") {
  const plan::Operand ok{0x1000, 1, {128, 4096}};
  CHECK(plan::vectorisable(128, 2, {ok}));
  CHECK(plan::vectorisable(128, 4, {ok}));
  CHECK_FALSE(plan::vectorisable(130, 2, {ok}));                                // a tail of 2 elements
  CHECK(plan::vectorisable(132, 4, {plan::Operand{0x1000, 1, {132}}}));         // fp32: 4 per vector
  CHECK_FALSE(plan::vectorisable(128, 2, {plan::Operand{0x1002, 1, {128}}}));   // 2-byte offset
  CHECK_FALSE(plan::vectorisable(128, 2, {plan::Operand{0x1000, 2, {256}}}));   // every other column
  CHECK_FALSE(plan::vectorisable(128, 2, {plan::Operand{0x1000, 1, {132}}}));   // row 1 starts 8 bytes off
  CHECK_FALSE(plan::vectorisable(128, 2, {ok, plan::Operand{0x1008, 1, {}}}));  // any operand decides
}

TEST_CASE("fused_attn plan: lead dims collapse only when they walk as one index") {
  const int64_t sizes[] = {2, 9, 5};
  const int64_t contiguous[] = {45 * 7, 5 * 7, 7};
  CHECK(plan::collapse(sizes, contiguous, 3) == int64_t{7});
  const int64_t padded[] = {15 * 11 * 7, 11 * 7, 7};  // a window: row 9 of dim 1 is not row 0 of the next
  CHECK_FALSE(plan::collapse(sizes, padded, 3).has_value());
  const int64_t ones[] = {1, 9, 1};
  const int64_t odd[] = {12345, 3, 777};  // size-1 dims never constrain
  CHECK(plan::collapse(ones, odd, 3) == int64_t{3});
  const int64_t empty[] = {2, 0, 5};
  CHECK(plan::collapse(empty, padded, 3) == int64_t{0});
  CHECK(plan::collapse(sizes, contiguous, 0) == int64_t{0});  // no lead dims: one token
}

TEST_CASE("fused_attn views: conformance layouts on CPU tensors") {
  const at::Tensor x = at::zeros({2, 9, 5, 130}, at::kBFloat16);
  auto v = view3(x);
  REQUIRE(v);
  CHECK(v->st == 5 * 130);
  CHECK(v->sh == 130);
  CHECK(v->si == 1);
  CHECK_FALSE(plan::vectorisable(130, 2, {operand(*v, x)}));  // D = 130: scalar path

  const at::Tensor nc = every_other_column(at::zeros({17, 3, 64}, at::kBFloat16));
  auto w = view3(nc);
  REQUIRE(w);
  CHECK(w->si == 2);
  CHECK(w->sh == 128);
  CHECK(w->st == 3 * 128);
  CHECK_FALSE(plan::vectorisable(64, 2, {operand(*w, nc)}));

  const at::Tensor out = padded_window({2, 9, 5, 128}, at::kBFloat16);
  CHECK_FALSE(view3(out).has_value());  // written through a contiguous buffer, then copied
  const at::Tensor out1 = padded_window({17, 3, 64}, at::kBFloat16);
  auto o = view3(out1);  // one lead dim always collapses
  REQUIRE(o);
  CHECK(o->sh == 70);
  CHECK(o->st == 9 * 70);
  // 70 is not a multiple of 8: the window's rows are not 16-byte aligned, the vector path is refused.
  CHECK_FALSE(plan::vectorisable(64, 2, {operand(*o, out1)}));

  // One head: its stride does not matter (an odd one does not force the scalar path).
  const at::Tensor q = at::zeros({4 * 128 + 8}, at::kHalf).as_strided({4, 1, 128}, {128, 3, 1});
  auto qv = view3(q);
  REQUIRE(qv);
  CHECK(qv->sh == 3);
  CHECK(operand(*qv, q).row_strides == std::vector<int64_t>{128});

  const at::Tensor rows = at::zeros({4, 6, 2048}, at::kFloat).slice(-1, 0, 1024);  // gate half of gate_up
  auto r = view2(rows);
  REQUIRE(r);
  CHECK(r->ld == 2048);
  CHECK(plan::vectorisable(1024, 4, {operand(*r, rows)}) ==
        (reinterpret_cast<std::uintptr_t>(rows.data_ptr()) % 16 == 0));
  const at::Tensor t = at::zeros({8, 3}, at::kLong).select(1, 2);
  auto t1 = view1(t);
  REQUIRE(t1);
  CHECK(t1->s == 3);
  CHECK_FALSE(view2(padded_window({4, 6, 32}, at::kFloat)).has_value());
}

TEST_CASE("fused_attn plan: norm_rope registers and shared memory cover every admitted row") {
  for (int vec : {8, 4, 1})
    for (int64_t D = 2; D <= plan::kMaxHeadDim; ++D) {
      if (vec > 1 && D % vec != 0) continue;  // the vector path needs whole vectors
      for (int64_t H : {1, 2, 3, 5, 8, 16, 17, 32, 64}) {
        const plan::NormRopeShape s = plan::norm_rope_shape(D, H, vec);
        const int64_t chunks = (D + vec - 1) / vec;
        CAPTURE(D);
        CAPTURE(vec);
        CHECK((chunks + s.lanes - 1) / s.lanes <= plan::norm_rope_chunk_cap(s.lanes, vec));
        CHECK(s.lanes * s.rows_in_parallel == plan::kNormRopeThreads);
        CHECK(s.tokens_per_iteration >= 1);
        CHECK(s.tokens_per_iteration <= 16);
        CHECK(plan::norm_rope_smem_bytes(s.tokens_per_iteration, D, s.rows_in_parallel, D) <= 48 * 1024);
      }
    }
  // The headline shape: q [1, 4096, 32, 128] bf16 — a half-warp per row, one token per block pass.
  const plan::NormRopeShape q = plan::norm_rope_shape(128, 32, 8);
  CHECK(q.lanes == 16);
  CHECK(q.tokens_per_iteration == 1);
  CHECK(plan::norm_rope_shape(128, 8, 8).tokens_per_iteration == 2);  // k with 8 kv heads
  CHECK(plan::norm_rope_shape(256, 8, 8).lanes == 32);
}

TEST_CASE("fused_attn plan: norm_rope's heads-major path takes exactly what its kernels assume") {
  // Its lanes hold one 16-byte vector each, a group fits a warp, the partner is whole vectors away and the
  // backward's block sum has room for 128 columns of 256 / lanes groups.
  for (int vec : {8, 4, 1})
    for (bool vectorised : {true, false})
      for (int64_t D = 2; D <= plan::kMaxHeadDim; D += 2)
        for (int64_t R = 2; R <= D; R += 2) {
          const int lanes = plan::norm_rope_group_lanes(D, R, vec, vectorised);
          CAPTURE(D);
          CAPTURE(R);
          CAPTURE(vec);
          if (lanes == 0) continue;
          CHECK(vectorised);
          CHECK(vec == 8);
          CHECK(lanes * vec == D);
          CHECK(D <= 128);
          CHECK(32 % lanes == 0);
          CHECK((R / 2) % vec == 0);
        }
  CHECK(plan::norm_rope_group_lanes(128, 128, 8, true) == 16);  // Qwen3's q/k
  CHECK(plan::norm_rope_group_lanes(64, 64, 8, true) == 8);     // the MoE bench model
  CHECK(plan::norm_rope_group_lanes(128, 64, 8, true) == 16);   // partial rotary
  CHECK(plan::norm_rope_group_lanes(128, 72, 8, true) == 0);    // R/2 not whole vectors
  CHECK(plan::norm_rope_group_lanes(256, 256, 8, true) == 0);   // gemma's 256: the general path
  CHECK(plan::norm_rope_items(4096, 32) == 4096 * 4);
  CHECK(plan::norm_rope_items(3, 9) == 6);
}

TEST_CASE("fused_attn plan: rms_norm blocks hold every row up to H = 16384") {
  for (int vec : {8, 4, 1})
    for (int64_t H = 1; H <= plan::kMaxHidden; H += (H < 600 ? 1 : 97)) {
      if (vec > 1 && H % vec != 0) continue;
      const plan::RowShape s = plan::rms_norm_shape(H, vec, plan::rms_norm_chunk_cap(vec));
      CAPTURE(H);
      CAPTURE(vec);
      CHECK(s.threads % 32 == 0);
      CHECK(s.threads <= plan::rms_norm_max_threads(vec));
      CHECK(s.chunks <= plan::rms_norm_chunk_cap(vec));
      CHECK(static_cast<int64_t>(s.threads) * s.chunks * vec >= H);
    }
  const plan::RowShape big = plan::rms_norm_shape(plan::kMaxHidden, 8, plan::rms_norm_chunk_cap(8));
  CHECK(big.threads == 512);
  CHECK(big.chunks == 4);
}

TEST_CASE("fused_attn plan: grids and tiles") {
  CHECK(plan::reduction_blocks(131072, 1, 132, 8) == 1056);
  CHECK(plan::reduction_blocks(10, 1, 132, 8) == 10);
  CHECK(plan::reduction_blocks(0, 1, 132, 8) == 1);  // never an empty grid
  CHECK(plan::row_blocks(4096, 16) == 256);
  CHECK(plan::row_blocks(int64_t{1} << 40, 1) == plan::kReduceRowsMax);
  for (int64_t v : {1, 2, 3, 31, 32, 100, 256, 1536, 100000}) {
    const plan::Tile t = plan::swiglu_tile(v);
    CHECK(t.bx * t.by == 256);
    CHECK((t.bx & (t.bx - 1)) == 0);
    CHECK(t.bx >= std::min<int64_t>(v, 256));
  }
}

TEST_CASE("fused_attn plan: linear_ce chunks stay within the logits budget") {
  const int64_t budget = int64_t{256} << 20;
  const int64_t tc = plan::linear_ce_chunk_rows(4096, 151936, 2, budget);
  CHECK(tc == 832);
  CHECK(tc * 151936 * 2 <= budget);
  CHECK(plan::linear_ce_chunk_rows(100, 151936, 2, budget) == 100);   // all tokens in one chunk
  CHECK(plan::linear_ce_chunk_rows(4096, 1 << 24, 4, budget) == 64);  // never below 64 rows
  CHECK(plan::linear_ce_chunk_rows(0, 1000, 2, budget) == 0);
  for (int64_t V : {1000, 32000, 128256, 151936, 262144})
    for (int eb : {2, 4}) {
      const int64_t rows = plan::linear_ce_chunk_rows(1 << 20, V, eb, budget);
      CHECK(rows % 64 == 0);
      CHECK((rows == 64 || rows * V * eb <= budget));
    }
}

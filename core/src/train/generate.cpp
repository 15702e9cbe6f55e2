#include "train/generate.hpp"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace ax::train {
namespace {

Batch packed_row(const std::vector<std::vector<int32_t>*>& seqs, at::Device device) {
  std::vector<int64_t> ids, pos;
  std::vector<int32_t> cu{0};
  int64_t max_len = 0;
  for (const auto* s : seqs) {
    for (std::size_t k = 0; k < s->size(); ++k) {
      ids.push_back((*s)[k]);
      pos.push_back(static_cast<int64_t>(k));
    }
    cu.push_back(static_cast<int32_t>(ids.size()));
    max_len = std::max<int64_t>(max_len, static_cast<int64_t>(s->size()));
  }
  const int64_t S = static_cast<int64_t>(ids.size());
  Batch b;  // built on the host, so Batch::to records what the forward validates without a device sync
  b.input_ids = at::tensor(ids, at::kLong).view({1, S});
  b.position_ids = at::tensor(pos, at::kLong).view({1, S});
  b.labels = at::full({1, S}, -100, at::kLong);
  b.cu_seqlens = at::tensor(cu, at::kInt);
  b.max_seqlen = max_len;
  return b.to(device);
}

}  // namespace

std::vector<std::vector<int32_t>> generate_greedy(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                                  const std::vector<int64_t>& max_new, int32_t eos, at::Device device,
                                                  int64_t token_budget) {
  at::NoGradGuard no_grad;
  std::vector<std::vector<int32_t>> seqs = prompts, out(prompts.size());
  std::size_t begin = 0;
  while (begin < prompts.size()) {
    // A group whose final length (prompt + answer) fits the budget; at least one sequence.
    std::size_t end = begin;
    int64_t total = 0;
    while (end < prompts.size()) {
      int64_t len = static_cast<int64_t>(prompts[end].size()) + max_new[end];
      if (end > begin && total + len > token_budget) break;
      total += len;
      ++end;
    }
    std::vector<std::size_t> active;
    for (std::size_t i = begin; i < end; ++i)
      if (max_new[i] > 0) active.push_back(i);
    while (!active.empty()) {
      std::vector<std::vector<int32_t>*> ptrs;
      for (auto i : active) ptrs.push_back(&seqs[i]);
      Batch b = packed_row(ptrs, device);
      at::Tensor logits = model.forward(b, /*want_logits=*/true).logits;  // [1, S, V]
      std::vector<int64_t> last;
      int64_t at_token = 0;
      for (auto i : active) last.push_back((at_token += static_cast<int64_t>(seqs[i].size())) - 1);
      at::Tensor next = logits[0].index_select(0, at::tensor(last, at::kLong).to(logits.device())).argmax(-1).to(at::kCPU);
      std::vector<std::size_t> still;
      for (std::size_t k = 0; k < active.size(); ++k) {
        auto i = active[k];
        int32_t tok = static_cast<int32_t>(next[k].item<int64_t>());
        seqs[i].push_back(tok);
        out[i].push_back(tok);
        if (tok != eos && static_cast<int64_t>(out[i].size()) < max_new[i]) still.push_back(i);
      }
      active = std::move(still);
    }
    begin = end;
  }
  return out;
}

}  // namespace ax::train

#include "train/sampling.hpp"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::train {

void check_sampling(const SamplingOptions& o) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    throw UsageError(str("temperature must be a finite number >= 0 (0 = greedy), got ", o.temperature));
  if (!(o.top_p > 0 && o.top_p <= 1)) throw UsageError(str("top_p must be in (0, 1], got ", o.top_p));
  if (o.top_k < 0) throw UsageError(str("top_k must be >= 0 (0 = off), got ", o.top_k));
}

int64_t sample_token(const at::Tensor& logits, const SamplingOptions& o, at::Generator& gen) {
  if (o.temperature <= 0) return logits.argmax().item<int64_t>();
  const double inf = std::numeric_limits<double>::infinity();
  at::Tensor l = logits.to(at::kFloat) / o.temperature;
  const int64_t V = l.size(0);
  if (o.top_k > 0 && o.top_k < V) {
    // transformers' TopKLogitsWarper: everything below the k-th largest value goes (ties with it stay).
    at::Tensor kth = std::get<0>(at::topk(l, o.top_k)).select(0, o.top_k - 1);
    l = l.masked_fill(l < kth, -inf);
  }
  if (o.top_p < 1) {
    // The smallest set of most likely tokens whose probability reaches top_p: a token stays when the mass
    // before it (in descending order; stable, so equal logits keep index order) is still below top_p. The
    // most likely one always stays, so a tiny top_p is greedy.
    auto [sorted, idx] = at::sort(l, /*stable=*/true, /*dim=*/0, /*descending=*/true);
    at::Tensor p = at::softmax(sorted, 0);
    at::Tensor before = at::cumsum(p, 0) - p;
    at::Tensor drop = before >= o.top_p;
    drop.index_put_({0}, false);
    l = l.index_put({idx.masked_select(drop)}, at::scalar_tensor(-inf, l.options()));
  }
  at::Tensor probs = at::softmax(l, 0);
  return at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
}

}  // namespace ax::train

// The vision-language families' decode (models/vl_decode.hpp).
#include "models/vl_decode.hpp"

#include <map>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::models {
namespace {

// The text decoder's cache and each row's multimodal RoPE delta (0 for a row without images).
class VlKvCache final : public KvCache {
 public:
  VlKvCache(const VlDecode* owner, std::unique_ptr<KvCache> inner)
      : owner(owner), inner(std::move(inner)), delta(static_cast<std::size_t>(this->inner->batch()), 0) {}
  int64_t batch() const override { return inner->batch(); }
  int64_t capacity() const override { return inner->capacity(); }
  int64_t length(int64_t row) const override { return inner->length(row); }
  // The tokens kept keep their positions; a row emptied forgets its images' delta.
  void truncate(int64_t row, int64_t length) override {
    inner->truncate(row, length);
    if (length == 0) delta[static_cast<std::size_t>(row)] = 0;
  }

  const VlDecode* owner;
  std::unique_ptr<KvCache> inner;
  std::vector<int64_t> delta;
};

}  // namespace

std::unique_ptr<KvCache> VlDecode::new_cache(int64_t batch, int64_t capacity) {
  return std::make_unique<VlKvCache>(this, decode_text().new_cache(batch, capacity));
}

at::Tensor VlDecode::decode(const std::vector<std::vector<int64_t>>& tokens, KvCache& cache) { return decode_images(tokens, {}, cache); }

at::Tensor VlDecode::decode_images(const std::vector<std::vector<int64_t>>& tokens, const std::vector<DecodeImages>& images,
                                   KvCache& kv) {
  at::NoGradGuard no_grad;  // the embeddings and the tower's features too
  auto* cache = dynamic_cast<VlKvCache*>(&kv);
  if (!cache || cache->owner != this) throw UsageError("decode: the KV cache was not made by this model (new_cache)");
  const int64_t B = cache->batch();
  if (static_cast<int64_t>(tokens.size()) != B) throw UsageError(str("decode: ", tokens.size(), " rows of tokens for a cache of ", B));
  if (!images.empty() && images.size() != tokens.size())
    throw UsageError(str("decode: images for ", images.size(), " rows, tokens for ", tokens.size()));
  DecoderModel& text = decode_text();
  const bool mrope = !text.config().mrope_section.empty();
  const int64_t V = text.config().vocab_size;

  // The step's tokens packed row by row (as DecoderModel::decode packs them), their positions, and the images
  // of the rows prefilled now, each extra gathered in row order.
  std::vector<int64_t> ids, cu{0};
  std::vector<at::Tensor> pos;
  std::map<std::string, std::vector<at::Tensor>> parts;
  std::vector<int64_t> new_delta(cache->delta);
  for (int64_t r = 0; r < B; ++r) {
    const auto& t = tokens[r];
    const DecodeImages none;
    const DecodeImages& im = images.empty() ? none : images[r];
    const int64_t n = static_cast<int64_t>(t.size()), start = cache->length(r);
    if (!im.empty() && (n == 0 || start != 0))
      throw UsageError(str("decode: row ", r, ": images come with the row's first tokens (its prefill), but the row ",
                           n == 0 ? "is given no tokens" : str("holds ", start, " tokens already")));
    if (n == 0) continue;
    for (int64_t id : t)
      if (id < 0 || id >= V) throw UsageError(str("decode: token id ", id, " out of [0, ", V, ")"));
    at::Tensor row_ids = at::tensor(t, at::kLong);
    at::Tensor p;
    if (start == 0) {
      try {
        p = prefill_positions(row_ids, im);
      } catch (const UsageError& e) {
        throw UsageError(str("decode: row ", r, ": ", e.what()));
      }
      if (p.defined()) new_delta[r] = p.max().item<int64_t>() + 1 - n;
      else new_delta[r] = 0;
    } else if (mrope) {
      p = (at::arange(start, start + n, at::kLong) + cache->delta[r]).unsqueeze(0).expand({3, n});
    }
    if (mrope) pos.push_back(p);
    for (const auto& [k, v] : im) parts[k].push_back(v);
    ids.insert(ids.end(), t.begin(), t.end());
    cu.push_back(static_cast<int64_t>(ids.size()));
  }
  if (ids.empty()) return at::zeros({B, V}, at::kFloat);

  DecodeImages step_images;
  for (auto& [k, v] : parts) {
    if (v.size() != parts.begin()->second.size())
      throw UsageError(str("decode: the rows' images do not all carry '", k, "' (processed by another processor?)"));
    step_images[k] = at::cat(v, 0);
  }
  at::Tensor ids_host = at::tensor(ids, at::kLong), cu_host = at::tensor(cu, at::kLong);
  DecoderModel::DecodeInputs in = splice_images(ids_host, cu_host, step_images);
  if (mrope) in.rope_pos = at::cat(pos, 1);
  at::Tensor out = text.decode(tokens, *cache->inner, in);
  cache->delta = std::move(new_delta);  // the step ran: its rows' deltas hold from now on
  return out;
}

}  // namespace ax::models

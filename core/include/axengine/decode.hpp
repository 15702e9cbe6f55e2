// Incremental decoding with a KV cache: what `axengine generate` / `chat` and the eval's exact_match ask of a
// model. A family opts in by implementing CausalLmDecode beside Model (class MyModel : public Model, public
// CausalLmDecode); callers find it with dynamic_cast, as check_model finds ModelFamilyCheck. The built-in
// decoder (every family DecoderModel serves) implements it.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ax {

// The keys and values of `batch` independent sequences (rows), each up to `capacity` tokens. Opaque: only
// the model that made it reads it (a model refuses a cache of another type).
class KvCache {
 public:
  virtual ~KvCache() = default;
  virtual int64_t batch() const = 0;
  virtual int64_t capacity() const = 0;
  virtual int64_t length(int64_t row) const = 0;  // tokens row holds
  // Forgets row's tokens from `length` on (0: the row is empty again), e.g. to re-prefill a conversation
  // from where it diverged. UsageError when length is above what the row holds.
  virtual void truncate(int64_t row, int64_t length) = 0;
};

class CausalLmDecode {
 public:
  virtual ~CausalLmDecode() = default;
  // An empty cache for `batch` rows of at most `capacity` tokens each, on the model's device and dtype.
  virtual std::unique_ptr<KvCache> new_cache(int64_t batch, int64_t capacity) = 0;
  // Appends tokens[r] (any count, 0 included) to row r of `cache` (tokens.size() == cache.batch()) and returns
  // fp32 logits [batch, vocab] on the CPU: for each row given tokens, the next-token logits after its last
  // one; zeros for rows given none. The result is the full forward's over each row's whole sequence (the same
  // ops and rounding; no gradient, no dropout). UsageError for an id out of range or a row over capacity.
  virtual at::Tensor decode(const std::vector<std::vector<int64_t>>& tokens, KvCache& cache) = 0;
};

// Images for a vision-language family's decode (qwen2_5_vl, qwen3_vl, gemma3): the model implements it beside
// CausalLmDecode, and callers find it with dynamic_cast. One row's images are the extras the family's chat image
// processor makes of them (axengine/chat_media.hpp, add_extras: pixel_values, image_grid_thw for the Qwen VLs),
// for the placeholder tokens in that row's tokens.
using DecodeImages = std::map<std::string, at::Tensor>;

class ImageDecode {
 public:
  virtual ~ImageDecode() = default;
  // CausalLmDecode::decode with images[r] (empty: none; `images` empty: no row has any) for the placeholders in
  // tokens[r]. A row's images come with its first tokens (its prefill: the row empty before), all of them.
  // UsageError naming the row for images of a row that holds tokens already, or placeholders that do not
  // match its images.
  virtual at::Tensor decode_images(const std::vector<std::vector<int64_t>>& tokens, const std::vector<DecodeImages>& images,
                                   KvCache& cache) = 0;
};

}  // namespace ax

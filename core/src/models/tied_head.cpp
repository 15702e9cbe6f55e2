#include "models/tied_head.hpp"

#include <algorithm>

#include <ATen/ATen.h>

#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "models/family.hpp"

namespace ax::models {

bool stored_head_differs(const HfConfig& cfg, const safetensors::Checkpoint& ckpt, const std::string& embed_key) {
  const std::string head = "lm_head.weight";
  if (!cfg.tie_word_embeddings || !ckpt.has(head) || !ckpt.has(embed_key)) return false;
  const auto& h = ckpt.info(head);
  const auto& e = ckpt.info(embed_key);
  // A packed (bitsandbytes) or reshaped head cannot hold the embeddings' values.
  if (h.shape != e.shape || !at::isFloatingType(h.scalar_type) || !at::isFloatingType(e.scalar_type)) return true;
  const at::Tensor a = ckpt.get(head), b = ckpt.get(embed_key);  // memory-mapped: read, not copied
  if (a.scalar_type() == b.scalar_type()) return !at::equal(a, b);
  // Stored in different dtypes: compared in the wider one, a block of rows at a time (no whole fp32 copy of a
  // 150k-row vocabulary).
  const at::ScalarType common = at::promote_types(a.scalar_type(), b.scalar_type());
  const int64_t rows = a.dim() > 0 ? a.size(0) : 1;
  const int64_t per_row = rows > 0 ? std::max<int64_t>(1, a.numel() / rows) : 1;
  const int64_t block = std::max<int64_t>(1, (int64_t(1) << 22) / per_row);
  for (int64_t r = 0; r < rows; r += block) {
    const int64_t n = std::min(block, rows - r);
    if (!at::equal(a.narrow(0, r, n).to(common), b.narrow(0, r, n).to(common))) return true;
  }
  return false;
}

bool untie_stored_head(HfConfig& cfg, const safetensors::Checkpoint& ckpt) {
  if (!stored_head_differs(cfg, ckpt)) return false;
  cfg.tie_word_embeddings = false;
  log::warn(str(cfg.source, ": tie_word_embeddings is true",
                family_of(cfg).defaults.tie_word_embeddings ? str(" (given, or ", family_of(cfg).config_class, "'s default)") : "",
                ", but ",
                ckpt.file_of("lm_head.weight"), " stores its own 'lm_head.weight', different from "
                "'model.embed_tokens.weight': the stored head is used, untied, as transformers does (set "
                "\"tie_word_embeddings\": false in config.json to say so)"));
  return true;
}

}  // namespace ax::models

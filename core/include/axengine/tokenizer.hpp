// Text <-> token ids. Implementations live in core (HF tokenizer.json); datasets and the trainer only
// see this interface.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ax {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encodes text; special/added tokens written inside the text are recognised.
  virtual std::vector<int32_t> encode(const std::string& text, bool add_special_tokens = false) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when the tokenizer has none
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;
  // Changes whenever the tokenizer's behaviour could: keys prepared-data caches.
  virtual std::string fingerprint() const = 0;
};

}  // namespace ax

// Samples of a prompt (fed to the model, no loss) followed by a completion (trained on), shared by the
// `completion` and `alpaca` types: [BOS] prompt completion [EOS], the prompt and the completion tokenised
// separately, so the mask boundary is exactly where the completion starts.
#pragma once
#include <string>
#include <vector>

#include "axengine/dataset.hpp"
#include "axengine/tokenizer.hpp"
#include "data/jsonl.hpp"

namespace ax::data {

class PromptCompletionDataset final : public Dataset, public RowLines {
 public:
  PromptCompletionDataset(const Tokenizer& tok, bool add_bos, bool add_eos) : tok_(tok), add_bos_(add_bos), add_eos_(add_eos) {}

  std::size_t size() const override { return texts_.size(); }
  std::size_t skipped_rows() const override { return skipped_; }
  const RowSources& row_sources() const override { return sources_; }

  Sample get(std::size_t i) const override {
    return make(tok_, add_bos_, add_eos_, prompts_.empty() ? nullptr : &prompts_[i], texts_[i]);
  }

  // One row's sample (also what a streamed row becomes): `prompt` null = no prompt.
  static Sample make(const Tokenizer& tok, bool add_bos, bool add_eos, const std::string* prompt, const std::string& text) {
    Sample s;
    if (add_bos && tok.bos_id() >= 0) s.input_ids.push_back(tok.bos_id());
    if (prompt) {
      auto p = tok.encode(*prompt);
      s.input_ids.insert(s.input_ids.end(), p.begin(), p.end());
    }
    const std::size_t prompt_len = s.input_ids.size();
    auto t = tok.encode(text);
    s.input_ids.insert(s.input_ids.end(), t.begin(), t.end());
    if (add_eos && tok.eos_id() >= 0) s.input_ids.push_back(tok.eos_id());
    s.labels = s.input_ids;
    for (std::size_t k = 0; k < prompt_len && k < s.labels.size(); ++k) s.labels[k] = -100;
    return s;
  }

  // Filled by the type's open(): prompts_ empty (no prompt) or one per text.
  std::vector<std::string> prompts_, texts_;
  RowSources sources_;
  std::size_t skipped_ = 0;

 private:
  const Tokenizer& tok_;
  bool add_bos_, add_eos_;
};

}  // namespace ax::data

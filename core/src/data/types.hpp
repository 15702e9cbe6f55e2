// Constructors of the built-in dataset types, and their keys for the config reference.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "axengine/config_binder.hpp"
#include "axengine/dataset.hpp"
#include "axengine/registry.hpp"

namespace ax::data {

std::shared_ptr<DatasetType> make_completion_type();
std::shared_ptr<DatasetType> make_pretokenized_type();
std::shared_ptr<DatasetType> make_alpaca_type();
// `registry` (the one the type is registered in) is where it finds a plugin's image processor for rows with
// images (axengine/chat_media.hpp); without one, image rows are refused.
std::shared_ptr<DatasetType> make_chat_template_type(const Registry* registry = nullptr);
void document_completion_keys(TableBinder& t);
void document_pretokenized_keys(TableBinder& t);
void document_chat_template_keys(TableBinder& t);
// `shared`: also add_bos/add_eos, which completion documents for both.
void document_alpaca_keys(TableBinder& t, bool shared);

// Implemented (besides DatasetType) by built-in types whose samples cannot be cut anywhere: chat_template's
// samples with images (never cut inside an image's tokens). Prepare asks it for every sample, cached ones too,
// once data.sequence_len is known; a sample that does not fit is a bad row (on_bad_row).
class SampleFit {
 public:
  virtual ~SampleFit() = default;
  // "" when `s` fits rows of `sequence_len` tokens, else why not.
  virtual std::string unfit(const Sample& s, int64_t sequence_len) const = 0;
};

// The Stanford Alpaca prompt of one row (data/alpaca.cpp): the with-input form, or the no-input form when
// `input` is empty. Exposed for the tests.
std::string alpaca_prompt(const std::string& instruction, const std::string& input);

}  // namespace ax::data

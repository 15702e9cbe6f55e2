// Constructors of the built-in dataset types, and their keys for the config reference.
#pragma once
#include <memory>
#include <string>

#include "axengine/config_binder.hpp"
#include "axengine/dataset.hpp"

namespace ax::data {

std::shared_ptr<DatasetType> make_completion_type();
std::shared_ptr<DatasetType> make_pretokenized_type();
std::shared_ptr<DatasetType> make_alpaca_type();
std::shared_ptr<DatasetType> make_chat_template_type();
void document_completion_keys(TableBinder& t);
void document_pretokenized_keys(TableBinder& t);
void document_chat_template_keys(TableBinder& t);
// `shared`: also add_bos/add_eos, which completion documents for both.
void document_alpaca_keys(TableBinder& t, bool shared);

// The Stanford Alpaca prompt of one row (data/alpaca.cpp): the with-input form, or the no-input form when
// `input` is empty. Exposed for the tests.
std::string alpaca_prompt(const std::string& instruction, const std::string& input);

}  // namespace ax::data

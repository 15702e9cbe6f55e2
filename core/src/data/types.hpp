// Constructors of the built-in dataset types, and their keys for the config reference.
#pragma once
#include <memory>

#include "axengine/config_binder.hpp"
#include "axengine/dataset.hpp"

namespace ax::data {

std::shared_ptr<DatasetType> make_completion_type();
std::shared_ptr<DatasetType> make_pretokenized_type();
void document_completion_keys(TableBinder& t);
void document_pretokenized_keys(TableBinder& t);

}  // namespace ax::data

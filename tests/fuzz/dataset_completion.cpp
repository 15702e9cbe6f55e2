// JSONL rows of the `completion` dataset type ({"text": ...}, {"prompt": ..., "text": ...}), tokenised.
#include "dataset_rows.hpp"

AX_FUZZ_HARNESS(dataset_completion) {
  static const auto type = ax::data::make_completion_type();
  ax::fuzz::open_dataset_rows(*type, data, size, /*completion=*/true);
}

// JSONL rows of the `pretokenized` dataset type ({"input_ids": [...], "labels": [...], "attention_mask": [...]}),
// validated against the tokenizer's vocabulary.
#include "dataset_rows.hpp"

AX_FUZZ_HARNESS(dataset_pretokenized) {
  static const auto type = ax::data::make_pretokenized_type();
  ax::fuzz::open_dataset_rows(*type, data, size, /*completion=*/false);
}

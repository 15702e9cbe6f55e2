// Data files in the formats other than JSONL (data/jsonl.hpp): a JSON array, or Parquet read through
// pyarrow's libparquet and converted to rows by data/parquet.cpp, opened by the `alpaca` or `pretokenized`
// type. libparquet's own decoding is fuzzed upstream (Arrow's parquet-arrow-fuzz target on OSS-Fuzz); what
// this harness aims at is our layer above it: the Arrow -> JSON conversion of whatever schema a file
// declares (nesting, dictionaries, nulls, offsets), and the types' checks of the rows it yields. The seeds
// are real pyarrow files (tests/data/datasets/), so mutations start from valid footers and schemas.
//
// First byte: bit 0 Parquet (else a JSON array), bit 1 the pretokenized type (else alpaca), bit 2 skip bad
// rows. The rest is the file.
#include <tbb/global_control.h>

#include "dataset_rows.hpp"

AX_FUZZ_HARNESS(dataset_files) {
  static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  static const auto alpaca = ax::data::make_alpaca_type();
  static const auto pretokenized = ax::data::make_pretokenized_type();
  if (size == 0) return;
  const std::uint8_t flags = data[0];
  const std::string path = ax::fuzz::scratch() + ((flags & 1) ? "/rows.parquet" : "/rows.json");
  ax::fuzz::write_file(path, {reinterpret_cast<const char*>(data + 1), size - 1});
  const bool pretok = flags & 2;
  toml::table entry{{"type", pretok ? "pretokenized" : "alpaca"}, {"path", path}};
  if (flags & 4) entry.insert("on_bad_row", "skip");
  const ax::Tokenizer& tok = ax::fuzz::dataset_tokenizer();
  ax::DatasetContext ctx{&tok, "fuzz.toml", ax::fuzz::scratch()};
  auto ds = (pretok ? *pretokenized : *alpaca).open(entry, ctx);
  const int64_t vocab = tok.vocab_size();
  for (std::size_t i = 0; i < ds->size(); ++i) {
    ax::Sample s = ds->get(i);
    if (s.input_ids.size() != s.labels.size()) std::abort();
    for (std::size_t k = 0; k < s.input_ids.size(); ++k) {
      if (s.input_ids[k] < 0 || s.input_ids[k] >= vocab) std::abort();
      if (s.labels[k] != -100 && (s.labels[k] < 0 || s.labels[k] >= vocab)) std::abort();
    }
  }
}

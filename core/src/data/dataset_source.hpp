// Where a [[datasets]] entry's rows come from, split by split (docs/datasets.md, "Data files"):
//   - data files: one file, or a glob (JSON Lines, JSON, Parquet, Arrow IPC); one split, "train", as HF datasets'
//     load_dataset(<format>, data_files=...) names it;
//   - a directory datasets' save_to_disk wrote: a Dataset (state.json, dataset_info.json, data-0000i-of-0000N.arrow;
//     one split, "train" or the name its state.json records) or a DatasetDict (dataset_dict.json and one such
//     directory per split);
//   - a directory of the HF datasets cache (what load_dataset prepared: dataset_info.json with its splits and
//     <name>-<split>[-0000i-of-0000N].arrow).
// The layouts are those of datasets 2.x to 5.x (the fixtures are written by 5.2: scripts/goldens/
// make_arrow_fixtures.py); what a newer datasets may add (a state.json key, a feature type) is refused, naming it,
// rather than read in a way that may differ from datasets'.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/jsonl.hpp"

namespace ax::data {

struct SplitSource {
  std::vector<std::string> names;     // the split's name, then what else names it ("train" for a saved Dataset)
  std::vector<DataFile> files;        // in order
  std::vector<std::string> columns;   // save_to_disk's _format_columns: the columns a row has (empty: all)
  int64_t expected_rows = -1;         // the datasets cache's num_examples (-1: not recorded)
};

struct DatasetSource {
  std::string path;
  std::string layout;  // "data files", "a dataset saved by datasets (save_to_disk)", ...
  std::vector<SplitSource> splits;
  bool named = false;  // the splits have names of their own (DatasetDict, the datasets cache): `split` picks one

  const SplitSource* find(const std::string& name) const;
  std::string names() const;  // "train, test"
};

// The source `path` names (a glob: every match). Throws UsageError naming the file and what is wrong: a layout
// file that is not JSON or not of its form, a data file it lists that is missing, a key or feature type of a newer
// datasets, a directory that is none of the above.
DatasetSource open_dataset_source(const std::string& path);

// Whether `path` is a directory (datasets' layouts are the only directories a dataset path may name).
bool is_directory(const std::string& path);

// The regular files under a dataset directory (two levels: a DatasetDict's splits), sorted; what the
// prepared-data cache key covers for it.
std::vector<std::string> dataset_dir_files(const std::string& dir);

}  // namespace ax::data

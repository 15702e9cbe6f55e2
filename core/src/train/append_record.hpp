// Appending one record (a metrics.jsonl line, a TensorBoard event) whole or not at all. A full disk (ENOSPC),
// a quota (EDQUOT), an I/O error or a short write must not leave a torn record behind: the file is cut back to
// its size before the write and the error is thrown, for the trainer to stop the run with a checkpoint.
// Test hook: AXENGINE_TEST_WRITE_FAIL_AT=<writer>.append[@k] (crash_point.hpp) makes the k-th append write half
// the record and then fail with ENOSPC, as a nearly full disk does.
#pragma once
#include <string>
#include <string_view>

#include "axengine/error.hpp"

namespace ax::train {

// A log file could not be written; what() names the file and the error.
struct WriteError : RuntimeError {
  using RuntimeError::RuntimeError;
};

// Appends `bytes` to `path` (created when missing; `truncate`: emptied first) or, failing, leaves it as it was
// and throws WriteError. `writer` names the test hook's point: "<writer>.append".
void append_record(const std::string& path, std::string_view bytes, std::string_view writer, bool truncate = false);

}  // namespace ax::train

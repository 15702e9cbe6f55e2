// The `split` of a [[datasets]] entry, in the syntax and with the semantics of HF datasets' ReadInstruction
// (datasets/arrow_reader.py): "train", "train[:20%]", "train[100:200]", "test[-10%:]",
// "train[:50%](pct1_dropremainder)", "train[:10]+test[:10]". Percent bounds round to the closest row (Python's
// round(): halves to even) unless "(pct1_dropremainder)"; negative bounds count from the end; bounds past
// the end are clamped. Goldens: tests/data/datasets/arrow/ (scripts/goldens/make_arrow_fixtures.py, datasets'
// own ReadInstruction.to_absolute), tests/unit/data_arrow_test.cpp.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ax::data {

struct SplitPart {
  std::string split;                   // "train"
  std::optional<int64_t> from, to;     // as written; none: the start / the end
  bool percent = false;                // the bounds are percents of the split's rows
  bool pct1_dropremainder = false;     // percent rounding: multiples of 1% of the rows (else the closest row)
  std::string text;                    // this part as written, for messages
};

// The parts of `spec`, joined by '+'. Throws UsageError ("split \"train[a:]\": ...") for what datasets refuses:
// a malformed part, a percent bound beyond +-100, a rounding on absolute bounds or other than closest /
// pct1_dropremainder, parts with different roundings.
std::vector<SplitPart> parse_split(const std::string& spec);

// Rows [from, to) of a split of `rows` rows that `part` selects (from >= to: none). Throws UsageError for
// pct1_dropremainder on fewer than 100 rows (datasets refuses: it always selects nothing).
struct RowRange {
  int64_t from = 0, to = 0;
};
RowRange absolute_range(const SplitPart& part, int64_t rows);

}  // namespace ax::data

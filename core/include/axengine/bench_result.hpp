// What a benchmark writes into its result file besides its figures: where, when and how it ran ("device",
// "date", "command"), so that a figure quoted in the docs can be traced to a file that says all three
// (docs/performance.md, "Citing results"; tests/docs/check_result_citations.py checks every bench/results file).
#pragma once
#include <string>

namespace ax {

// Today's date in UTC, "2026-11-29".
std::string utc_date_today();

}  // namespace ax

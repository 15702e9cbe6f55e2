// The quickstart's data (see training.hpp): distinct (a, b) pairs in seeded order; the first eval_rows are
// held out, so exact match measures learned addition, not recall.
#include "axengine/training.hpp"

#include <filesystem>
#include <unordered_set>

#include "axengine/error.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "data/packing.hpp"

namespace ax {

void write_arithmetic_task(const std::string& out_dir, const ArithmeticOptions& o) {
  if (o.digits < 1 || o.digits > 6) throw UsageError(ax::str("make-data: --digits must be 1..6, not ", o.digits));
  int64_t range = 1;
  for (int64_t i = 0; i < o.digits; ++i) range *= 10;
  const int64_t space = range * range;
  if (o.train_rows < 1 || o.eval_rows < 0 || o.train_rows + o.eval_rows > space)
    throw UsageError(ax::str("make-data: ", o.train_rows, " train + ", o.eval_rows, " eval rows do not fit the ", space,
                         " distinct sums of ", o.digits, "-digit numbers"));
  // Distinct (a, b) pairs in seeded order: the first eval_rows are held out, the next train_rows train.
  std::unordered_set<int64_t> seen;
  std::string train, eval;
  uint64_t state = o.seed;
  while (static_cast<int64_t>(seen.size()) < o.train_rows + o.eval_rows) {
    state = data::mix_seed(state, 0xadd);
    int64_t pair = static_cast<int64_t>(state % static_cast<uint64_t>(space));
    if (!seen.insert(pair).second) continue;
    int64_t a = pair / range, b = pair % range;
    std::string row = ax::str("{\"prompt\": \"", a, "+", b, "=\", \"answer\": \"", a + b, "\"}\n");
    (static_cast<int64_t>(seen.size()) <= o.eval_rows ? eval : train) += row;
  }
  std::filesystem::create_directories(out_dir);
  safetensors::write_file_atomic((std::filesystem::path(out_dir) / "train.jsonl").string(), train);
  safetensors::write_file_atomic((std::filesystem::path(out_dir) / "eval.jsonl").string(), eval);
}

}  // namespace ax

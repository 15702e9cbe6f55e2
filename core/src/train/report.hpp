// What a run leaves behind for people: metrics.jsonl (one JSON object per step and per eval) and
// report.html, a self-contained page (inline SVG, no scripts, no network) with the loss and eval curves,
// the learning rate, the gradient norm and the run summary. Both are rewritten at every checkpoint and at the end.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ax::train {

struct MetricsLog {
  std::vector<nlohmann::json> records;  // {"step", "loss", "lr", ...} and {"step", "eval_loss", "exact_match"}

  // Loads <dir>/metrics.jsonl keeping records with step <= up_to_step (a resumed run drops what it will redo).
  // A line that is not a whole JSON record (cut short by a kill, or by a writer that could not cut it back) is
  // skipped.
  void load(const std::string& output_dir, int64_t up_to_step);
  // To memory and to the file; to the file only. A write that fails (a full disk) leaves the file as it was
  // and throws WriteError (append_record.hpp).
  void append(const std::string& output_dir, const nlohmann::json& record);
  void append_to_file(const std::string& output_dir, const nlohmann::json& record) const;
  void rewrite(const std::string& output_dir) const;
};

// `summary`: ordered (label, value) rows shown beside the charts.
std::string render_report_html(const MetricsLog& log, const std::string& title,
                               const std::vector<std::pair<std::string, std::string>>& summary);
void write_report(const std::string& output_dir, const MetricsLog& log, const std::string& title,
                  const std::vector<std::pair<std::string, std::string>>& summary);

}  // namespace ax::train

// Progress: on a terminal, one line redrawn in place (step, bar, loss, lr, tokens/s, ETA); otherwise a log
// line every `log_every` steps (CI logs and files stay readable).
#pragma once
#include <cstdint>
#include <string>

namespace ax::train {

class Progress {
 public:
  Progress(int64_t total_steps, int64_t log_every);
  ~Progress();
  void update(int64_t step, double epoch, double loss, double lr, double tokens_per_s, double eta_s);
  // Prints a message without mangling the bar.
  void message(const std::string& text);
  void finish();

 private:
  int64_t total_, every_;
  bool tty_;
  bool drawn_ = false;
};

std::string format_duration(double seconds);  // "1:02:03", "4:05"
std::string format_rate(double per_s);        // "12.3k"
std::string format_bytes(double bytes);       // "1.2 GiB"

}  // namespace ax::train

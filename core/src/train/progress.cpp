#include "train/progress.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "axengine/log.hpp"
#include "axengine/strings.hpp"

namespace ax::train {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string format_rate(double v) {
  char buf[32];
  if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

Progress::Progress(int64_t total, int64_t every) : total_(total), every_(every), tty_(::isatty(STDERR_FILENO) == 1) {
  if (const char* p = std::getenv("AXENGINE_PROGRESS")) tty_ = std::string(p) == "bar";
}

Progress::~Progress() { finish(); }

void Progress::update(int64_t step, double epoch, double loss, double lr, double tps, double eta) {
  char line[256];
  std::snprintf(line, sizeof line, "step %lld/%lld  epoch %.2f  loss %.4f  lr %.2e  %s tok/s  ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_), epoch, loss, lr, format_rate(tps).c_str(),
                format_duration(eta).c_str());
  if (!tty_) {
    if (step % every_ == 0 || step == total_ || step == 1) log::info(line);
    return;
  }
  const int width = 24;
  int filled = total_ > 0 ? static_cast<int>(width * step / total_) : 0;
  std::string bar(filled, '#');
  bar += std::string(width - filled, '-');
  std::fprintf(stderr, "\r\033[2K[%s] %s", bar.c_str(), line);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::message(const std::string& text) {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[2K");
    std::fflush(stderr);
  }
  log::info(text);
}

void Progress::finish() {
  if (drawn_) {
    std::fprintf(stderr, "\n");
    std::fflush(stderr);
    drawn_ = false;
  }
}

}  // namespace ax::train

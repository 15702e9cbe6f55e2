#include "train/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "train/append_record.hpp"

namespace fs = std::filesystem;

namespace ax::train {
namespace {

std::string metrics_path(const std::string& dir) { return (fs::path(dir) / "metrics.jsonl").string(); }

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double v, int digits = 3) {
  char buf[64];
  double a = std::fabs(v);
  if (a != 0 && (a < 1e-3 || a >= 1e5)) std::snprintf(buf, sizeof buf, "%.*e", std::max(0, digits - 1), v);
  else std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;
  bool dots = false;
};

// "Nice" tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int want) {
  double span = hi - lo;
  if (!(span > 0)) return {lo};
  double raw = span / want, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) { step = m * mag; break; }
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
  return out;
}

std::string chart(const std::string& title, const std::vector<Series>& series, double x_max, bool y_from_zero) {
  const double W = 560, H = 300, L = 64, R = 16, T = 40, B = 40;
  double y_lo = INFINITY, y_hi = -INFINITY;
  for (const auto& s : series)
    for (auto [x, y] : s.points)
      if (std::isfinite(y)) y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 " << W << " " << H << "' class='chart'>"
    << "<rect x='0' y='0' width='" << W << "' height='" << H << "' rx='10' fill='#ffffff'/>"
    << "<text x='" << L << "' y='24' class='ct'>" << esc(title) << "</text>";
  if (!std::isfinite(y_lo)) {
    o << "<text x='" << W / 2 << "' y='" << H / 2 << "' text-anchor='middle' class='muted'>no data yet</text></svg>";
    return o.str();
  }
  if (y_from_zero) y_lo = std::min(0.0, y_lo);
  if (y_hi - y_lo < 1e-12) y_hi = y_lo + (y_lo == 0 ? 1 : std::fabs(y_lo) * 0.1);
  double pad = (y_hi - y_lo) * 0.06;
  if (!y_from_zero || y_lo < 0) y_lo -= pad;
  y_hi += pad;
  x_max = std::max(1.0, x_max);
  auto X = [&](double x) { return L + (W - L - R) * x / x_max; };
  auto Y = [&](double y) { return T + (H - T - B) * (1 - (y - y_lo) / (y_hi - y_lo)); };
  for (double t : ticks(y_lo, y_hi, 5)) {
    o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << Y(t) << "' y2='" << Y(t) << "' class='grid'/>"
      << "<text x='" << L - 8 << "' y='" << Y(t) + 4 << "' text-anchor='end' class='tick'>" << num(t) << "</text>";
  }
  for (double t : ticks(0, x_max, 6))
    o << "<text x='" << X(t) << "' y='" << H - B + 18 << "' text-anchor='middle' class='tick'>" << num(t, 6) << "</text>";
  o << "<text x='" << W - R << "' y='" << H - 6 << "' text-anchor='end' class='muted'>step</text>";
  double lx = W - R;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {  // legend, right-aligned
    lx -= 14 + 7.0 * static_cast<double>(it->name.size());
    o << "<rect x='" << lx << "' y='16' width='10' height='10' rx='2' fill='" << it->color << "'/>"
      << "<text x='" << lx + 14 << "' y='25' class='tick'>" << esc(it->name) << "</text>";
    lx -= 10;
  }
  for (const auto& s : series) {
    if (s.points.empty()) continue;
    o << "<polyline fill='none' stroke='" << s.color << "' stroke-width='2' stroke-linejoin='round' points='";
    for (auto [x, y] : s.points)
      if (std::isfinite(y)) o << X(x) << "," << Y(y) << " ";
    o << "'/>";
    if (s.dots || s.points.size() < 40)
      for (auto [x, y] : s.points)
        if (std::isfinite(y)) o << "<circle cx='" << X(x) << "' cy='" << Y(y) << "' r='3' fill='" << s.color << "'/>";
  }
  o << "</svg>";
  return o.str();
}

// Exponential moving average, so a noisy per-step loss still shows its trend.
std::vector<std::pair<double, double>> smooth(const std::vector<std::pair<double, double>>& p, double alpha) {
  std::vector<std::pair<double, double>> out;
  double m = NAN;
  for (auto [x, y] : p) {
    if (!std::isfinite(y)) continue;
    m = std::isnan(m) ? y : alpha * m + (1 - alpha) * y;
    out.emplace_back(x, m);
  }
  return out;
}

}  // namespace

void MetricsLog::load(const std::string& dir, int64_t up_to_step) {
  records.clear();
  std::ifstream in(metrics_path(dir));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    // A line cut short by a kill, or edited into something else.
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    if (j["step"].get<int64_t>() <= up_to_step) records.push_back(std::move(j));
  }
}

void MetricsLog::append(const std::string& dir, const nlohmann::json& record) {
  records.push_back(record);
  append_to_file(dir, record);
}

void MetricsLog::append_to_file(const std::string& dir, const nlohmann::json& record) const {
  append_record(metrics_path(dir), record.dump() + "\n", "metrics");
}

void MetricsLog::rewrite(const std::string& dir) const {
  std::string text;
  for (const auto& r : records) text += r.dump() + "\n";
  safetensors::write_file_atomic(metrics_path(dir), text, "report");
}

std::string render_report_html(const MetricsLog& log, const std::string& title,
                               const std::vector<std::pair<std::string, std::string>>& summary) {
  Series loss{"train loss", "#9db8e8", {}}, eval{"eval loss", "#e4572e", {}, true}, em{"exact match", "#2a9d63", {}, true},
      lr{"learning rate", "#7b5ea7", {}}, gn{"grad norm", "#d08a1e", {}};
  double x_max = 1;
  // Numbers only: a non-finite eval loss is recorded as null (JSON has no NaN) and is left out of the chart.
  auto number = [](const nlohmann::json& r, const char* key, double& v) {
    auto it = r.find(key);
    if (it == r.end() || !it->is_number()) return false;
    v = it->get<double>();
    return std::isfinite(v);
  };
  for (const auto& r : log.records) {
    double step = 0, v = 0;
    if (!number(r, "step", step)) continue;
    x_max = std::max(x_max, step);
    if (number(r, "loss", v)) loss.points.emplace_back(step, v);
    if (number(r, "lr", v)) lr.points.emplace_back(step, v);
    if (number(r, "grad_norm", v)) gn.points.emplace_back(step, v);
    if (number(r, "eval_loss", v)) eval.points.emplace_back(step, v);
    if (number(r, "exact_match", v)) em.points.emplace_back(step, 100.0 * v);
  }
  Series trend{"train loss (smoothed)", "#1f5fbf", smooth(loss.points, loss.points.size() > 50 ? 0.9 : 0.6)};
  std::ostringstream o;
  o << "<!DOCTYPE html><html><head><meta charset='utf-8'><title>" << esc(title) << "</title><style>"
    << "body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;background:#f3f5f9;color:#1d2433;margin:0;padding:28px}"
    << "h1{font-size:22px;margin:0 0 4px}p.sub{color:#667;margin:0 0 20px;font-size:13px}"
    << ".grid2{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));gap:18px}"
    << ".card{background:#fff;border-radius:10px;box-shadow:0 1px 3px rgba(20,30,60,.12);padding:6px}"
    << "svg.chart{width:100%;height:auto;display:block}svg .ct{font-size:15px;font-weight:600;fill:#1d2433}"
    << "svg .tick{font-size:11px;fill:#556}svg .muted{font-size:11px;fill:#889}svg .grid{stroke:#e6e9f0;stroke-width:1}"
    << "table{border-collapse:collapse;font-size:14px;width:100%}td{padding:7px 12px;border-bottom:1px solid #eef0f5}"
    << "td:first-child{color:#667;white-space:nowrap}td:last-child{font-weight:600;font-variant-numeric:tabular-nums}"
    << "</style></head><body><h1>" << esc(title) << "</h1><p class='sub'>axengine training report</p><div class='grid2'>";
  o << "<div class='card'>" << chart("Loss", {loss, trend, eval}, x_max, false) << "</div>";
  if (!em.points.empty()) o << "<div class='card'>" << chart("Eval exact match (%)", {em}, x_max, true) << "</div>";
  o << "<div class='card'>" << chart("Learning rate", {lr}, x_max, true) << "</div>";
  // The norm before clipping (train.max_grad_norm): spikes show where training went unstable.
  o << "<div class='card'>" << chart("Gradient norm (before clipping)", {gn}, x_max, true) << "</div>";
  o << "<div class='card' style='padding:14px 10px'><table>";
  for (const auto& [k, v] : summary) o << "<tr><td>" << esc(k) << "</td><td>" << esc(v) << "</td></tr>";
  o << "</table></div></div></body></html>\n";
  return o.str();
}

void write_report(const std::string& output_dir, const MetricsLog& log, const std::string& title,
                  const std::vector<std::pair<std::string, std::string>>& summary) {
  safetensors::write_file_atomic((fs::path(output_dir) / "report.html").string(), render_report_html(log, title, summary),
                                 "report");
}

}  // namespace ax::train

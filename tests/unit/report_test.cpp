// report.html (train/report.hpp): the gradient-norm chart plots metrics.jsonl's grad_norm per step.
#include <doctest/doctest.h>

#include <string>

#include "train/report.hpp"

namespace {

// The <svg> chart whose title is `title` ("" when there is none).
std::string chart_of(const std::string& html, const std::string& title) {
  auto t = html.find("class='ct'>" + title + "<");
  if (t == std::string::npos) return "";
  auto begin = html.rfind("<svg", t), end = html.find("</svg>", t);
  return html.substr(begin, end - begin);
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("report: a gradient-norm chart with one point per step that has a grad_norm") {
  ax::train::MetricsLog log;
  log.records = {{{"step", 1}, {"loss", 2.0}, {"grad_norm", 3.5}},
                 {{"step", 2}, {"loss", 1.8}, {"grad_norm", 1.25}},
                 {{"step", 2}, {"eval_loss", 1.9}},
                 {{"step", 3}, {"loss", 1.7}, {"grad_norm", 0.5}}};
  const std::string html = ax::train::render_report_html(log, "t", {});
  const std::string chart = chart_of(html, "Gradient norm (before clipping)");
  REQUIRE(!chart.empty());
  CHECK(count(chart, "<polyline") == 1);
  CHECK(count(chart, "<circle") == 3);
  CHECK(chart.find("no data yet") == std::string::npos);

  ax::train::MetricsLog none;
  none.records = {{{"step", 1}, {"loss", 2.0}}};
  CHECK(chart_of(ax::train::render_report_html(none, "t", {}), "Gradient norm (before clipping)").find("no data yet") !=
        std::string::npos);
}

#include "data/split_spec.hpp"

#include <cctype>
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::data {
namespace {

bool word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

[[noreturn]] void bad(const std::string& spec, const std::string& why) {
  throw UsageError(ax::str("split \"", spec, "\": ", why,
                           " (the syntax of HF datasets: \"train\", \"train[:20%]\", \"train[100:200]\", \"test[-10%:]\", "
                           "\"train[:10]+test[:10]\")"));
}

// A bound as Python's int() reads `-?[\d_]+`: digits, single underscores between them. Saturates far beyond any
// row count (a percent that large is refused, an absolute one clamped).
int64_t bound(const std::string& spec, const std::string& s) {
  std::size_t i = 0;
  const bool neg = !s.empty() && s[0] == '-';
  if (neg) ++i;
  if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i])) || !std::isdigit(static_cast<unsigned char>(s.back())))
    bad(spec, ax::str("'", s, "' is not a number"));
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (s[i + 1] == '_') bad(spec, ax::str("'", s, "' is not a number"));
      continue;
    }
    v = v > (int64_t(1) << 50) ? v : v * 10 + (s[i] - '0');
  }
  return neg ? -v : v;
}

SplitPart parse_part(const std::string& spec, const std::string& text) {
  SplitPart p;
  p.text = text;
  std::size_t i = 0;
  const auto malformed = [&] { bad(spec, ax::str("'", text, "' is not a split name with an optional [from:to] slice")); };
  // \w+(\.\w+)*
  while (true) {
    const std::size_t start = i;
    while (i < text.size() && word(text[i])) ++i;
    if (i == start) malformed();
    if (i < text.size() && text[i] == '.' && i + 1 < text.size() && word(text[i + 1])) {
      ++i;
      continue;
    }
    break;
  }
  p.split = text.substr(0, i);
  bool from_pct = false, to_pct = false;
  if (i < text.size() && text[i] == '[') {
    ++i;
    auto number = [&](bool& pct) -> std::optional<int64_t> {
      const std::size_t start = i;
      if (i < text.size() && text[i] == '-') ++i;
      while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '_')) ++i;
      if (i == start) return std::nullopt;
      const std::string digits = text.substr(start, i - start);
      if (digits == "-") malformed();
      if (i < text.size() && text[i] == '%') pct = true, ++i;
      return bound(spec, digits);
    };
    p.from = number(from_pct);
    if (i >= text.size() || text[i] != ':') malformed();
    ++i;
    p.to = number(to_pct);
    if (i >= text.size() || text[i] != ']') malformed();
    ++i;
  }
  std::optional<std::string> rounding;
  if (i < text.size() && text[i] == '(') {
    const auto close = text.find(')', i + 1);
    if (close == std::string::npos) malformed();
    rounding = text.substr(i + 1, close - i - 1);
    i = close + 1;
  }
  if (i != text.size()) malformed();
  p.percent = from_pct || to_pct;
  if (rounding && *rounding != "closest" && *rounding != "pct1_dropremainder")
    bad(spec, ax::str("rounding '", *rounding, "' is neither closest nor pct1_dropremainder"));
  if (rounding && !p.percent) bad(spec, "a rounding applies to percent slices only");
  p.pct1_dropremainder = rounding && *rounding == "pct1_dropremainder";
  for (const auto& b : {p.from, p.to})
    if (p.percent && b && std::llabs(*b) > 100) bad(spec, "percent slice bounds must be within -100% and 100%");
  return p;
}

}  // namespace

std::vector<SplitPart> parse_split(const std::string& spec) {
  // re.split(r"\s*\+\s*", spec)
  std::vector<SplitPart> parts;
  std::size_t start = 0;
  while (true) {
    std::size_t plus = spec.find('+', start);
    std::size_t end = plus == std::string::npos ? spec.size() : plus;
    std::size_t a = start, b = end;
    if (plus != std::string::npos || start > 0) {  // whitespace next to a '+' belongs to the separator
      if (start > 0)
        while (a < b && std::isspace(static_cast<unsigned char>(spec[a]))) ++a;
      if (plus != std::string::npos)
        while (b > a && std::isspace(static_cast<unsigned char>(spec[b - 1]))) --b;
    }
    parts.push_back(parse_part(spec, spec.substr(a, b - a)));
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  // ReadInstruction.__add__: when the first part is a percent slice, every percent part rounds the same way.
  for (std::size_t k = 1; k < parts.size(); ++k)
    if (parts[0].percent && parts[k].percent && parts[k].pct1_dropremainder != parts[0].pct1_dropremainder)
      bad(spec, "its percent slices use different roundings");
  return parts;
}

RowRange absolute_range(const SplitPart& p, int64_t n) {
  auto pct = [&](int64_t b) -> int64_t {
    if (p.pct1_dropremainder) {
      if (n < 100)
        throw UsageError(ax::str("split \"", p.text, "\": pct1_dropremainder rounding on a split of ", n,
                                 " rows (fewer than 100) always selects nothing"));
      return b * static_cast<int64_t>(std::trunc(static_cast<double>(n) / 100.0));
    }
    // int(round(b * n / 100.0)): the product exactly, divided as a double, rounded half to even (nearbyint in
    // the default rounding mode, which nothing here changes).
    return static_cast<int64_t>(std::nearbyint(static_cast<double>(b * n) / 100.0));
  };
  int64_t from = 0, to = n;
  if (p.from) from = p.percent ? pct(*p.from) : *p.from;
  if (p.to) to = p.percent ? pct(*p.to) : *p.to;
  if (from < 0) from = std::max<int64_t>(n + from, 0);
  if (to < 0) to = std::max<int64_t>(n + to, 0);
  return {std::min(from, n), std::min(to, n)};
}

}  // namespace ax::data

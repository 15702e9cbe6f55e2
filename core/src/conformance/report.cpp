// The suite's two outputs: a readable summary and JUnit XML (what CI systems display).
#include <cstdio>
#include <map>
#include <ostream>
#include <tuple>

#include "axengine/conformance.hpp"
#include "axengine/strings.hpp"

namespace ax::conformance {
namespace {

using Key = std::tuple<std::string, std::string, std::string>;  // op, backend, device

std::map<Key, std::vector<const CaseResult*>> by_target(const Report& r) {
  std::map<Key, std::vector<const CaseResult*>> groups;
  for (const auto& c : r.cases) groups[{c.op, c.backend, c.device}].push_back(&c);
  return groups;
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (unsigned char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default:
        // XML 1.0 allows no control characters besides tab and newlines.
        if (ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') o += '?';
        else o += static_cast<char>(ch);
    }
  }
  return o;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", s);
  return buf;
}

}  // namespace

void print_summary(const Report& report, std::ostream& os, bool verbose) {
  for (const auto& [key, cases] : by_target(report)) {
    const auto& [op, backend, device] = key;
    int n[3] = {0, 0, 0};
    double total = 0;
    for (const auto* c : cases) {
      ++n[static_cast<int>(c->status)];
      total += c->seconds;
    }
    os << (n[1] ? "FAIL " : n[0] ? "ok   " : "skip ") << op << " / " << backend << " (" << cases.front()->plugin << ") on " << device
       << ": " << n[0] << " passed, " << n[1] << " failed, " << n[2] << " skipped (" << seconds(total) << " s)\n";
    for (const auto* c : cases)
      if (c->status == Status::fail || (verbose && c->status == Status::skip))
        os << "    " << to_string(c->status) << "  " << c->name << "\n          " << c->message << "\n";
      else if (c->status == Status::skip && c->name.ends_with("/device"))
        os << "    skipped: " << c->message << "\n";
  }
  os << "conformance: " << report.count(Status::pass) << " passed, " << report.count(Status::fail) << " failed, "
     << report.count(Status::skip) << " skipped\n";
}

void write_junit(const Report& report, std::ostream& os) {
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  os << "<testsuites name=\"axengine conformance\" tests=\"" << report.cases.size() << "\" failures=\""
     << report.count(Status::fail) << "\" skipped=\"" << report.count(Status::skip) << "\">\n";
  for (const auto& [key, cases] : by_target(report)) {
    const auto& [op, backend, device] = key;
    int fails = 0, skips = 0;
    double total = 0;
    for (const auto* c : cases) {
      fails += c->status == Status::fail;
      skips += c->status == Status::skip;
      total += c->seconds;
    }
    const std::string suite = ax::str(op, ".", backend, ".", device);
    os << "  <testsuite name=\"" << xml_escape(suite) << "\" tests=\"" << cases.size() << "\" failures=\"" << fails
       << "\" skipped=\"" << skips << "\" time=\"" << seconds(total) << "\">\n";
    os << "    <properties><property name=\"plugin\" value=\"" << xml_escape(cases.front()->plugin) << "\"/></properties>\n";
    for (const auto* c : cases) {
      os << "    <testcase classname=\"" << xml_escape(suite) << "\" name=\"" << xml_escape(c->name) << "\" time=\""
         << seconds(c->seconds) << "\"";
      if (c->status == Status::pass) {
        os << "/>\n";
        continue;
      }
      os << ">\n";
      if (c->status == Status::fail)
        os << "      <failure message=\"" << xml_escape(c->message) << "\"/>\n";
      else
        os << "      <skipped message=\"" << xml_escape(c->message) << "\"/>\n";
      os << "    </testcase>\n";
    }
    os << "  </testsuite>\n";
  }
  os << "</testsuites>\n";
}

}  // namespace ax::conformance

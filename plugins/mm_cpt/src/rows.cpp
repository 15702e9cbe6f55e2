#include "rows.hpp"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/strings.hpp"

namespace ax::mm {

std::string Rows::where(const Row& r) const {
  const auto& f = files.at(r.file);
  return f.array ? ax::str(f.path, ": element ", r.index) : ax::str(f.path, ":", r.index);
}

std::vector<std::string> expand_paths(const std::string& path) {
  if (path.find_first_of("*?[") == std::string::npos) return {path};
  glob_t g{};
  const int rc = ::glob(path.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i)
      if (std::filesystem::is_regular_file(g.gl_pathv[i])) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (out.empty()) throw UsageError(ax::str(path, ": the pattern matches no file"));
  std::sort(out.begin(), out.end());
  return out;
}

void parse_rows(const std::string& text, std::uint32_t file_index, const std::string& name, Rows& out) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    nlohmann::json all = nlohmann::json::parse(text, nullptr, false);
    if (all.is_discarded() || !all.is_array()) throw UsageError(ax::str(name, ": not a valid JSON array"));
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (!all[i].is_object()) throw UsageError(ax::str(name, ": element ", i, ": not a JSON object"));
      out.rows.push_back(Row{file_index, i, std::move(all[i])});
    }
    return;
  }
  std::istringstream in(text);
  std::string line;
  std::uint64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json v = nlohmann::json::parse(line, nullptr, false);
    if (v.is_discarded() || !v.is_object()) throw UsageError(ax::str(name, ":", n, ": not a JSON object"));
    out.rows.push_back(Row{file_index, n, std::move(v)});
  }
}

Rows read_rows(const std::string& path) {
  Rows out;
  for (const auto& p : expand_paths(path)) {
    const std::string text = read_regular_file(p, "data file");  // a FIFO is refused unopened, not waited on
    const auto first = text.find_first_not_of(" \t\r\n");
    out.files.push_back(RowFile{p, first != std::string::npos && text[first] == '['});
    parse_rows(text, static_cast<std::uint32_t>(out.files.size() - 1), p, out);
  }
  return out;
}

}  // namespace ax::mm

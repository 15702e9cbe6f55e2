#include "data/jsonl.hpp"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <istream>

#include <tbb/parallel_for.h>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"

namespace ax::data {

BadRowPolicy parse_bad_row_policy(const std::string& text) {
  if (text == "skip") return BadRowPolicy::skip;
  if (text == "error") return BadRowPolicy::error;
  throw UsageError(ax::str("on_bad_row is \"", text, "\", expected \"error\" or \"skip\""));
}

const char* format_name(FileFormat f) {
  switch (f) {
    case FileFormat::jsonl: return "jsonl";
    case FileFormat::json_array: return "json";
    case FileFormat::parquet: return "parquet";
  }
  return "?";
}

std::string describe_origin(const std::vector<DataFile>& files, RowOrigin o) {
  if (o.file >= files.size()) return ax::str("row ", o.index);
  const DataFile& f = files[o.file];
  switch (f.format) {
    case FileFormat::jsonl: return ax::str(f.path, ":", o.index);
    case FileFormat::json_array: return ax::str(f.path, ": element ", o.index);
    case FileFormat::parquet: return ax::str(f.path, ": row ", o.index);
  }
  return f.path;
}

bool is_glob(const std::string& path) { return path.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> expand_data_path(const std::string& path) {
  if (!is_glob(path)) return {path};
  glob_t g{};
  const int rc = ::glob(path.c_str(), GLOB_NOSORT, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) {
      struct stat st {};
      // Directories and other non-files a pattern like data/* catches are not data; a FIFO named like one is
      // refused later by InputFile, never opened.
      if (::stat(g.gl_pathv[i], &st) == 0 && S_ISDIR(st.st_mode)) continue;
      out.emplace_back(g.gl_pathv[i]);
    }
  ::globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) throw UsageError(ax::str(path, ": cannot expand the pattern"));
  if (out.empty()) throw UsageError(ax::str(path, ": no file matches this pattern"));
  std::sort(out.begin(), out.end());  // bytewise, whatever the locale
  return out;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Splits a JSONL stream into its non-blank lines and their 1-based numbers.
void read_lines(const std::string& path, std::vector<std::string>& lines, std::vector<std::uint64_t>& numbers) {
  auto stream = open_regular_stream(path, "dataset file");  // a FIFO or device is refused, never read
  std::istream& in = *stream;
  std::string line;
  for (std::uint64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    lines.push_back(std::move(line));
    numbers.push_back(n);
  }
  if (in.bad()) throw UsageError(ax::str(path, ": read error"));
}

// The 1-based line and column of byte `pos` of `text`, for a JSON document's syntax error.
std::string line_column(const std::string& text, std::size_t pos) {
  pos = std::min(pos, text.size());
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < pos; ++i) {
    if (text[i] == '\n') ++line, col = 1;
    else ++col;
  }
  return ax::str("line ", line, ", column ", col);
}

// The elements of a JSON array file.
std::vector<nlohmann::json> read_json_array(const std::string& path) {
  std::string text = read_regular_file(path, "dataset file");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw UsageError(ax::str(path, ": not valid JSON at ", line_column(text, e.byte > 0 ? e.byte - 1 : 0),
                             " (a JSON data file is one array of row objects, or one object per line)"));
  }
  if (!doc.is_array()) throw UsageError(ax::str(path, ": expected a JSON array of row objects"));
  return std::move(doc.get_ref<nlohmann::json::array_t&>());
}

}  // namespace

FileFormat detect_format(const std::string& path) {
  if (ends_with(path, ".parquet")) return FileFormat::parquet;
  InputFile f(path, "dataset file");
  const std::string head = f.read(0, std::min<std::uint64_t>(f.size(), 4096));
  if (head.rfind("PAR1", 0) == 0) return FileFormat::parquet;
  std::size_t i = head.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;  // a UTF-8 byte order mark
  i = head.find_first_not_of(" \t\r\n", i);
  return i != std::string::npos && head[i] == '[' ? FileFormat::json_array : FileFormat::jsonl;
}

JsonlContents read_rows(const std::string& path, BadRowPolicy policy,
                        const std::function<std::string(const nlohmann::json&)>& check) {
  JsonlContents out;
  for (const auto& p : expand_data_path(path)) out.files.push_back({p, detect_format(p)});

  std::size_t total = 0;
  for (std::uint32_t fi = 0; fi < out.files.size(); ++fi) {
    const DataFile& file = out.files[fi];
    // Each row of the file as text (JSONL, parsed below in parallel) or as a value already (JSON, Parquet).
    std::vector<std::string> lines;
    std::vector<std::uint64_t> numbers;
    std::vector<nlohmann::json> values;
    std::string unread;  // a Parquet file's columns left out, named when a row fails its check
    if (file.format == FileFormat::jsonl) {
      read_lines(file.path, lines, numbers);
      values.resize(lines.size());
    } else {
      if (file.format == FileFormat::parquet) {
        auto pq = read_parquet_rows(file.path);
        values = std::move(pq.rows);
        if (!pq.unread.empty())
          unread = ax::str(" (this file's column(s) ", join(pq.unread, ", "), " are of Arrow types axengine does not read)");
      } else {
        values = read_json_array(file.path);
      }
      for (std::size_t i = 0; i < values.size(); ++i) numbers.push_back(i);
    }

    std::vector<std::string> problems(values.size());
    tbb::parallel_for(std::size_t(0), values.size(), [&](std::size_t i) {
      if (file.format == FileFormat::jsonl) {
        values[i] = nlohmann::json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
        lines[i].clear();
        lines[i].shrink_to_fit();
        if (values[i].is_discarded()) {
          problems[i] = "not valid JSON";
          return;
        }
      }
      if (!values[i].is_object()) problems[i] = "expected a JSON object";
      else problems[i] = check(values[i]);
    });

    for (std::size_t i = 0; i < values.size(); ++i) {
      const RowOrigin origin{fi, numbers[i]};
      if (problems[i].empty()) {
        out.rows.push_back({origin, std::move(values[i])});
        continue;
      }
      std::string where = ax::str(describe_origin(out.files, origin), ": ", problems[i], unread);
      if (policy == BadRowPolicy::error)
        throw UsageError(where + " (set on_bad_row = \"skip\" in the [[datasets]] entry to drop such rows)");
      if (out.skipped < 5) log::warn("skipping bad row " + where);
      ++out.skipped;
    }
    total += values.size();
  }
  if (out.skipped) log::warn(ax::str(path, ": skipped ", out.skipped, " bad row(s) of ", total));
  return out;
}

}  // namespace ax::data

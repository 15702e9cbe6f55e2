#include "data/jsonl.hpp"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <istream>
#include <optional>

#include <tbb/parallel_for.h>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "data/arrow_rows.hpp"
#include "data/dataset_source.hpp"
#include "data/split_spec.hpp"

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
    case FileFormat::arrow: return "arrow";
  }
  return "?";
}

std::string describe_origin(const std::vector<DataFile>& files, RowOrigin o) {
  if (o.file >= files.size()) return ax::str("row ", o.index);
  const DataFile& f = files[o.file];
  switch (f.format) {
    case FileFormat::jsonl: return ax::str(f.path, ":", o.index);
    case FileFormat::json_array: return ax::str(f.path, ": element ", o.index);
    case FileFormat::parquet:
    case FileFormat::arrow: return ax::str(f.path, ": row ", o.index);
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
  if (ends_with(path, ".arrow")) return FileFormat::arrow;
  InputFile f(path, "dataset file");
  const std::string head = f.read(0, std::min<std::uint64_t>(f.size(), 4096));
  if (head.rfind("PAR1", 0) == 0) return FileFormat::parquet;
  // The IPC file format's magic, or the stream format's first message (its 0xFFFFFFFF continuation marker).
  if (head.rfind("ARROW1", 0) == 0 || head.rfind(std::string(4, '\xFF'), 0) == 0) return FileFormat::arrow;
  std::size_t i = head.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;  // a UTF-8 byte order mark
  i = head.find_first_not_of(" \t\r\n", i);
  return i != std::string::npos && head[i] == '[' ? FileFormat::json_array : FileFormat::jsonl;
}

ParquetRows read_parquet_rows(const std::string& path) {
  ArrowTable t = ArrowTable::read_parquet(path);
  return {t.rows(0, t.num_rows()), t.unread()};
}

bool parquet_supported() { return arrow_supported(); }

bool needs_arrow(const std::string& path) {
  return ends_with(path, ".parquet") || ends_with(path, ".arrow") || is_directory(path);
}

namespace {

// One file's rows before they are parsed and checked: the lines of a JSONL file, the elements of a JSON array,
// or an Arrow table whose rows are converted only where the split selects them.
struct FileRows {
  std::vector<std::string> lines;
  std::vector<std::uint64_t> numbers;  // each line's 1-based number
  std::vector<nlohmann::json> values;
  std::optional<ArrowTable> table;
  std::string unread;  // a Parquet/Arrow file's columns left out, named when a row fails its check

  int64_t size() const {
    return table ? table->num_rows() : static_cast<int64_t>(lines.empty() ? values.size() : lines.size());
  }
};

FileRows load_file(const DataFile& file) {
  FileRows f;
  switch (file.format) {
    case FileFormat::jsonl: read_lines(file.path, f.lines, f.numbers); break;
    case FileFormat::json_array: f.values = read_json_array(file.path); break;
    case FileFormat::parquet: f.table = ArrowTable::read_parquet(file.path); break;
    case FileFormat::arrow: f.table = ArrowTable::read_ipc(file.path); break;
  }
  if (f.table && !f.table->unread().empty())
    f.unread = ax::str(" (this file's column(s) ", join(f.table->unread(), ", "), " are of Arrow types axengine does not read)");
  return f;
}

// A run of rows [from, to) of one file, in the order the split reads them.
struct Piece {
  std::uint32_t file;
  int64_t from, to;
};

}  // namespace

JsonlContents read_rows(const std::string& path, const std::string& split, BadRowPolicy policy,
                        const std::function<std::string(const nlohmann::json&)>& check) {
  const DatasetSource src = open_dataset_source(path);
  // The split's parts, each a split of the source and a slice of it ("" = the whole of the default split).
  std::vector<SplitPart> parts;
  if (!split.empty()) {
    parts = parse_split(split);
  } else {
    SplitPart all;
    all.split = src.named ? "train" : src.splits.front().names.front();
    all.text = all.split;
    if (src.named && !src.find("train"))
      throw UsageError(ax::str(path, ": ", src.layout, " with the splits ", src.names(), " and no \"train\": set `split` in the "
                               "[[datasets]] entry (e.g. split = \"", src.splits.front().names.front(), "\")"));
    parts.push_back(all);
  }

  JsonlContents out;
  std::vector<FileRows> loaded;
  std::vector<std::vector<std::string>> columns;  // per file: save_to_disk's _format_columns
  std::vector<Piece> pieces;
  for (const SplitPart& part : parts) {
    const SplitSource* s = src.find(part.split);
    if (!s)
      throw UsageError(ax::str(path, ": split \"", part.text, "\": ", src.layout, " has no split \"", part.split, "\" (its split",
                               src.splits.size() > 1 ? "s: " : ": ", src.named ? src.names() : join(src.splits.front().names, " or "), ")"));
    // Every file of the split, loaded once however many parts read it.
    std::vector<std::uint32_t> ids;
    int64_t n = 0;
    for (const DataFile& f : s->files) {
      std::uint32_t id = 0;
      while (id < out.files.size() && out.files[id].path != f.path) ++id;
      if (id == out.files.size()) {
        out.files.push_back(f);
        loaded.push_back(load_file(f));
        columns.push_back(s->columns);
      }
      ids.push_back(id);
      n += loaded[id].size();
    }
    if (s->expected_rows >= 0 && n != s->expected_rows)
      throw UsageError(ax::str(path, ": split \"", part.split, "\" has ", n, " rows in its files but dataset_info.json records ",
                               s->expected_rows, ": the dataset is incomplete or was changed; load or save it again"));
    const RowRange r = absolute_range(part, n);
    if (part.from || part.to) {
      const bool clamped = (!part.percent && ((part.from && *part.from > n) || (part.to && *part.to > n)));
      if (clamped)
        log::warn(ax::str(path, ": split \"", part.text, "\": the split \"", part.split, "\" has ", n, " rows; reading rows ",
                          r.from, " to ", std::max(r.from, r.to), " (bounds past the end stop at it, as in datasets)"));
    }
    int64_t start = 0;
    for (std::uint32_t id : ids) {
      const int64_t size = loaded[id].size();
      const int64_t a = std::max(r.from, start), b = std::min(r.to, start + size);
      if (a < b) pieces.push_back({id, a - start, b - start});
      start += size;
    }
    if (r.from >= r.to && parts.size() == 1)
      throw UsageError(ax::str(path, ": split \"", part.text, "\" selects no row: the split \"", part.split, "\" has ", n,
                               " rows (", src.layout, ")"));
  }
  if (pieces.empty())
    throw UsageError(ax::str(path, ": split \"", split, "\" selects no row (", src.layout, ")"));

  std::size_t total = 0;
  for (const Piece& piece : pieces) {
    FileRows& file = loaded[piece.file];
    const DataFile& df = out.files[piece.file];
    const std::size_t count = static_cast<std::size_t>(piece.to - piece.from);
    // Each row of the piece as text (JSONL, parsed below in parallel) or as a value already.
    std::vector<nlohmann::json> values(count);
    std::vector<std::uint64_t> numbers(count);
    if (file.table) {
      values = file.table->rows(piece.from, piece.to, columns[piece.file]);
      for (std::size_t i = 0; i < count; ++i) numbers[i] = static_cast<std::uint64_t>(piece.from) + i;
    } else if (df.format == FileFormat::json_array) {
      for (std::size_t i = 0; i < count; ++i) {
        numbers[i] = static_cast<std::uint64_t>(piece.from) + i;
        values[i] = file.values[numbers[i]];  // a copy: another part may read the element again
      }
    } else {
      for (std::size_t i = 0; i < count; ++i) numbers[i] = file.numbers[static_cast<std::size_t>(piece.from) + i];
    }

    std::vector<std::string> problems(count);
    const bool jsonl = df.format == FileFormat::jsonl;
    tbb::parallel_for(std::size_t(0), count, [&](std::size_t i) {
      if (jsonl) {
        values[i] = nlohmann::json::parse(file.lines[static_cast<std::size_t>(piece.from) + i], nullptr, /*allow_exceptions=*/false);
        if (values[i].is_discarded()) {
          problems[i] = "not valid JSON";
          return;
        }
      }
      if (!values[i].is_object()) problems[i] = "expected a JSON object";
      else problems[i] = check(values[i]);
    });

    for (std::size_t i = 0; i < count; ++i) {
      const RowOrigin origin{piece.file, numbers[i]};
      if (problems[i].empty()) {
        out.rows.push_back({origin, std::move(values[i])});
        continue;
      }
      std::string where = ax::str(describe_origin(out.files, origin), ": ", problems[i], file.unread);
      if (policy == BadRowPolicy::error)
        throw UsageError(where + " (set on_bad_row = \"skip\" in the [[datasets]] entry to drop such rows)");
      if (out.skipped < 5) log::warn("skipping bad row " + where);
      ++out.skipped;
    }
    total += count;
  }
  if (out.skipped) log::warn(ax::str(path, ": skipped ", out.skipped, " bad row(s) of ", total));
  return out;
}

}  // namespace ax::data

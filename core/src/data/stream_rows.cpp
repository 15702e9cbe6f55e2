// The JSON Lines shard stream behind every streaming dataset type (axengine/stream.hpp). Mechanism, in
// libaxengine.so (core/layers.cmake): plugin types (mm_cpt) stream through it too.
#include "axengine/stream.hpp"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax {

SampleStream::~SampleStream() = default;
StreamingDatasetType::~StreamingDatasetType() = default;

nlohmann::json StreamCursor::to_json() const {
  return {{"pass", pass}, {"shard", shard}, {"offset", offset}, {"line", line}, {"file", file}};
}

StreamCursor StreamCursor::from_json(const nlohmann::json& j, const std::string& what) {
  auto bad = [&](const std::string& why) { return UsageError(ax::str(what, ": the data stream cursor ", why)); };
  if (!j.is_object()) throw bad("is not an object");
  StreamCursor c;
  for (auto [key, out] : {std::pair{"pass", &c.pass}, std::pair{"shard", &c.shard}, std::pair{"offset", &c.offset},
                          std::pair{"line", &c.line}}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned()) throw bad(ax::str("lacks a non-negative integer '", key, "'"));
    *out = it->get<uint64_t>();
  }
  auto f = j.find("file");
  if (f == j.end() || !f->is_string()) throw bad("lacks the string 'file'");
  c.file = f->get<std::string>();
  if (c.line == 0) throw bad("has line 0 (lines count from 1)");
  if (j.size() != 5) throw bad("has unknown fields (it holds pass, shard, offset, line, file)");
  return c;
}

std::vector<std::string> stream_shards(const std::string& path) {
  if (path.find_first_of("*?[") == std::string::npos) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      throw UsageError(ax::str(path, ": no such data file (or not a regular file)"));
    return {path};
  }
  glob_t g{};
  const int rc = ::glob(path.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) {
      struct stat st {};
      if (::stat(g.gl_pathv[i], &st) == 0 && S_ISREG(st.st_mode)) out.emplace_back(g.gl_pathv[i]);  // directories skipped
    }
  globfree(&g);
  if (out.empty()) throw UsageError(ax::str(path, ": the glob matches no data file"));
  std::sort(out.begin(), out.end());  // bytewise: the same shard order on every machine
  return out;
}

namespace {

class JsonlStream final : public SampleStream {
 public:
  JsonlStream(std::vector<std::string> shards, bool skip,
              std::function<Sample(const nlohmann::json&, const std::string&)> convert)
      : shards_(std::move(shards)), skip_(skip), convert_(std::move(convert)) {
    if (shards_.empty()) throw UsageError("a data stream needs at least one shard");
    open_shard(0, 0, 1);
  }

  bool next(Sample& out) override {
    std::string text;
    while (true) {
      if (cur_.shard >= shards_.size()) return false;
      const uint64_t start = cur_.offset, line = cur_.line;
      if (!std::getline(in_, text)) {
        if (in_.bad()) throw UsageError(ax::str(shards_[cur_.shard], ": read error at byte ", start));
        if (cur_.shard + 1 >= shards_.size()) {  // the end of the pass: stay there
          cur_.shard = shards_.size();
          return false;
        }
        open_shard(cur_.shard + 1, 0, 1);
        continue;
      }
      cur_.offset = start + text.size() + (in_.eof() ? 0 : 1);
      cur_.line = line + 1;
      if (!text.empty() && text.back() == '\r') text.pop_back();
      const std::size_t shard = cur_.shard;
      // At a shard's end, on to the next now (or to the end of the pass): the cursor then says the next pass
      // when this was the last row of the last shard.
      if (in_.peek() == std::char_traits<char>::eof()) {
        in_.clear();
        if (shard + 1 < shards_.size()) open_shard(shard + 1, 0, 1);
        else cur_.shard = shards_.size();
      }
      if (text.find_first_not_of(" \t") == std::string::npos) continue;
      origin_ = ax::str(shards_[shard], ":", line);
      try {
        nlohmann::json row = nlohmann::json::parse(text);
        if (!row.is_object()) throw UsageError("the line is not a JSON object");
        out = convert_(row, shards_[shard]);
        return true;
      } catch (const std::exception& e) {
        if (!skip_) throw UsageError(ax::str(origin_, ": ", e.what()));
        ++skipped_;
      }
    }
  }

  StreamCursor cursor() const override {
    StreamCursor c = cur_;
    if (c.shard >= shards_.size()) {  // at the end: the start of the next pass
      c.shard = 0, c.offset = 0, c.line = 1, ++c.pass;
    }
    c.file = shards_[c.shard];
    return c;
  }

  void seek(const StreamCursor& c) override {
    if (c.shard >= shards_.size())
      throw UsageError(ax::str("the data stream was at shard ", c.shard, " (", c.file, ") but only ", shards_.size(),
                               " shard(s) match now: the shards changed since the checkpoint"));
    if (c.file != shards_[c.shard])
      throw UsageError(ax::str("the data stream was at shard ", c.shard, " = ", c.file, " but that shard is ", shards_[c.shard],
                               " now: the shards changed since the checkpoint"));
    open_shard(c.shard, c.offset, c.line);
    cur_.pass = c.pass;
  }

  std::string last_origin() const override { return origin_; }
  std::size_t skipped_rows() const override { return skipped_; }
  const std::vector<std::string>& shards() const override { return shards_; }

 private:
  void open_shard(uint64_t shard, uint64_t offset, uint64_t line) {
    in_ = std::ifstream(shards_[shard], std::ios::binary);
    if (!in_) throw UsageError(ax::str(shards_[shard], ": cannot open the data shard (missing or unreadable)"));
    // A JSON array has no row boundaries to seek to: refused rather than read whole. Detected as map-style data
    // detects it (data/jsonl.cpp: after a UTF-8 byte order mark and whitespace).
    char bom[3] = {};
    if (!in_.read(bom, 3) || std::string(bom, 3) != "\xEF\xBB\xBF") {
      in_.clear();
      in_.seekg(0);
    }
    char c = 0;
    while (in_.get(c) && (c == ' ' || c == '\t' || c == '\n' || c == '\r')) {}
    if (in_ && c == '[')
      throw UsageError(ax::str(shards_[shard], ": a JSON array; streaming reads JSON Lines (one object per line)"));
    in_.clear();
    in_.seekg(0, std::ios::end);
    const auto size = static_cast<uint64_t>(in_.tellg());
    if (offset > size)
      throw UsageError(ax::str(shards_[shard], ": the data stream cursor is at byte ", offset, " but the shard has ", size,
                               " bytes: it changed since the checkpoint"));
    in_.seekg(static_cast<std::streamoff>(offset));
    cur_.shard = shard, cur_.offset = offset, cur_.line = line;
  }

  std::vector<std::string> shards_;
  bool skip_;
  std::function<Sample(const nlohmann::json&, const std::string&)> convert_;
  std::ifstream in_;
  StreamCursor cur_;
  std::string origin_;
  std::size_t skipped_ = 0;
};

}  // namespace

std::unique_ptr<SampleStream> make_jsonl_stream(std::vector<std::string> shards, bool skip_bad_rows,
                                                std::function<Sample(const nlohmann::json&, const std::string&)> convert) {
  return std::make_unique<JsonlStream>(std::move(shards), skip_bad_rows, std::move(convert));
}

}  // namespace ax

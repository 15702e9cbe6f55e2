// Post-processors: the special tokens add_special_tokens puts around a sequence.
#include <optional>

#include "tokenizer/split.hpp"

namespace ax::tok {
namespace {

// The single-sequence template, as a list of items: token ids to insert, or the sequence itself (empty list).
struct TemplateProcessor : PostProcessor {
  std::vector<std::optional<std::vector<int32_t>>> items;  // nullopt = $A
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<int32_t> out;
    for (const auto& item : items) {
      if (item) {
        out.insert(out.end(), item->begin(), item->end());
      } else {
        out.insert(out.end(), ids.begin(), ids.end());
      }
    }
    ids = std::move(out);
  }
  int32_t leading_special() const override {
    return !items.empty() && items.front() && items.front()->size() == 1 ? items.front()->front() : -1;
  }
  int32_t trailing_special() const override {
    return items.size() > 1 && items.back() && items.back()->size() == 1 ? items.back()->front() : -1;
  }
};

// ByteLevel's post-processor only trims offsets, which we do not track.
struct NoOpProcessor : PostProcessor {
  void process(std::vector<int32_t>&, bool) const override {}
};

struct SequenceProcessor : PostProcessor {
  std::vector<std::unique_ptr<PostProcessor>> steps;
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& s : steps) s->process(ids, add_special_tokens);
  }
  int32_t leading_special() const override {
    for (const auto& s : steps)
      if (s->leading_special() >= 0) return s->leading_special();
    return -1;
  }
  int32_t trailing_special() const override {
    for (const auto& s : steps)
      if (s->trailing_special() >= 0) return s->trailing_special();
    return -1;
  }
};

std::unique_ptr<PostProcessor> parse_template(const JsonReader& r, const json& j, const std::string& path) {
  auto out = std::make_unique<TemplateProcessor>();
  const std::string single_path = JsonReader::join(path, "single");
  const json& single = r.array(r.required(j, "single", path), single_path);
  const json& specials = r.object(r.required(j, "special_tokens", path), JsonReader::join(path, "special_tokens"));
  for (std::size_t i = 0; i < single.size(); ++i) {
    const std::string ip = JsonReader::index(single_path, i);
    const json& item = r.object(single[i], ip);
    if (item.contains("Sequence")) {
      const std::string which = r.string(r.required(item["Sequence"], "id", ip + ".Sequence"), ip + ".Sequence.id");
      if (which != "A") r.fail(ip + ".Sequence.id", "must be 'A' in the single-sequence template, got '" + which + "'");
      out->items.emplace_back(std::nullopt);
    } else if (item.contains("SpecialToken")) {
      const std::string name = r.string(item["SpecialToken"], "id", ip + ".SpecialToken");
      auto it = specials.find(name);
      if (it == specials.end())
        r.fail(ip + ".SpecialToken.id", "'" + name + "' is not listed in " + JsonReader::join(path, "special_tokens"));
      const std::string sp = JsonReader::join(path, "special_tokens") + "." + name;
      const json& ids = r.array(r.required(*it, "ids", sp), sp + ".ids");
      std::vector<int32_t> v;
      for (std::size_t k = 0; k < ids.size(); ++k) v.push_back(r.id(ids[k], JsonReader::index(sp + ".ids", k)));
      out->items.emplace_back(std::move(v));
    } else {
      r.fail(ip, "must hold \"Sequence\" or \"SpecialToken\"");
    }
  }
  return out;
}

// Bert / Roberta processors: [cls] $A [sep].
std::unique_ptr<PostProcessor> parse_cls_sep(const JsonReader& r, const json& j, const std::string& path) {
  auto out = std::make_unique<TemplateProcessor>();
  auto token = [&](const char* key) {
    const std::string kp = JsonReader::join(path, key);
    const json& pair = r.array(r.required(j, key, path), kp);
    if (pair.size() != 2) r.fail(kp, "must be [token, id]");
    return std::vector<int32_t>{r.id(pair[1], kp + "[1]")};
  };
  out->items.emplace_back(token("cls"));
  out->items.emplace_back(std::nullopt);
  out->items.emplace_back(token("sep"));
  return out;
}

}  // namespace

std::unique_ptr<PostProcessor> parse_post_processor(const JsonReader& r, const json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = r.type(r.object(j, path), path);
  if (type == "TemplateProcessing") return parse_template(r, j, path);
  if (type == "ByteLevel") return std::make_unique<NoOpProcessor>();
  if (type == "BertProcessing" || type == "RobertaProcessing") return parse_cls_sep(r, j, path);
  if (type == "Sequence") {
    auto p = std::make_unique<SequenceProcessor>();
    const std::string lp = JsonReader::join(path, "processors");
    const json& list = r.array(r.required(j, "processors", path), lp);
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto step = parse_post_processor(r, list[i], JsonReader::index(lp, i));
      if (step) p->steps.push_back(std::move(step));
    }
    return p;
  }
  r.unsupported(path, type);
}

}  // namespace ax::tok

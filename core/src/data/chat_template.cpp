// `chat_template`: rows holding a conversation (a list of messages), rendered with the model's own chat template
// and trained on what the assistant wrote.
//   {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
//                 {"role": "assistant", "content": "4"}]}
// The text is what transformers' apply_chat_template(messages, tokenize=False) renders (same Jinja semantics,
// same variables: special tokens from tokenizer_config.json, tools, template kwargs); the labels keep the tokens
// of assistant turns (docs/datasets.md, "chat_template": {% generation %} spans when the template has them,
// else the content-location rule of data/chat_template.hpp). Rows may hold images (content parts or `<image>`
// placeholders, data/chat_images.hpp) for a model family whose processor a plugin provides (axengine/chat_media.hpp):
// the k-th image marker the template writes becomes the k-th image's tokens, and the sample carries its pixels.
#include "data/chat_template.hpp"

#include <sys/stat.h>

#include <ATen/ATen.h>
#include <tbb/parallel_for.h>

#include <filesystem>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "axengine/chat_media.hpp"
#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/input_file.hpp"
#include "axengine/log.hpp"
#include "axengine/registry.hpp"
#include "axengine/stream.hpp"
#include "axengine/strings.hpp"
#include "axengine/tokenizer.hpp"
#include "data/chat_images.hpp"
#include "data/data_config.hpp"
#include "data/entry.hpp"
#include "data/jsonl.hpp"
#include "data/types.hpp"

namespace ax::data {
namespace {

using jinja::Json;

struct ChatOptions {
  std::string field_messages = "messages";
  std::string message_field_role = "role";
  std::string message_field_content = "content";
  std::string chat_template;  // "" = the model dir's; "tokenizer" = tokenizer_config.json's; else a file
  std::string train_on = "assistant";
  std::string field_tools;
  std::vector<std::string> eot_tokens;  // empty = the defaults plus the tokenizer's EOS
  std::vector<std::pair<std::string, std::string>> roles;
  Json template_kwargs = Json::object();
  // Images (docs/datasets.md, "Images in conversations").
  std::string field_images = "images";
  std::string image_placeholder = "<image>";
  std::string image_base_dir;
  int64_t min_pixels = 0, max_pixels = 0;
};

const std::vector<std::string>& template_roles() {
  static const std::vector<std::string> roles{"system", "user", "assistant", "tool", "developer", "ipython"};
  return roles;
}

Json toml_to_json(const toml::node& n) {
  if (auto* t = n.as_table()) {
    Json out = Json::object();
    for (const auto& [k, v] : *t) out[std::string(k.str())] = toml_to_json(v);
    return out;
  }
  if (auto* a = n.as_array()) {
    Json out = Json::array();
    for (const auto& v : *a) out.push_back(toml_to_json(v));
    return out;
  }
  if (auto v = n.value<bool>(); n.is_boolean()) return *v;
  if (n.is_integer()) return *n.value<int64_t>();
  if (n.is_floating_point()) return *n.value<double>();
  if (n.is_string()) return *n.value<std::string>();
  std::ostringstream os;  // dates and times: their TOML text
  n.visit([&](auto&& v) { os << v; });
  return os.str();
}

void bind_chat(TableBinder& t, ChatOptions& o) {
  t.field("field_messages", o.field_messages, "chat_template: field holding the list of messages");
  t.field("message_field_role", o.message_field_role, "chat_template: key of a message's role (ShareGPT: \"from\")");
  t.field("message_field_content", o.message_field_content, "chat_template: key of a message's content (ShareGPT: \"value\")");
  t.field("chat_template", o.chat_template, "chat_template: a .jinja file (relative to the config), or \"tokenizer\" for tokenizer_config.json's template; default: the model dir's chat_template.jinja, else its chat_template.json, else tokenizer_config.json's");
  t.choice("train_on", o.train_on, {"assistant", "all", "last"}, "chat_template: loss on every assistant turn, on every token, or on the last assistant turn only");
  t.field("field_tools", o.field_tools, "chat_template: field holding the tool definitions given to the template as `tools` (\"\" = none)");
  t.field("eot_tokens", o.eot_tokens, "chat_template: end-of-turn markers an assistant span extends over when one directly follows its content (default: <|im_end|>, <|eot_id|>, <|eom_id|>, <end_of_turn>, </s>, <|end|>, <|return|>, <|endoftext|> and the EOS token)");
  t.field("field_images", o.field_images, "chat_template: field holding a row's image paths (a path or a list) for the image_placeholder markers in its messages (ShareGPT style); images may instead be content parts of the messages");
  t.field("image_placeholder", o.image_placeholder, "chat_template: the marker in a message's text that the next image of field_images replaces");
  t.field("image_base_dir", o.image_base_dir, "chat_template: directory relative image paths resolve against, relative to the config (default: the data file's directory)");
  t.field("min_pixels", o.min_pixels, "chat_template: the image processor's min_pixels (0: the model's preprocessor_config.json)");
  t.field("max_pixels", o.max_pixels, "chat_template: the image processor's max_pixels (0: the model's preprocessor_config.json)");
  TableBinder r = t.sub("roles", "chat_template: role names of the data mapped to the template's, e.g. {human = \"user\", gpt = \"assistant\"} (unlisted roles pass as they are)");
  if (r.table())
    for (const auto& [k, v] : *r.table()) {
      r.accept(std::string(k.str()));
      auto s = v.value<std::string>();
      if (!s || s->empty()) r.fail(&v, ax::str("'roles.", k.str(), "' must be a non-empty string (a template role)"));
      o.roles.emplace_back(std::string(k.str()), *s);
    }
  r.finish();
  TableBinder kw = t.sub("template_kwargs", "chat_template: extra template variables, e.g. {enable_thinking = false} (as apply_chat_template's keyword arguments)");
  if (kw.table())
    for (const auto& [k, v] : *kw.table()) {
      kw.accept(std::string(k.str()));
      o.template_kwargs[std::string(k.str())] = toml_to_json(v);
    }
  kw.finish();
}

constexpr const char* kImageEnd = "image_tokens_end";  // per sample: one past its last image token (prepare's fit check)

}  // namespace

std::vector<Json> chat_template_kwargs(const RunConfig& config) {
  std::vector<Json> out;
  for (const toml::table* entry : dataset_entries(config)) {
    if (entry->get("type") == nullptr || entry->get("type")->value<std::string>() != "chat_template") continue;
    Json kw = Json::object();
    if (const toml::table* t = (*entry)["template_kwargs"].as_table())
      for (const auto& [k, v] : *t) kw[std::string(k.str())] = toml_to_json(v);
    out.push_back(std::move(kw));
  }
  return out;
}

namespace {

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string join_path(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

// tokenizer_config.json's chat_template: a string, or a list of {name, template} of which "default" is used.
std::string config_template(const nlohmann::json& config) {
  auto it = config.find("chat_template");
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array())
    for (const auto& e : *it)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        return e["template"].get<std::string>();
  return "";
}

struct Loaded {
  std::string source, name;
  Json special = Json::object();  // bos_token, eos_token, ... as transformers passes them
};

Loaded load_template(const ChatOptions& o, const DatasetContext& ctx, const TableBinder& t) {
  Loaded out;
  nlohmann::json config;
  const std::string config_path = ctx.model_dir.empty() ? "" : join_path(ctx.model_dir, "tokenizer_config.json");
  if (!config_path.empty() && is_file(config_path)) {
    try {
      config = nlohmann::json::parse(read_regular_file(config_path));
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(ax::str(config_path, ": is not valid JSON (", e.what(), ")"));
    }
    if (config.is_object())
      for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
        auto it = config.find(key);
        if (it == config.end()) continue;
        if (it->is_string()) out.special[key] = it->get<std::string>();
        if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) out.special[key] = (*it)["content"].get<std::string>();
      }
    // transformers also makes a config's named extra special tokens (Gemma 3's boi_token, ...) template variables.
    if (config.is_object())
      if (auto it = config.find("extra_special_tokens"); it != config.end() && it->is_object())
        for (const auto& [k, v] : it->items())
          if (v.is_string()) out.special[k] = v.get<std::string>();
  }
  const toml::node* at = t.table() ? t.table()->get("chat_template") : nullptr;
  if (!o.chat_template.empty() && o.chat_template != "tokenizer") {
    out.name = resolve_against(ctx.base_dir, o.chat_template);
    if (!is_file(out.name)) t.fail(at, ax::str("'chat_template': ", out.name, " is not a file"));
    out.source = read_regular_file(out.name);
    return out;
  }
  std::vector<std::string> looked;
  if (o.chat_template.empty() && !ctx.model_dir.empty()) {
    out.name = join_path(ctx.model_dir, "chat_template.jinja");
    looked.push_back(out.name);
    if (is_file(out.name)) {
      out.source = read_regular_file(out.name);
      return out;
    }
    // A processor's template as older transformers saved it (Qwen2-VL / Qwen2.5-VL repos): {"chat_template": "..."}.
    out.name = join_path(ctx.model_dir, "chat_template.json");
    looked.push_back(out.name);
    if (is_file(out.name)) {
      nlohmann::json j = nlohmann::json::parse(read_regular_file(out.name), nullptr, false);
      if (!j.is_object() || !j.contains("chat_template") || !j["chat_template"].is_string())
        throw UsageError(ax::str(out.name, ": expected a JSON object with a string 'chat_template'"));
      out.source = j["chat_template"].get<std::string>();
      return out;
    }
  }
  if (!config_path.empty()) {
    looked.push_back(config_path + " (key chat_template)");
    if (config.is_object()) out.source = config_template(config);
    out.name = config_path;
    if (!out.source.empty()) return out;
  }
  t.fail(at ? at : nullptr, ax::str("no chat template for 'chat_template' ", o.chat_template.empty() ? "(default)" : "= \"tokenizer\"",
                                    ": looked at ", looked.empty() ? std::string("nothing (no model dir known)") : join(looked, ", "),
                                    "; set chat_template = \"path/to/template.jinja\""));
}

// One conversation as read from its row: the template's messages and tools, and its image files (resolved) in
// template order with the message each sits in.
struct ChatRow {
  Json messages, tools;
  std::vector<std::string> images;
  std::vector<std::size_t> image_message;
};

// Renders a row into its sample: the template, the assistant spans, the image markers expanded, the ids and
// labels. Shared by the prepared dataset and the stream, so both give the same samples.
class ChatRenderer {
 public:
  ChatRenderer(const Tokenizer& tok, jinja::Template tmpl, Json special, Json kwargs, std::vector<std::string> markers,
               TrainOn train_on, std::shared_ptr<const ChatImageProcessor> processor)
      : tok_(tok), tmpl_(std::move(tmpl)), special_(std::move(special)), kwargs_(std::move(kwargs)),
        markers_(std::move(markers)), train_on_(train_on), processor_(std::move(processor)) {}

  // The ids and labels (the image tokens masked, kImageEnd set); the pixels are add_extras'. `where` ("a.jsonl:3")
  // prefixes the template's errors ("" where the caller adds the row's origin).
  Sample tokens(const ChatRow& row, const std::string& where) const {
    const std::string at = where.empty() ? "" : where + ": ";
    Json extra = special_;
    for (const auto& [k, v] : kwargs_.items()) extra[k] = v;
    jinja::RenderResult r;
    try {
      r = tmpl_.render(jinja::chat_context(row.messages, row.tools, false, extra));
    } catch (const jinja::Error& e) {
      throw UsageError(ax::str(at, "the chat template refused the conversation: ", e.what()));
    }
    std::vector<ByteSpan> spans;
    if (tmpl_.has_generation()) {
      spans = r.generation;
    } else {
      try {
        spans = find_assistant_spans(r.text, row.messages, markers_);
      } catch (const std::runtime_error& e) {
        throw UsageError(ax::str(at, e.what(), " (", tmpl_.name(), ")"));
      }
    }
    if (!row.images.empty()) expand_image_markers(*processor_, row.images, row.image_message, r.text, spans);
    std::vector<ByteSpan> offsets;
    Sample s;
    s.input_ids = encode_with_offsets(tok_, r.text, offsets);
    s.labels = chat_labels(s.input_ids, offsets, spans, train_on_);
    if (row.images.empty()) return s;
    const std::vector<int32_t> image_ids = processor_->image_token_ids();
    int64_t end = 0;
    for (std::size_t k = 0; k < s.input_ids.size(); ++k)
      if (std::find(image_ids.begin(), image_ids.end(), s.input_ids[k]) != image_ids.end()) {
        s.labels[k] = -100;  // images are inputs, never targets (train_on = "all" too)
        end = static_cast<int64_t>(k) + 1;
      }
    s.extras[kImageEnd] = at::full({1}, end, at::kLong);
    return s;
  }

  // The row's images decoded and processed into s.extras.
  void add_extras(const ChatRow& row, Sample& s) const {
    if (row.images.empty()) return;
    try {
      processor_->add_extras(row.images, s);
    } catch (const UsageError& e) {
      throw UsageError(ax::str(image_where(row, e.what()), e.what()));
    }
  }

  Sample make(const ChatRow& row, const std::string& where) const {
    Sample s = tokens(row, where);
    add_extras(row, s);
    return s;
  }

 private:
  // "message 2, image 0 (a.png): " for an error naming one of the row's image files, else "".
  static std::string image_where(const ChatRow& row, const std::string& error) {
    for (std::size_t j = 0; j < row.images.size(); ++j)
      if (error.find(row.images[j]) != std::string::npos) return ax::str("message ", row.image_message[j], ", image ", j, ": ");
    return "";
  }

  const Tokenizer& tok_;
  jinja::Template tmpl_;
  Json special_, kwargs_;
  std::vector<std::string> markers_;
  TrainOn train_on_;
  std::shared_ptr<const ChatImageProcessor> processor_;
};

class ChatDataset final : public Dataset, public RowLines {
 public:
  explicit ChatDataset(std::shared_ptr<const ChatRenderer> renderer) : renderer_(std::move(renderer)) {}

  std::size_t size() const override { return rows_.size(); }
  std::size_t skipped_rows() const override { return skipped_; }
  const RowSources& row_sources() const override { return sources_; }

  Sample get(std::size_t i) const override {
    if (built_[i]) return *built_[i];  // a row with images, made (and its images checked) when opened
    return make(i);
  }
  Sample make(std::size_t i) const { return renderer_->make(rows_[i], sources_.where(i)); }

  std::shared_ptr<const ChatRenderer> renderer_;
  std::vector<ChatRow> rows_;
  std::vector<std::optional<Sample>> built_;
  RowSources sources_;
  std::size_t skipped_ = 0;
};

class ChatTemplateType final : public DatasetType, public StreamingDatasetType, public SampleFit {
 public:
  explicit ChatTemplateType(const Registry* registry) : registry_(registry) {}

  std::vector<std::string> known_keys() const override {
    auto keys = common_dataset_keys();
    for (const char* k : {"field_messages", "message_field_role", "message_field_content", "chat_template", "train_on",
                          "field_tools", "eot_tokens", "roles", "template_kwargs", "field_images", "image_placeholder",
                          "image_base_dir", "min_pixels", "max_pixels"})
      keys.push_back(k);
    return keys;
  }

  std::shared_ptr<Dataset> open(const toml::table& entry, const DatasetContext& ctx) const override {
    const Setup setup(entry, ctx, registry_);
    auto contents = read_rows(setup.common.path, setup.common.split, parse_bad_row_policy(setup.common.on_bad_row),
                              [&](const nlohmann::json& v) { return setup.check(v); });
    auto ds = std::make_shared<ChatDataset>(setup.renderer);
    ds->skipped_ = contents.skipped;
    ds->sources_.files = contents.files;
    bool any_image = false;
    for (auto& row : contents.rows) {
      ds->rows_.push_back(setup.row(row.value, contents.files[row.origin.file].path));  // checked above
      any_image |= !ds->rows_.back().images.empty();
      ds->sources_.origins.push_back(row.origin);
    }
    ds->built_.resize(ds->rows_.size());
    if (any_image) build_image_rows(*ds, parse_bad_row_policy(setup.common.on_bad_row));
    return ds;
  }

  // Streaming: each row checked, rendered and tokenised as open() + get() do, as it is read from the JSON Lines
  // shards; a row's images are decoded when the sample is materialised (by the rank that trains it).
  std::unique_ptr<SampleStream> open_stream(const toml::table& entry, const DatasetContext& ctx) const override {
    auto setup = std::make_shared<const Setup>(entry, ctx, registry_);
    return make_jsonl_stream(stream_shards(setup->common.path), parse_bad_row_policy(setup->common.on_bad_row) == BadRowPolicy::skip,
                             [setup](const nlohmann::json& v, const std::string& shard) {
                               if (std::string e = setup->check(v); !e.empty()) throw UsageError(e);
                               auto row = std::make_shared<const ChatRow>(setup->row(v, shard));
                               Sample s = setup->renderer->tokens(*row, "");
                               if (!row->images.empty())
                                 s.materialise = [setup, row](Sample& out) { setup->renderer->add_extras(*row, out); };
                               return s;
                             });
  }

  // Per-sample media (pixel values, image grids: dim 0 counts patches or images) concatenated over the batch's
  // samples in layout order (rows, then offsets: the order of the image tokens in the packed batch), the order
  // the model splices them back in. A sample cut inside its image tokens is refused (prepare dropped those that
  // data.sequence_len cuts; this guards any other cut).
  std::map<std::string, at::Tensor> collate(const BatchLayout& layout) const override {
    std::map<std::string, std::vector<at::Tensor>> parts;
    for (const auto& p : layout.samples) {
      const Sample& s = *p.sample;
      if (auto e = s.extras.find(kImageEnd); e != s.extras.end() && p.length < e->second.item<int64_t>())
        throw UsageError(ax::str("chat_template: a sample of ", s.input_ids.size(), " tokens is cut to ", p.length,
                                 " inside its image tokens; raise data.sequence_len or lower max_pixels"));
      for (const auto& [name, t] : s.extras)
        if (name != kImageEnd) parts[name].push_back(t);
    }
    std::map<std::string, at::Tensor> out;
    for (auto& [name, list] : parts) out[name] = at::cat(list, 0);
    return out;
  }

  std::string unfit(const Sample& s, int64_t sequence_len) const override {
    auto e = s.extras.find(kImageEnd);
    if (e == s.extras.end() || e->second.item<int64_t>() <= sequence_len) return "";
    return ax::str("its image tokens run to token ", e->second.item<int64_t>(), ", past data.sequence_len = ", sequence_len,
                   " (a sample is never cut inside an image): raise sequence_len or lower max_pixels");
  }

 private:
  // Makes the rows with images now, in parallel: a missing or corrupt image is a bad row that on_bad_row
  // decides (skip: dropped and counted) before anything is cached.
  static void build_image_rows(ChatDataset& ds, BadRowPolicy policy) {
    const std::size_t n = ds.rows_.size();
    std::vector<std::string> errors(n);
    tbb::parallel_for(std::size_t(0), n, [&](std::size_t i) {
      if (ds.rows_[i].images.empty()) return;
      try {
        ds.built_[i] = ds.make(i);
      } catch (const std::exception& e) {
        const std::string where = ds.sources_.where(i);
        errors[i] = std::string(e.what()).rfind(where, 0) == 0 ? e.what() : ax::str(where, ": ", e.what());
      }
    });
    std::size_t kept = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!errors[i].empty()) {
        if (policy == BadRowPolicy::error) throw UsageError(errors[i]);
        log::warn(ax::str(errors[i], " (on_bad_row = \"skip\": the row is dropped)"));
        ++ds.skipped_;
        continue;
      }
      if (kept != i) {
        ds.rows_[kept] = std::move(ds.rows_[i]);
        ds.built_[kept] = std::move(ds.built_[i]);
        ds.sources_.origins[kept] = ds.sources_.origins[i];
      }
      ++kept;
    }
    ds.rows_.resize(kept);
    ds.built_.resize(kept);
    ds.sources_.origins.resize(kept);
  }

  // An entry's options, template and image processor, and how a row becomes a ChatRow: what open() and
  // open_stream() share.
  struct Setup {
    CommonEntry common;
    ChatOptions o;
    std::map<std::string, std::string> roles;
    ImageSetup images;
    std::string base_override;  // image_base_dir, resolved ("" = each data file's directory)
    std::shared_ptr<const ChatRenderer> renderer;

    Setup(const toml::table& entry, const DatasetContext& ctx, const Registry* registry) {
      if (!ctx.tokenizer) throw RuntimeError("chat_template dataset opened without a tokenizer");
      TableBinder t(&entry, "datasets", BindContext{ctx.config_file, nullptr});
      common = read_common_entry(t, ctx);
      bind_chat(t, o);
      t.finish();
      for (const char* k : {"field_messages", "message_field_role", "message_field_content", "image_placeholder"})
        if (const auto* v = entry.get(k); v && v->value_or(std::string()).empty()) t.fail(v, ax::str("'", k, "' is empty"));
      for (const char* k : {"min_pixels", "max_pixels"})
        if (const auto* v = entry.get(k); v && v->value_or(int64_t(0)) < 0) t.fail(v, ax::str("'", k, "' must be >= 0"));
      Loaded loaded = load_template(o, ctx, t);
      std::optional<jinja::Template> tmpl;
      try {
        tmpl.emplace(loaded.source, loaded.name);
      } catch (const jinja::Error& e) {
        t.fail(entry.get("chat_template"), ax::str("the chat template does not parse: ", e.what()));
      }
      std::vector<std::string> markers = o.eot_tokens;
      if (markers.empty()) {
        markers = default_end_of_turn_markers();
        if (loaded.special.contains("eos_token")) markers.push_back(loaded.special["eos_token"].get<std::string>());
      }
      roles = std::map<std::string, std::string>(o.roles.begin(), o.roles.end());
      images = find_image_processor(registry, ChatImageOptions{o.min_pixels, o.max_pixels}, ctx);
      base_override = o.image_base_dir.empty() ? "" : resolve_against(ctx.base_dir, o.image_base_dir);
      renderer = std::make_shared<const ChatRenderer>(*ctx.tokenizer, std::move(*tmpl), loaded.special, o.template_kwargs,
                                                      markers, parse_train_on(o.train_on), images.processor);
    }

    std::string map_role(const std::string& r) const {
      auto it = roles.find(r);
      return it == roles.end() ? r : it->second;
    }

    // The row's messages as the template reads them: role and content renamed, every other key passed through
    // (tool_calls, reasoning_content, name, tool_call_id...). An absent content stays absent (a template's
    // `message.content is defined` tells the two apart).
    Json to_messages(const nlohmann::json& row) const {
      Json messages = Json::array();
      for (const auto& m : row[o.field_messages]) {
        Json out = Json::object();
        out["role"] = map_role(m[o.message_field_role].get<std::string>());
        if (auto c = m.find(o.message_field_content); c != m.end()) out["content"] = Json::parse(c->dump());
        for (const auto& [k, v] : m.items())
          if (k != o.message_field_role && k != o.message_field_content) out[k] = Json::parse(v.dump());
        messages.push_back(std::move(out));
      }
      return messages;
    }

    Json images_column(const nlohmann::json& row) const {
      auto it = o.field_images.empty() ? row.end() : row.find(o.field_images);
      return it == row.end() ? Json() : Json::parse(it->dump());
    }

    // "" for a usable row, else what is wrong with it.
    std::string check(const nlohmann::json& v) const {
      auto it = v.find(o.field_messages);
      if (it == v.end()) return ax::str("field '", o.field_messages, "' is missing");
      if (!it->is_array() || it->empty()) return ax::str("field '", o.field_messages, "' must be a non-empty list of messages");
      for (std::size_t k = 0; k < it->size(); ++k) {
        const auto& m = (*it)[k];
        if (!m.is_object()) return ax::str("message ", k, " is not an object");
        auto r = m.find(o.message_field_role);
        if (r == m.end() || !r->is_string()) return ax::str("message ", k, ": '", o.message_field_role, "' is missing or not a string");
        const std::string role = map_role(r->get<std::string>());
        if (std::find(template_roles().begin(), template_roles().end(), role) == template_roles().end())
          return ax::str("message ", k, ": role '", r->get<std::string>(), "' is none of ", join(template_roles(), ", "),
                         " (map it with roles = {", r->get<std::string>(), " = \"...\"})");
        auto c = m.find(o.message_field_content);
        if (c != m.end() && !c->is_string() && !c->is_null() && !c->is_array())
          return ax::str("message ", k, ": '", o.message_field_content, "' must be a string, a list of content parts (or null)");
      }
      if (!o.field_tools.empty())
        if (auto tl = v.find(o.field_tools); tl != v.end() && !tl->is_array() && !tl->is_null())
          return ax::str("field '", o.field_tools, "' must be a list of tool definitions (or null)");
      Json messages = to_messages(v);
      ChatImages found;
      if (std::string why = read_chat_images(messages, images_column(v), o.image_placeholder, found); !why.empty()) return why;
      if (!found.paths.empty() && !images.processor) return ax::str("message ", found.message[0], ": ", images.why);
      return "";
    }

    // A row check() accepted, from `data_file`: relative image paths resolve against image_base_dir, else the
    // data file's directory (as mm_cpt's rows).
    ChatRow row(const nlohmann::json& v, const std::string& data_file) const {
      ChatRow out;
      out.messages = to_messages(v);
      ChatImages found;
      read_chat_images(out.messages, images_column(v), o.image_placeholder, found);
      const std::string base = !base_override.empty() ? base_override : std::filesystem::path(data_file).parent_path().string();
      for (auto& p : found.paths)
        if (!std::filesystem::path(p).is_absolute()) p = (std::filesystem::path(base) / p).lexically_normal().string();
      out.images = std::move(found.paths);
      out.image_message = std::move(found.message);
      if (!o.field_tools.empty())
        if (auto tl = v.find(o.field_tools); tl != v.end()) out.tools = Json::parse(tl->dump());
      return out;
    }
  };

  const Registry* registry_;
};

}  // namespace

std::shared_ptr<DatasetType> make_chat_template_type(const Registry* registry) { return std::make_shared<ChatTemplateType>(registry); }

void document_chat_template_keys(TableBinder& t) {
  ChatOptions o;
  bind_chat(t, o);
}

}  // namespace ax::data

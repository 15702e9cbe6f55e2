// `chat_template`: rows holding a conversation (a list of messages), rendered with the model's own chat template
// and trained on what the assistant wrote.
//   {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
//                 {"role": "assistant", "content": "4"}]}
// The text is what transformers' apply_chat_template(messages, tokenize=False) renders (same Jinja semantics,
// same variables: special tokens from tokenizer_config.json, tools, template kwargs); the labels keep the tokens
// of assistant turns (docs/datasets.md, "chat_template": {% generation %} spans when the template has them,
// else the content-location rule of data/chat_template.hpp).
#include "data/chat_template.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/input_file.hpp"
#include "axengine/strings.hpp"
#include "axengine/tokenizer.hpp"
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
  t.field("chat_template", o.chat_template, "chat_template: a .jinja file (relative to the config), or \"tokenizer\" for tokenizer_config.json's template; default: the model dir's chat_template.jinja, else tokenizer_config.json's");
  t.choice("train_on", o.train_on, {"assistant", "all", "last"}, "chat_template: loss on every assistant turn, on every token, or on the last assistant turn only");
  t.field("field_tools", o.field_tools, "chat_template: field holding the tool definitions given to the template as `tools` (\"\" = none)");
  t.field("eot_tokens", o.eot_tokens, "chat_template: end-of-turn markers an assistant span extends over when one directly follows its content (default: <|im_end|>, <|eot_id|>, <|eom_id|>, <end_of_turn>, </s>, <|end|>, <|return|>, <|endoftext|> and the EOS token)");
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

class ChatDataset final : public Dataset, public RowLines {
 public:
  ChatDataset(const Tokenizer& tok, jinja::Template tmpl, Json special, Json kwargs, std::vector<std::string> markers, TrainOn train_on)
      : tok_(tok), tmpl_(std::move(tmpl)), special_(std::move(special)), kwargs_(std::move(kwargs)),
        markers_(std::move(markers)), train_on_(train_on) {}

  std::size_t size() const override { return messages_.size(); }
  std::size_t skipped_rows() const override { return skipped_; }
  const RowSources& row_sources() const override { return sources_; }

  Sample get(std::size_t i) const override {
    Json extra = special_;
    for (const auto& [k, v] : kwargs_.items()) extra[k] = v;
    jinja::RenderResult r;
    try {
      r = tmpl_.render(jinja::chat_context(messages_[i], tools_[i], false, extra));
    } catch (const jinja::Error& e) {
      throw UsageError(ax::str(sources_.where(i), ": the chat template refused the conversation: ", e.what()));
    }
    std::vector<ByteSpan> spans;
    if (tmpl_.has_generation()) {
      spans = r.generation;
    } else {
      try {
        spans = find_assistant_spans(r.text, messages_[i], markers_);
      } catch (const std::runtime_error& e) {
        throw UsageError(ax::str(sources_.where(i), ": ", e.what(), " (", tmpl_.name(), ")"));
      }
    }
    std::vector<ByteSpan> offsets;
    Sample s;
    s.input_ids = encode_with_offsets(tok_, r.text, offsets);
    s.labels = chat_labels(s.input_ids, offsets, spans, train_on_);
    return s;
  }

  std::vector<Json> messages_, tools_;
  RowSources sources_;
  std::size_t skipped_ = 0;

 private:
  const Tokenizer& tok_;
  jinja::Template tmpl_;
  Json special_, kwargs_;
  std::vector<std::string> markers_;
  TrainOn train_on_;
};

class ChatTemplateType final : public DatasetType {
 public:
  std::vector<std::string> known_keys() const override {
    auto keys = common_dataset_keys();
    for (const char* k : {"field_messages", "message_field_role", "message_field_content", "chat_template", "train_on",
                          "field_tools", "eot_tokens", "roles", "template_kwargs"})
      keys.push_back(k);
    return keys;
  }

  std::shared_ptr<Dataset> open(const toml::table& entry, const DatasetContext& ctx) const override {
    if (!ctx.tokenizer) throw RuntimeError("chat_template dataset opened without a tokenizer");
    TableBinder t(&entry, "datasets", BindContext{ctx.config_file, nullptr});
    CommonEntry common = read_common_entry(t, ctx);
    ChatOptions o;
    bind_chat(t, o);
    t.finish();
    for (const char* k : {"field_messages", "message_field_role", "message_field_content"})
      if (const auto* v = entry.get(k); v && v->value_or(std::string()).empty()) t.fail(v, ax::str("'", k, "' is empty"));
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

    std::map<std::string, std::string> roles(o.roles.begin(), o.roles.end());
    auto map_role = [&](const std::string& r) {
      auto it = roles.find(r);
      return it == roles.end() ? r : it->second;
    };
    auto check = [&](const nlohmann::json& v) -> std::string {
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
        if (c != m.end() && !c->is_string() && !c->is_null())
          return ax::str("message ", k, ": '", o.message_field_content, "' must be a string (or null)");
      }
      if (!o.field_tools.empty())
        if (auto tl = v.find(o.field_tools); tl != v.end() && !tl->is_array() && !tl->is_null())
          return ax::str("field '", o.field_tools, "' must be a list of tool definitions (or null)");
      return "";
    };
    auto contents = read_rows(common.path, common.split, parse_bad_row_policy(common.on_bad_row), check);
    auto ds = std::make_shared<ChatDataset>(*ctx.tokenizer, std::move(*tmpl), loaded.special, o.template_kwargs, markers,
                                            parse_train_on(o.train_on));
    ds->skipped_ = contents.skipped;
    ds->sources_.files = contents.files;
    for (auto& row : contents.rows) {
      Json messages = Json::array();
      for (const auto& m : row.value[o.field_messages]) {
        // Every key passes through (tool_calls, reasoning_content, name, tool_call_id...); role and content are
        // renamed to what templates read.
        Json out = Json::object();
        out["role"] = map_role(m[o.message_field_role].get<std::string>());
        // An absent content stays absent (a template's `message.content is defined` tells the two apart).
        if (auto c = m.find(o.message_field_content); c != m.end()) out["content"] = Json::parse(c->dump());
        for (const auto& [k, v] : m.items())
          if (k != o.message_field_role && k != o.message_field_content) out[k] = Json::parse(v.dump());
        messages.push_back(std::move(out));
      }
      Json tools;
      if (!o.field_tools.empty())
        if (auto tl = row.value.find(o.field_tools); tl != row.value.end()) tools = Json::parse(tl->dump());
      ds->messages_.push_back(std::move(messages));
      ds->tools_.push_back(std::move(tools));
      ds->sources_.origins.push_back(row.origin);
    }
    return ds;
  }
};

}  // namespace

std::shared_ptr<DatasetType> make_chat_template_type() { return std::make_shared<ChatTemplateType>(); }

void document_chat_template_keys(TableBinder& t) {
  ChatOptions o;
  bind_chat(t, o);
}

}  // namespace ax::data

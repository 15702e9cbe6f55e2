#include "train/generate_io.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <filesystem>

#include "axengine/error.hpp"
#include "axengine/generation.hpp"
#include "axengine/input_file.hpp"
#include "axengine/strings.hpp"
#include "data/chat_template.hpp"

namespace ax::train {
namespace fs = std::filesystem;
using jinja::Json;

namespace {

// False when `p` does not exist; anything there but a regular file is refused (a FIFO is never opened).
bool read_text(const fs::path& p, std::string& out) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0 && errno == ENOENT) return false;
  out = read_regular_file(p.string());
  return true;
}

Json read_json(const fs::path& p) {
  std::string text;
  if (!read_text(p, text)) return Json();
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw UsageError(str(p.string(), ": not valid JSON: ", e.what()));
  }
}

}  // namespace

GenerateRequest parse_generate_request(const std::string& line, const std::string& source) {
  Json j;
  try {
    j = Json::parse(line);
  } catch (const Json::exception& e) {
    throw UsageError(str(source, ": not valid JSON: ", e.what()));
  }
  if (!j.is_object()) throw UsageError(str(source, ": a row must be a JSON object with \"prompt\" or \"messages\""));
  GenerateRequest r;
  for (const auto& [k, v] : j.items()) {
    if (k == "prompt") {
      if (!v.is_string()) throw UsageError(str(source, ": \"prompt\" must be a string"));
      r.prompt = v.get<std::string>();
    } else if (k == "messages") {
      if (!v.is_array() || v.empty()) throw UsageError(str(source, ": \"messages\" must be a non-empty array of messages"));
      for (std::size_t i = 0; i < v.size(); ++i) {
        const Json& m = v[i];
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
          throw UsageError(str(source, ": messages[", i, "] must be an object with a string \"role\""));
        // content: a string, or what templates accept besides (null for a tool-call turn, a list of parts).
        if (m.contains("content") && !(m["content"].is_string() || m["content"].is_null() || m["content"].is_array()))
          throw UsageError(str(source, ": messages[", i, "].content must be a string, null or a list of parts"));
      }
      r.messages = v;
      r.is_chat = true;
    } else if (k == "id") {
      r.id = v;
    } else {
      throw UsageError(str(source, ": unknown key \"", k, "\" (a row has \"prompt\" or \"messages\", and optionally \"id\")"));
    }
  }
  if (j.contains("prompt") == j.contains("messages"))
    throw UsageError(str(source, ": a row needs exactly one of \"prompt\" and \"messages\""));
  return r;
}

ChatPrompt ChatPrompt::load(const std::string& model_dir) {
  ChatPrompt p;
  const fs::path dir(model_dir);
  const Json tok_cfg = read_json(dir / "tokenizer_config.json");
  std::string text;
  if (read_text(dir / "chat_template.jinja", text)) {
    p.source_ = (dir / "chat_template.jinja").string();
  } else if (tok_cfg.is_object() && tok_cfg.contains("chat_template")) {
    p.source_ = (dir / "tokenizer_config.json").string() + ": chat_template";
    const Json& t = tok_cfg["chat_template"];
    if (t.is_string()) {
      text = t.get<std::string>();
    } else if (t.is_array()) {
      for (const auto& e : t)
        if (e.is_object() && e.value("name", Json()) == "default" && e.contains("template") && e["template"].is_string())
          text = e["template"].get<std::string>();
      if (text.empty()) throw UsageError(str(p.source_, ": a list of templates without one named \"default\""));
    } else {
      throw UsageError(str(p.source_, ": must be a string or a list of {name, template}"));
    }
  } else {
    throw UsageError(str(model_dir, ": the model has no chat template (chat_template.jinja or tokenizer_config.json's "
                                    "chat_template), which chat and \"messages\" rows need; generate takes raw \"prompt\" rows"));
  }
  try {
    p.template_ = std::make_shared<jinja::Template>(text, p.source_);
  } catch (const jinja::Error& e) {
    throw UsageError(str("chat template: ", e.what()));
  }
  p.special_ = Json::object();
  if (tok_cfg.is_object())
    for (const char* k : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
      if (!tok_cfg.contains(k)) continue;
      const Json& v = tok_cfg[k];  // a string, or an AddedToken dict {"content": ...}
      if (v.is_string()) p.special_[k] = v;
      else if (v.is_object() && v.contains("content") && v["content"].is_string()) p.special_[k] = v["content"];
    }
  return p;
}

void ChatPrompt::set_template_kwargs(const Json& kwargs) {
  if (!kwargs.is_object()) throw UsageError("template kwargs must be a JSON object");
  for (const auto& [k, v] : kwargs.items()) special_[k] = v;
}

std::string ChatPrompt::render(const Json& messages, bool add_generation_prompt, const jinja::RenderOptions& options) const {
  try {
    return template_->render(jinja::chat_context(messages, Json(), add_generation_prompt, special_), options).text;
  } catch (const jinja::Error& e) {
    throw UsageError(str("chat template ", e.raised() ? "refused the conversation: " : "failed: ", e.what()));
  }
}

std::vector<int64_t> model_eos_ids(const std::string& model_dir) {
  std::vector<int64_t> out;
  for (const char* f : {"generation_config.json", "config.json"}) {
    const fs::path p = fs::path(model_dir) / f;
    const Json j = read_json(p);
    if (!j.is_object() || !j.contains("eos_token_id") || j["eos_token_id"].is_null()) continue;
    const Json& e = j["eos_token_id"];
    for (const Json& v : e.is_array() ? e : Json::array({e})) {
      if (!v.is_number_integer()) throw UsageError(str(p.string(), ": eos_token_id must be an integer or a list of integers"));
      out.push_back(v.get<int64_t>());
    }
    return out;
  }
  return out;
}

std::vector<int64_t> chat_end_of_turn_ids(const ChatPrompt& chat, const Tokenizer& tokenizer) {
  static const std::string probe = "axengine end-of-turn probe";
  const Json messages = Json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", probe}}});
  std::string text;
  try {
    text = chat.render(messages, false);
  } catch (const UsageError&) {  // a template that wants another conversation: nothing derived
    return {};
  }
  std::vector<data::ByteSpan> spans;
  try {
    spans = data::find_assistant_spans(text, messages, data::default_end_of_turn_markers());
  } catch (const std::exception&) {  // the template rewrote the reply
    return {};
  }
  if (spans.size() != 1 || spans[0].second - spans[0].first <= probe.size()) return {};
  const std::string marker = text.substr(spans[0].first + probe.size(), spans[0].second - spans[0].first - probe.size());
  const auto ids = tokenizer.encode(marker, false);
  if (ids.size() != 1) return {};
  return {ids[0]};
}

int64_t model_max_positions(const std::string& model_dir) {
  const Json j = read_json(fs::path(model_dir) / "config.json");
  if (!j.is_object()) return 0;
  for (const Json* c : {&j, j.contains("text_config") ? &j["text_config"] : nullptr}) {
    if (!c || !c->is_object()) continue;
    auto it = c->find("max_position_embeddings");
    if (it != c->end() && it->is_number_integer() && it->get<int64_t>() > 0) return it->get<int64_t>();
  }
  return 0;
}

}  // namespace ax::train

namespace ax {

nlohmann::json parse_template_kwargs(const std::vector<std::string>& items) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& item : items) {
    const auto first = item.find_first_not_of(" \t");
    if (first != std::string::npos && item[first] == '{') {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(item);
      } catch (const nlohmann::json::exception& e) {
        throw UsageError(str("--template-kwargs '", item, "': not valid JSON: ", e.what()));
      }
      if (!j.is_object()) throw UsageError(str("--template-kwargs '", item, "': must be a JSON object"));
      for (const auto& [k, v] : j.items()) out[k] = v;
      continue;
    }
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError(str("--template-kwargs '", item, "': expected a JSON object or key=value (e.g. enable_thinking=false)"));
    const std::string value = item.substr(eq + 1);
    nlohmann::json v;
    try {
      v = nlohmann::json::parse(value);
    } catch (const nlohmann::json::exception&) {
      v = value;  // a bare word: the string itself
    }
    out[item.substr(0, eq)] = v;
  }
  return out;
}

}  // namespace ax

// The images of a chat row (data/chat_images.hpp).
#include "data/chat_images.hpp"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/registry.hpp"
#include "axengine/strings.hpp"

namespace ax::data {
namespace {

using jinja::Json;

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// "" or why the path cannot be read; `path` loses a file:// prefix.
std::string local_path(std::string& path) {
  if (starts_with(path, "file://")) path = path.substr(7);
  if (starts_with(path, "http://") || starts_with(path, "https://") || starts_with(path, "data:"))
    return ax::str("'", path.substr(0, 80), "' is a URL: images are read from local files only (a path or file://); download it first");
  if (path.empty()) return "an empty image path";
  return "";
}

// Splits a string content on `placeholder` into text and image parts, taking paths from `column` at `next`.
Json split_placeholders(const std::string& text, const std::string& placeholder, std::size_t& count) {
  Json parts = Json::array();
  std::size_t from = 0;
  for (std::size_t at = text.find(placeholder); at != std::string::npos; at = text.find(placeholder, from)) {
    if (at > from) parts.push_back(Json{{"type", "text"}, {"text", text.substr(from, at - from)}});
    parts.push_back(Json{{"type", "image"}});
    ++count;
    from = at + placeholder.size();
  }
  if (from < text.size()) parts.push_back(Json{{"type", "text"}, {"text", text.substr(from)}});
  return parts;
}

// config.json's model_type in `model_dir` ("" when there is none), for messages: which processor a model reads
// is its family's to say (DatasetContext::image_processor).
std::string config_model_type(const std::string& model_dir) {
  if (model_dir.empty()) return "";
  const std::string config = (std::filesystem::path(model_dir) / "config.json").string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config, ec)) return "";
  const nlohmann::json j = nlohmann::json::parse(read_regular_file(config), nullptr, false);
  return j.is_object() && j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
}

}  // namespace

std::string read_chat_images(Json& messages, const Json& images_column, const std::string& placeholder, ChatImages& out) {
  out = {};
  std::vector<std::string> column;
  const bool has_column = !images_column.is_null();
  if (images_column.is_string()) {
    column.push_back(images_column.get<std::string>());
  } else if (images_column.is_array()) {
    for (const auto& v : images_column) {
      if (!v.is_string()) return "the images column must be a path or a list of paths (embedded image bytes are not read)";
      column.push_back(v.get<std::string>());
    }
  } else if (has_column) {
    return "the images column must be a path or a list of paths (embedded image bytes are not read)";
  }
  std::size_t placeholders = 0, parts_images = 0;
  for (std::size_t k = 0; k < messages.size(); ++k) {
    Json& m = messages[k];
    auto c = m.find("content");
    if (c == m.end()) continue;
    const bool assistant = m.value("role", "") == "assistant";
    if (c->is_string()) {
      if (!has_column || placeholder.empty() || c->get_ref<const std::string&>().find(placeholder) == std::string::npos) continue;
      std::size_t n = 0;
      Json parts = split_placeholders(c->get<std::string>(), placeholder, n);
      if (assistant) return ax::str("message ", k, " (assistant) holds '", placeholder, "': images in assistant turns are not supported (images are inputs)");
      for (auto& p : parts)
        if (p["type"] == "image") {
          if (placeholders < column.size()) p["image"] = column[placeholders];
          out.message.push_back(k);
          ++placeholders;
        }
      *c = std::move(parts);
      continue;
    }
    if (!c->is_array()) continue;  // null: the row checks refuse anything else
    for (std::size_t p = 0; p < c->size(); ++p) {
      Json& part = (*c)[p];
      if (!part.is_object()) return ax::str("message ", k, ", part ", p, ": a content part must be an object");
      auto t = part.find("type");
      if (t == part.end() || !t->is_string()) return ax::str("message ", k, ", part ", p, ": 'type' is missing or not a string");
      const std::string type = t->get<std::string>();
      if (type == "text") {
        auto x = part.find("text");
        if (x == part.end() || !x->is_string()) return ax::str("message ", k, ", part ", p, ": a text part needs 'text' (a string)");
        continue;
      }
      std::string path;
      if (type == "image") {
        for (const char* key : {"image", "url", "path"})  // transformers' order of the keys it reads
          if (auto v = part.find(key); v != part.end()) {
            if (!v->is_string()) return ax::str("message ", k, ", part ", p, ": '", key, "' must be a string (a local path)");
            path = v->get<std::string>();
            break;
          }
        if (path.empty() && part.contains("base64"))
          return ax::str("message ", k, ", part ", p, ": base64 images are not read; give a local path");
        if (path.empty()) return ax::str("message ", k, ", part ", p, ": an image part needs 'image' (a local path)");
      } else if (type == "image_url") {
        auto u = part.find("image_url");
        if (u != part.end() && u->is_object() && u->contains("url") && (*u)["url"].is_string()) path = (*u)["url"].get<std::string>();
        else if (u != part.end() && u->is_string()) path = u->get<std::string>();
        else return ax::str("message ", k, ", part ", p, ": an image_url part needs 'image_url': {\"url\": PATH}");
        part = Json{{"type", "image"}, {"url", path}};  // as transformers normalises it before rendering
      } else {
        return ax::str("message ", k, ", part ", p, ": content type '", type.substr(0, 40), "' is not supported (text, image, image_url)");
      }
      if (assistant) return ax::str("message ", k, " (assistant), part ", p, ": images in assistant turns are not supported (images are inputs)");
      if (std::string why = local_path(path); !why.empty()) return ax::str("message ", k, ", part ", p, ": ", why);
      out.paths.push_back(path);
      out.message.push_back(k);
      ++parts_images;
    }
  }
  if (has_column && parts_images > 0)
    return "the row has image parts and an images column: give its images one way";
  if (has_column) {
    if (placeholders != column.size())
      return ax::str("the messages hold ", placeholders, " '", placeholder, "' placeholder(s) for ", column.size(), " image(s) in the images column");
    for (std::size_t j = 0; j < column.size(); ++j) {
      if (std::string why = local_path(column[j]); !why.empty()) return ax::str("message ", out.message[j], ", image ", j, ": ", why);
      out.paths.push_back(column[j]);
    }
  }
  return "";
}

ImageSetup find_image_processor(const Registry* registry, const ChatImageOptions& options, const DatasetContext& ctx) {
  ImageSetup out;
  const std::string model_type = config_model_type(ctx.model_dir);
  const std::string model = model_type.empty() ? std::string("the model") : ax::str("the model (model_type '", model_type, "')");
  const std::string& kind = ctx.image_processor;
  if (kind.empty()) {
    out.why = model_type.empty() ? std::string("the row holds images but the model's config.json gives no model_type (no model dir known?)")
                                 : ax::str("the row holds images but ", model, " takes no images: its family reads no image processor "
                                           "(the vision-language families do: docs/models.md)");
    return out;
  }
  std::vector<std::string> kinds;
  if (registry)
    for (const Provider* p : registry->list(ProviderKind::dataset)) {
      const auto* support = dynamic_cast<const ChatImageSupport*>(static_cast<const DatasetType*>(p->object.get()));
      if (!support) continue;
      for (auto& k : support->chat_image_processors()) kinds.push_back(k);
      try {
        if ((out.processor = support->chat_image_processor(kind, options, ctx))) return out;
      } catch (const std::exception& e) {
        out.why = ax::str("the row holds images but image processor '", kind, "' of ", model, " cannot start: ", e.what());
        return out;
      }
    }
  out.why = ax::str("the row holds images but no loaded plugin implements image processor '", kind, "', which ", model, " reads: ",
                    kinds.empty() ? std::string("no loaded plugin processes images (the mm_cpt plugin does)")
                                  : ax::str("the loaded plugins implement ", join(kinds, ", ")));
  return out;
}

void expand_image_markers(const ChatImageProcessor& processor, const std::vector<std::string>& files,
                          const std::vector<std::size_t>& image_message, std::string& text,
                          std::vector<std::pair<std::size_t, std::size_t>>& spans) {
  const std::string marker = processor.image_marker();
  std::vector<std::size_t> at;
  for (std::size_t p = text.find(marker); p != std::string::npos; p = text.find(marker, p + marker.size())) at.push_back(p);
  if (at.size() != files.size())
    throw UsageError(ax::str("the chat template wrote ", at.size(), " image marker(s) '", marker, "' for the row's ", files.size(),
                             " image(s) (a template without images, or a message holding the marker itself?)"));
  std::string out;
  std::vector<std::pair<std::size_t, std::ptrdiff_t>> growth;  // (marker position, growth up to and including it)
  std::size_t from = 0;
  std::ptrdiff_t grown = 0;
  for (std::size_t j = 0; j < at.size(); ++j) {
    std::string replacement;
    try {
      replacement = processor.expand(files[j]);
    } catch (const UsageError& e) {
      throw UsageError(ax::str("message ", image_message.at(j), ", image ", j, ": ", e.what()));
    }
    out.append(text, from, at[j] - from);
    out += replacement;
    from = at[j] + marker.size();
    grown += static_cast<std::ptrdiff_t>(replacement.size()) - static_cast<std::ptrdiff_t>(marker.size());
    growth.emplace_back(at[j], grown);
  }
  out.append(text, from, std::string::npos);
  auto shift = [&](std::size_t x) {  // markers before x (starting before it) moved it
    std::ptrdiff_t g = 0;
    for (const auto& [p, total] : growth)
      if (p < x) g = total;
    return static_cast<std::size_t>(static_cast<std::ptrdiff_t>(x) + g);
  };
  for (auto& sp : spans) sp = {shift(sp.first), shift(sp.second)};
  text = std::move(out);
}

std::vector<std::string> content_pieces(const Json& message) {
  auto c = message.find("content");
  if (c == message.end()) return {};
  if (c->is_string()) return {c->get<std::string>()};
  std::vector<std::string> out;
  if (c->is_array())
    for (const auto& p : *c)
      if (p.is_object() && p.value("type", "") == "text" && p.contains("text") && p["text"].is_string()) out.push_back(p["text"].get<std::string>());
  return out;
}

}  // namespace ax::data

// What the assistant wrote in a rendered chat, and the labels that follow from it (data/chat_template.hpp).
#include <algorithm>
#include <stdexcept>

#include "axengine/strings.hpp"
#include "data/chat_images.hpp"
#include "data/chat_template.hpp"

namespace ax::data {

const std::vector<std::string>& default_end_of_turn_markers() {
  // ChatML (Qwen), Llama 3, Gemma, Llama 2 / Mistral, Phi / gpt-oss, gpt-oss's final turn, GPT-2 style.
  static const std::vector<std::string> markers{"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "</s>",
                                                "<|end|>",    "<|return|>", "<|endoftext|>"};
  return markers;
}

namespace {

std::string_view trim_ascii(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const std::size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) + 1 - b);
}

}  // namespace

std::vector<ByteSpan> find_assistant_spans(const std::string& text, const jinja::Json& messages,
                                           const std::vector<std::string>& end_markers) {
  std::vector<ByteSpan> spans;
  std::size_t cursor = 0;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const jinja::Json& m = messages[i];
    const bool assistant = m.value("role", "") == "assistant";
    // A string content is one piece; a list of parts (images in conversations) its text parts, in order: an
    // assistant's span runs from its first piece to its last.
    std::size_t first = std::string::npos;
    for (const std::string& content : content_pieces(m)) {
      std::string_view needle = content;
      std::size_t at = needle.empty() ? std::string::npos : text.find(needle, cursor);
      if (at == std::string::npos) {
        needle = trim_ascii(content);
        at = needle.empty() ? std::string::npos : text.find(needle, cursor);
      }
      if (at == std::string::npos) {
        if (assistant && !needle.empty())
          throw std::runtime_error(ax::str("message ", i, " (assistant): its content is not in the rendered text after message ",
                                           i == 0 ? 0 : i - 1, "; the template rewrites it, so its span cannot be found"));
        continue;
      }
      if (first == std::string::npos) first = at;
      cursor = at + needle.size();
    }
    if (!assistant || first == std::string::npos) continue;
    std::size_t end = cursor, best = 0;
    for (const auto& marker : end_markers)
      if (marker.size() > best && text.compare(end, marker.size(), marker) == 0) best = marker.size();
    end += best;
    spans.emplace_back(first, end);
    cursor = end;
  }
  return spans;
}

TrainOn parse_train_on(const std::string& text) {
  if (text == "assistant") return TrainOn::assistant;
  if (text == "all") return TrainOn::all;
  if (text == "last") return TrainOn::last;
  throw std::invalid_argument("train_on must be assistant, all or last, not '" + text + "'");
}

std::vector<int32_t> chat_labels(const std::vector<int32_t>& ids, const std::vector<ByteSpan>& offsets,
                                 const std::vector<ByteSpan>& spans, TrainOn train_on) {
  if (train_on == TrainOn::all) return ids;
  std::vector<int32_t> labels(ids.size(), -100);
  std::vector<ByteSpan> chosen = spans;
  if (train_on == TrainOn::last && !chosen.empty()) chosen.erase(chosen.begin(), chosen.end() - 1);
  std::erase_if(chosen, [](const ByteSpan& s) { return s.first >= s.second; });
  // Offsets and spans both ascend: one pass. A token overlapping a span (any byte of it inside) is trained on,
  // which is what transformers' char_to_token marking over a span's characters gives.
  std::size_t s = 0;
  for (std::size_t k = 0; k < ids.size() && s < chosen.size(); ++k) {
    const auto [b, e] = offsets[k];
    while (s < chosen.size() && chosen[s].second <= b) ++s;
    if (s < chosen.size() && b < chosen[s].second && e > chosen[s].first) labels[k] = ids[k];
  }
  return labels;
}

}  // namespace ax::data

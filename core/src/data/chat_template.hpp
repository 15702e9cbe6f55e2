// The `chat_template` dataset type's pieces that tests and the fuzz target drive directly: finding what the
// assistant wrote in a rendered conversation, and turning those byte spans into labels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "axengine/config.hpp"
#include "axengine/dataset.hpp"
#include "jinja/jinja.hpp"

namespace ax::data {

using ByteSpan = std::pair<std::size_t, std::size_t>;  // [begin, end) of the rendered text

// The template_kwargs of every chat_template [[datasets]] entry of `config`, in order ({} for an entry without),
// as the dataset renders with them: what a generation prompted like the training data passes too (the run's
// training record keeps them, models/training_record.hpp).
std::vector<jinja::Json> chat_template_kwargs(const RunConfig& config);

// End-of-turn markers a span is extended over when one directly follows an assistant message's content.
const std::vector<std::string>& default_end_of_turn_markers();

// The span rule for templates without {% generation %}: every message's content (a string; the message's
// `content` key, roles already mapped) is looked for in `text` in order, from the end of the previous match,
// as written or else with surrounding ASCII whitespace trimmed (templates often `| trim` it). A message whose
// content is empty or absent is skipped; a non-assistant message that is not found is skipped too (templates
// move or rewrite system prompts); an assistant message that is not found is an error (std::runtime_error
// naming the message index). Each assistant match becomes a span, extended over the longest of `end_markers`
// that starts right where the content ends, so the model learns to end its turn.
std::vector<ByteSpan> find_assistant_spans(const std::string& text, const jinja::Json& messages,
                                           const std::vector<std::string>& end_markers);

enum class TrainOn { assistant, all, last };
TrainOn parse_train_on(const std::string& text);  // "assistant" | "all" | "last"

// labels[i] = ids[i] where token i (bytes offsets[i]) overlaps a span that `train_on` selects (all spans, the
// last span, or everything for `all`), -100 elsewhere.
std::vector<int32_t> chat_labels(const std::vector<int32_t>& ids, const std::vector<ByteSpan>& offsets,
                                 const std::vector<ByteSpan>& spans, TrainOn train_on);

}  // namespace ax::data

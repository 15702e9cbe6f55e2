// The images of one `chat_template` row (docs/datasets.md, "Images in conversations"): OpenAI-style content parts
// ({"type": "image", "image": PATH}, {"type": "image_url", "image_url": {"url": PATH}}, {"type": "text", ...})
// or ShareGPT-style `<image>` placeholders in string contents with an `images` column. The messages are
// rewritten into the parts transformers' processor hands its chat template (image_url parts become
// {"type": "image", "url": ...}, as its _normalize_conversations does; placeholders become image parts), and the
// image paths are listed in the order the template writes them. The fuzz target `dataset_chat_images` drives it.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "axengine/chat_media.hpp"
#include "jinja/jinja.hpp"

namespace ax {
class Registry;
}

namespace ax::data {

struct ChatImages {
  std::vector<std::string> paths;       // as written (a file:// prefix removed), in template order
  std::vector<std::size_t> message;     // the message each image is in
};

// Rewrites `messages` (roles already mapped; each a JSON object whose "content" is a string, a list of parts,
// null or absent) in place and fills `out`. `images_column` is the row's `images` field (null: absent), a path
// or a list of paths for the placeholders. Returns "" or what is wrong, naming the message (and part):
// a malformed part, an unsupported part type, an http(s) or data: URL (only local files are read), an image in
// an assistant turn, placeholders that do not match the images, parts and an images column in one row.
std::string read_chat_images(jinja::Json& messages, const jinja::Json& images_column, const std::string& placeholder,
                             ChatImages& out);

// The texts of a message's content as the span rule looks for them (data/chat_template.hpp): a string content
// is one piece; a list of parts gives its text parts in order.
std::vector<std::string> content_pieces(const jinja::Json& message);

// The model's image processor, of the kind ctx.image_processor names (its family's), found among the registry's
// dataset types (a plugin's, axengine/chat_media.hpp); null with `why` (for the rows that hold images, naming
// config.json's model_type and the kind) when the model takes no images or no loaded plugin implements the kind.
// Used by the chat_template type and by `generate` / `chat` (train/generate_jobs.cpp).
struct ImageSetup {
  std::shared_ptr<const ChatImageProcessor> processor;
  std::string why;
};
ImageSetup find_image_processor(const Registry* registry, const ChatImageOptions& options, const DatasetContext& ctx);

// Replaces the k-th image marker of the rendered `text` with the k-th image's tokens (processor.expand(files[k]),
// as transformers' processor expands the template's image tokens), shifting `spans` (byte ranges of `text`) past
// the growth before them. UsageError when the template wrote another number of markers than there are files, or
// naming "message <image_message[k]>, image k" for an image that cannot be read.
void expand_image_markers(const ChatImageProcessor& processor, const std::vector<std::string>& files,
                          const std::vector<std::size_t>& image_message, std::string& text,
                          std::vector<std::pair<std::size_t, std::size_t>>& spans);

}  // namespace ax::data

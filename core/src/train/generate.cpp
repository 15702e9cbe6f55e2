#include "train/generate.hpp"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::train {
namespace {

// Bytes at the end of `s` that may not be final yet: the longest suffix that is a proper prefix of a stop
// string (it may grow into one), and a trailing U+FFFD (a byte-level decoder's stand-in for a UTF-8
// character whose remaining bytes are still to come).
std::size_t held_back(const std::string& s, const std::vector<std::string>& stop) {
  std::size_t hold = 0;
  for (const auto& st : stop)
    for (std::size_t n = std::min(st.size() - 1, s.size()); n > hold; --n)
      if (s.compare(s.size() - n, n, st, 0, n) == 0) {
        hold = n;
        break;
      }
  static const std::string replacement = "\xEF\xBF\xBD";
  if (s.size() >= replacement.size() && s.compare(s.size() - 3, 3, replacement) == 0) hold = std::max<std::size_t>(hold, 3);
  return hold;
}

struct Row {
  std::size_t prompt = 0;
  int64_t limit = 0;
  at::Generator gen;
  std::size_t streamed = 0;  // bytes of text already streamed
  bool done = false;
};

}  // namespace

CausalLmDecode& decoder_of(Model& model) {
  auto* d = dynamic_cast<CausalLmDecode*>(&model);
  if (!d) throw UsageError("this model family has no KV-cached decode (CausalLmDecode, axengine/decode.hpp): it cannot generate");
  return *d;
}

std::vector<Generation> generate(CausalLmDecode& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& o, const TextStream& stream, const std::vector<int64_t>& max_new,
                                 const std::vector<DecodeImages>& images) {
  check_sampling(o.sampling);
  if (o.max_new_tokens < 0) throw UsageError(str("max_new_tokens must be >= 0, got ", o.max_new_tokens));
  if (o.batch_size < 1) throw UsageError(str("batch size must be >= 1, got ", o.batch_size));
  if (!max_new.empty() && max_new.size() != prompts.size()) throw UsageError("generate: max_new must have one entry per prompt");
  if (!images.empty() && images.size() != prompts.size()) throw UsageError("generate: images must have one entry per prompt");
  ImageDecode* with_images = nullptr;
  if (std::any_of(images.begin(), images.end(), [](const DecodeImages& im) { return !im.empty(); }) &&
      !(with_images = dynamic_cast<ImageDecode*>(&model)))
    throw UsageError("generate: the prompts hold images but this model family takes none (it has no ImageDecode)");
  if (!o.prompt_eos_ids.empty() && o.prompt_eos_ids.size() != prompts.size())
    throw UsageError("generate: prompt_eos_ids must have one entry per prompt");
  for (const auto& s : o.stop)
    if (s.empty()) throw UsageError("a stop string must not be empty");
  if ((!o.stop.empty() || stream) && !o.detokenize) throw UsageError("generate: stop strings and streaming need a detokenizer");
  for (std::size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].empty()) throw UsageError(str("prompt ", i, " is empty: there is nothing to continue"));

  std::vector<Generation> out(prompts.size());
  for (std::size_t begin = 0; begin < prompts.size(); begin += static_cast<std::size_t>(o.batch_size)) {
    const std::size_t end = std::min(prompts.size(), begin + static_cast<std::size_t>(o.batch_size));
    std::vector<Row> rows;
    std::vector<std::vector<int64_t>> feed;
    std::vector<DecodeImages> feed_images;  // the prefill's (with_images only)
    int64_t capacity = 1;
    for (std::size_t i = begin; i < end; ++i) {
      Row r;
      r.prompt = i;
      r.limit = max_new.empty() ? o.max_new_tokens : max_new[i];
      r.gen = at::make_generator<at::CPUGeneratorImpl>(o.sampling.seed + i);
      r.done = r.limit <= 0;
      if (r.done) out[i].finish_reason = "length";
      feed.emplace_back(r.done ? std::vector<int64_t>{} : std::vector<int64_t>(prompts[i].begin(), prompts[i].end()));
      if (with_images) feed_images.push_back(r.done ? DecodeImages{} : images[i]);
      capacity = std::max<int64_t>(capacity, static_cast<int64_t>(prompts[i].size()) + r.limit);
      rows.push_back(std::move(r));
    }
    auto cache = model.new_cache(static_cast<int64_t>(rows.size()), capacity);
    while (std::any_of(rows.begin(), rows.end(), [](const Row& r) { return !r.done; })) {
      // [rows, V] fp32, CPU. The images go with the prefill, the first step.
      at::Tensor logits = feed_images.empty() ? model.decode(feed, *cache) : with_images->decode_images(feed, feed_images, *cache);
      feed_images.clear();
      for (std::size_t k = 0; k < rows.size(); ++k) {
        Row& r = rows[k];
        feed[k].clear();
        if (r.done) continue;
        Generation& g = out[r.prompt];
        const int64_t tok = sample_token(logits[static_cast<int64_t>(k)], o.sampling, r.gen);
        g.tokens.push_back(static_cast<int32_t>(tok));
        auto in = [tok](const std::vector<int64_t>& ids) { return std::find(ids.begin(), ids.end(), tok) != ids.end(); };
        const bool eos = in(o.eos_ids) || (!o.prompt_eos_ids.empty() && in(o.prompt_eos_ids[r.prompt]));
        if (eos) g.finish_reason = "eos";
        if (o.detokenize) {
          std::vector<int32_t> shown(g.tokens.begin(), g.tokens.end() - (eos ? 1 : 0));
          g.text = o.detokenize(shown);
          std::size_t cut = std::string::npos;
          for (const auto& s : o.stop) cut = std::min(cut, g.text.find(s));
          if (cut != std::string::npos) {
            g.text.resize(cut);
            g.finish_reason = "stop";
          }
        }
        if (g.finish_reason.empty() && static_cast<int64_t>(g.tokens.size()) >= r.limit) g.finish_reason = "length";
        r.done = !g.finish_reason.empty();
        if (stream) {
          const std::size_t ready = r.done ? g.text.size() : g.text.size() - held_back(g.text, o.stop);
          // A detokenizer may rewrite earlier text (a merged character); only what is past the streamed
          // bytes is sent.
          if (ready > r.streamed) {
            stream(r.prompt, g.text.substr(r.streamed, ready - r.streamed));
            r.streamed = ready;
          }
        }
        if (!r.done) feed[k].push_back(tok);
      }
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> generate_greedy(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                                  const std::vector<int64_t>& max_new, int32_t eos,
                                                  const std::vector<DecodeImages>& images) {
  GenerateOptions o;
  if (eos >= 0) o.eos_ids = {eos};
  auto gens = generate(decoder_of(model), prompts, o, {}, max_new, images);
  std::vector<std::vector<int32_t>> out;
  for (auto& g : gens) out.push_back(std::move(g.tokens));
  return out;
}

}  // namespace ax::train

#include "data/stream_feed.hpp"

#include <algorithm>

#include "axengine/config_binder.hpp"
#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "data/types.hpp"

namespace ax::data {

StreamFeed::StreamFeed(std::unique_ptr<SampleStream> stream, std::string name, int64_t sequence_len, int64_t tokenizer_vocab,
                       int64_t model_vocab, BadRowPolicy policy)
    : stream_(std::move(stream)), name_(std::move(name)), sequence_len_(sequence_len), tokenizer_vocab_(tokenizer_vocab),
      model_vocab_(model_vocab), policy_(policy) {}

// The checks prepare_datasets makes of map-style samples (prepare.cpp: tokenise, check_ids, check_extras), one
// sample at a time; a failure names the sample's row. Returns normally for a usable sample.
void StreamFeed::check(const Sample& s) {
  const std::string where = stream_->last_origin();
  if (s.input_ids.empty()) throw UsageError(ax::str(where, ": the sample has no tokens"));
  if (s.labels.size() != s.input_ids.size())
    throw UsageError(ax::str(where, ": the sample has ", s.labels.size(), " labels for ", s.input_ids.size(), " tokens"));
  const int64_t limit = model_vocab_ > 0 ? std::min(tokenizer_vocab_, model_vocab_) : tokenizer_vocab_;
  for (std::size_t k = 0; k < s.input_ids.size(); ++k) {
    const int64_t id = s.input_ids[k], label = s.labels[k];
    const bool bad_id = id < 0 || id >= limit, bad_label = label != -100 && (label < 0 || label >= limit);
    if (!bad_id && !bad_label) continue;
    const int64_t v = bad_id ? id : label;
    const std::string what = ax::str(bad_id ? "token " : "label ", k, " = ", v);
    if (v >= 0 && v < tokenizer_vocab_)
      throw UsageError(ax::str(where, ": ", what, " is beyond the model's vocabulary (config.json vocab_size ", model_vocab_,
                               "; the tokenizer has ", tokenizer_vocab_, "): the tokenizer and the model do not match"));
    throw UsageError(ax::str(where, ": ", what, " is outside the tokenizer's vocabulary (", tokenizer_vocab_, ")"));
  }
  check_extras(s, where);
}

void StreamFeed::check_extras(const Sample& s, const std::string& where) {
  std::lock_guard<std::mutex> lock(extras_mutex_);
  for (const auto& [key, t] : s.extras) {
    const std::string w = ax::str(where, ": extra '", key, "' ");
    if (!t.defined() || t.dim() < 1) throw UsageError(w + "must be a tensor of at least one dimension");
    if (!t.is_cpu()) throw UsageError(w + ax::str("is on ", t.device(), "; dataset types give CPU tensors"));
    std::vector<int64_t> dims(t.sizes().begin() + 1, t.sizes().end());
    auto [it, fresh] = extras_.try_emplace(key, t.scalar_type(), dims);
    if (!fresh && (it->second.first != t.scalar_type() || it->second.second != dims))
      throw UsageError(w + ax::str("is ", t.scalar_type(), " ", t.sizes(), " unlike the stream's earlier samples (only dim 0 may vary)"));
  }
}

bool StreamFeed::fetch(Sample& out) {
  while (true) {
    const uint64_t pass = stream_->cursor().pass;  // of the row next() reads, when it reads one
    if (!stream_->next(out)) {
      if (pass_samples_ == 0)
        throw UsageError(ax::str("dataset ", name_, ": a whole pass over ", stream_->shards().size(),
                                 " shard(s) gave no usable row (", stream_->skipped_rows() + skipped_late_, " bad rows skipped, ", no_loss_,
                                 " without a token to train on within data.sequence_len = ", sequence_len_, ")"));
      pass_samples_ = 0;
      stream_->seek(stream_->cursor());  // at the end, the cursor is the start of the next pass
      continue;
    }
    if (out.materialise) {
      const std::string where = stream_->last_origin();
      auto make = std::move(out.materialise);
      out.materialise = nullptr;
      if (eager_) {
        try {
          make(out);
        } catch (const std::exception& e) {  // as the stream treats a row it cannot convert
          if (policy_ == BadRowPolicy::error) throw UsageError(ax::str(where, ": ", e.what()));
          ++skipped_late_;
          continue;
        }
      } else {
        const bool skip = policy_ == BadRowPolicy::skip;
        out.materialise = [this, make = std::move(make), where, skip](Sample& s) {
          try {
            make(s);
          } catch (const std::exception& e) {
            throw UsageError(ax::str(where, ": ", e.what(),
                                     skip ? " (on_bad_row = \"skip\" cannot drop it here: with several data-parallel ranks "
                                            "the row was packed on every rank before the rank training it decoded it)"
                                          : ""));
          }
          check_extras(s, where);
        };
      }
    }
    check(out);
    if (std::string why = fit_ ? fit_->unfit(out, sequence_len_) : ""; !why.empty()) {
      if (policy_ == BadRowPolicy::error) throw UsageError(ax::str(stream_->last_origin(), ": ", why));
      log::warn(ax::str(stream_->last_origin(), ": ", why, " (on_bad_row = \"skip\": dropped)"));
      ++skipped_late_;
      continue;
    }
    // As drop_samples_without_loss: a label other than -100 among positions 1 .. min(len, S) - 1.
    const std::size_t n = std::min(out.labels.size(), static_cast<std::size_t>(sequence_len_));
    bool loss = false;
    for (std::size_t k = 1; k < n && !loss; ++k) loss = out.labels[k] != -100;
    if (!loss) {
      if (policy_ == BadRowPolicy::error)
        throw UsageError(ax::str(stream_->last_origin(), ": no token to train on within data.sequence_len = ", sequence_len_,
                                 " (every label is -100, or the prompt fills the first ", sequence_len_,
                                 " tokens); raise sequence_len, fix the row, or set on_bad_row = \"skip\" to drop such rows"));
      ++no_loss_;
      continue;
    }
    ++pass_samples_;
    held_pass_ = pass;
    return true;
  }
}

std::vector<Sample> StreamFeed::next_row() {
  std::vector<Sample> row;
  if (!held_) {
    held_.emplace();
    held_at_ = stream_->cursor();
    fetch(*held_);
  }
  int64_t used = 0;
  const uint64_t pass = held_pass_;
  while (true) {
    const int64_t len = std::min<int64_t>(sequence_len_, static_cast<int64_t>(held_->input_ids.size()));
    // It starts the next row: first fit, as pack_samples; a pass's last row is not topped up with the next
    // pass's samples, so each pass packs as pack_samples packs the files in order.
    if (!row.empty() && (used + len > sequence_len_ || held_pass_ != pass)) break;
    used += len;
    row.push_back(std::move(*held_));
    held_at_ = stream_->cursor();
    fetch(*held_);
  }
  return row;
}

StreamCursor StreamFeed::cursor() const { return held_ ? held_at_ : stream_->cursor(); }

void StreamFeed::seek(const StreamCursor& c) {
  held_.reset();
  pass_samples_ = 1;  // the pass may have had its usable rows before the cursor
  stream_->seek(c);
}

std::shared_ptr<StreamFeed> open_stream_entry(const RunConfig& config, const toml::table& entry, const toml::table& type_entry,
                                              const CommonEntry& common, const DatasetType& type, const DatasetContext& ctx,
                                              const DataConfig& data, const Tokenizer& tokenizer, int64_t model_vocab,
                                              std::size_t entries) {
  const toml::node* at = entry.get("streaming");
  const auto* streaming = dynamic_cast<const StreamingDatasetType*>(&type);
  if (!streaming)
    config_fail(config.file, at, ax::str("dataset type \"", common.type, "\" cannot stream (streaming types: completion, pretokenized, chat_template, mm_cpt)"));
  if (entries > 1)
    config_fail(config.file, at, "a streamed run reads one [[datasets]] entry (its shards by glob); put the files under one glob");
  const auto max_steps = config.document.at_path("train.max_steps").value<int64_t>();
  if (!max_steps || *max_steps <= 0)
    config_fail(config.file, at, "streaming = true needs train.max_steps > 0: a stream has no known size, so no epoch count gives the steps");
  if (const toml::node* n = config.document.at_path("train.num_epochs").node())
    config_fail(config.file, n, "train.num_epochs does not apply to a streamed dataset: the run ends at train.max_steps, reading the shards again from the first when they run out");
  const double fraction = common.eval_fraction >= 0 ? common.eval_fraction : data.eval_fraction;
  if (fraction > 0)
    config_fail(config.file, entry.get("eval_fraction") ? entry.get("eval_fraction") : at,
                "eval_fraction cannot hold rows out of a stream; give eval rows with eval_path (read whole, map-style)");
  auto stream = streaming->open_stream(type_entry, ctx);
  if (!stream) throw RuntimeError(ax::str("dataset type \"", common.type, "\" returned no stream"));
  const std::string name = common.name.empty() ? common.path : common.name;
  auto feed = std::make_shared<StreamFeed>(std::move(stream), name, data.sequence_len, tokenizer.vocab_size(), model_vocab,
                                           parse_bad_row_policy(common.on_bad_row));
  feed->set_fit(dynamic_cast<const SampleFit*>(&type));
  return feed;
}

}  // namespace ax::data

#include "tokenizer/bpe.hpp"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "tokenizer/unicode.hpp"

namespace ax::tok {

void MergeTable::reserve(std::size_t n) {
  std::size_t capacity = 16;
  int bits = 4;
  while (capacity < 2 * n + 2) capacity <<= 1, ++bits;
  keys_.assign(capacity, kEmpty);
  values_.assign(capacity, {});
  mask_ = capacity - 1;
  shift_ = 64 - bits;
  size_ = 0;
}

void MergeTable::insert_or_assign(uint64_t key, Target value) {
  if (2 * (size_ + 1) > keys_.size()) {  // grow: keep the load factor at most 1/2
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<Target> old_values = std::move(values_);
    reserve(std::max<std::size_t>(size_ + 1, old_keys.size()));
    for (std::size_t i = 0; i < old_keys.size(); ++i)
      if (old_keys[i] != kEmpty) insert_or_assign(old_keys[i], old_values[i]);
  }
  std::size_t i = slot(key);
  while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
  if (keys_[i] == kEmpty) ++size_;
  keys_[i] = key;
  values_[i] = value;
}

Bpe::Bpe(const JsonReader& r, const json& model, const std::string& path) : source_(r.file) {
  r.object(model, path);
  if (auto type = r.optional_string(model, "type", path); type && *type != "BPE") r.unsupported(path, *type);
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number()) r.fail(JsonReader::join(path, "dropout"), "must be a number or null");
    if (it->get<double>() != 0.0)
      r.fail(JsonReader::join(path, "dropout"), "must be null or 0: BPE dropout (random merges) is not supported");
  }
  unk_token_ = r.optional_string(model, "unk_token", path);
  prefix_ = r.optional_string(model, "continuing_subword_prefix", path).value_or("");
  suffix_ = r.optional_string(model, "end_of_word_suffix", path).value_or("");
  fuse_unk_ = r.boolean(model, "fuse_unk", path, false);
  byte_fallback_ = r.boolean(model, "byte_fallback", path, false);
  ignore_merges_ = r.boolean(model, "ignore_merges", path, false);

  const std::string vp = JsonReader::join(path, "vocab");
  const json& vocab = r.object(r.required(model, "vocab", path), vp);
  vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = r.id(it.value(), vp + "." + it.key());
    vocab_[it.key()] = id;
  }
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) max_id = std::max(max_id, id);
  id_to_token_.assign(static_cast<std::size_t>(max_id + 1), nullptr);
  for (const auto& [token, id] : vocab_) id_to_token_[id] = &token;
  if (unk_token_)
    if (auto it = vocab_.find(*unk_token_); it != vocab_.end()) unk_id_ = it->second;
  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    if (auto it = vocab_.find(std::string_view(name)); it != vocab_.end()) byte_ids_[b] = it->second;
  }

  // Merges: "a b" strings (older files) or ["a", "b"] pairs (tokenizers >= 0.20). A later duplicate wins, as
  // in HF's builder.
  const std::string mp = JsonReader::join(path, "merges");
  static const json kNoMerges = json::array();
  const json& merges = r.array(model.contains("merges") ? model["merges"] : kNoMerges, mp);
  merges_.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const std::string ip = JsonReader::index(mp, i);
    std::string a, b;
    if (merges[i].is_string()) {
      const std::string s = merges[i].get<std::string>();
      const std::size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        r.fail(ip, "must be two tokens separated by one space, got '" + s + "'");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (merges[i].is_array() && merges[i].size() == 2) {
      a = r.string(merges[i][0], ip + "[0]");
      b = r.string(merges[i][1], ip + "[1]");
    } else {
      r.fail(ip, "must be a string \"a b\" or a pair [\"a\", \"b\"]");
    }
    auto find = [&](const std::string& t) {
      auto it = vocab_.find(t);
      if (it == vocab_.end()) r.fail(ip, "uses '" + t + "', which is not in " + vp);
      return it->second;
    };
    const int32_t ia = find(a), ib = find(b);
    const std::string merged = a + (b.compare(0, prefix_.size(), prefix_) == 0 ? b.substr(prefix_.size()) : b);
    merges_.insert_or_assign(pair_key(ia, ib), {static_cast<int32_t>(i), find(merged)});
  }
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  return id >= 0 && static_cast<std::size_t>(id) < id_to_token_.size() ? id_to_token_[id] : nullptr;
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_)
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(ids));
  }
}

// HF's BPE::merge_word + Word::merge_all.
void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, true});
  };
  std::optional<int32_t> pending_unk;  // HF holds back an unk so that fuse_unk can extend it
  auto unk_id = [&]() -> int32_t {
    if (!unk_id_) throw UsageError(source_ + ": model.unk_token '" + *unk_token_ + "' is not in model.vocab");
    return *unk_id_;
  };
  std::string s;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t begin = i;
    next_code_point(word, i);
    s.assign(word.substr(begin, i - begin));
    if (begin > 0) s.insert(0, prefix_);
    if (i == word.size()) s += suffix_;
    if (auto it = vocab_.find(s); it != vocab_.end()) {
      if (pending_unk) add(*pending_unk), pending_unk.reset();
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : s) all = all && byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : s) add(byte_ids_[b]);  // (HF does not flush a pending unk here either)
        continue;
      }
    }
    if (unk_token_) {
      if (pending_unk && !fuse_unk_) add(*pending_unk);
      if (!pending_unk || !fuse_unk_) pending_unk = unk_id();
    }
  }
  if (pending_unk) add(*pending_unk);

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator<(const Candidate& o) const {  // std::priority_queue is a max-heap: invert for min (rank, pos)
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  auto lookup = [&](int32_t a, int32_t b) { return merges_.find(pair_key(a, b)); };
  std::priority_queue<Candidate> queue;
  for (std::size_t k = 0; k + 1 < symbols.size(); ++k)
    if (auto m = lookup(symbols[k].id, symbols[k + 1].id))
      queue.push({m->rank, static_cast<int32_t>(k), m->new_id});
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const MergeTarget* current = lookup(left.id, right.id);
    if (!current || current->new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0)
      if (auto m = lookup(symbols[left.prev].id, left.id)) queue.push({m->rank, left.prev, m->new_id});
    if (left.next >= 0)
      if (auto m = lookup(left.id, symbols[left.next].id)) queue.push({m->rank, top.pos, m->new_id});
  }
  for (const auto& sym : symbols)
    if (sym.alive) out.push_back(sym.id);
}

}  // namespace ax::tok

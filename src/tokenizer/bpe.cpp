#include "tokenizer/bpe.h"

#include <cstdio>
#include <mutex>
#include <queue>

#include "microllm/core/error.h"
#include "tokenizer/unicode.h"

namespace microllm::tokenizer_detail {

namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// One symbol of a word being merged; removed symbols keep their slot with length 0.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t length;  // bytes of the word it covers
};

// A candidate merge of symbols[pos] with its right neighbour.
struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // std::priority_queue pops the largest: make the lowest rank, then the leftmost position, the largest.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

bool append_byte_fallback(const Model& model, std::string_view text, std::vector<int32_t>& out) {
  const size_t first = out.size();
  for (const char c : text) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned>(static_cast<uint8_t>(c)));
    const auto id = model.token_to_id(name);
    if (!id) {
      out.resize(first);
      return false;
    }
    out.push_back(*id);
  }
  return true;
}

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
                   const std::function<std::string(size_t)>& merge_where)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  id_to_token_.reserve(vocab_.size());
  for (const auto& [token, id] : vocab_) id_to_token_[id] = &token;
  const size_t prefix_length = options_.continuing_subword_prefix ? options_.continuing_subword_prefix->size() : 0;
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto a_id = token_to_id(a);
    const auto b_id = token_to_id(b);
    if (!a_id || !b_id) {
      throw ParseError("tokenizer",
                       str_cat(merge_where(rank), " names '", a_id ? b : a, "', which is not in the vocabulary"));
    }
    // The merged token drops the right part's continuing-subword prefix ("##").
    const std::string merged = a + (prefix_length > 0 && b.size() >= prefix_length ? b.substr(prefix_length) : b);
    const auto new_id = token_to_id(merged);
    if (!new_id) {
      throw ParseError("tokenizer",
                       str_cat(merge_where(rank), " makes '", merged, "', which is not in the vocabulary"));
    }
    // A repeated pair keeps its last rank, as Hugging Face's HashMap collect does.
    merges_[pair_key(*a_id, *b_id)] = MergeValue{static_cast<int32_t>(rank), *new_id};
  }
  if (options_.unk_token) unk_id_ = token_to_id(*options_.unk_token);
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  const auto it = id_to_token_.find(id);
  return it == id_to_token_.end() ? nullptr : it->second;
}

const BpeModel::MergeValue* BpeModel::find_merge(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity)
      cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  // 1. One symbol per character (with the subword prefix/suffix), unknown characters through byte
  //    fallback or the unknown token, exactly as Hugging Face's BPE::merge_word.
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id, size_t length) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1, static_cast<uint32_t>(length)});
    if (index > 0) symbols[index - 1].next = index;
  };
  struct {
    bool active = false;
    int32_t id = 0;
    size_t length = 0;
  } pending_unk;  // an unknown token waiting to be fused with the next one
  size_t i = 0;
  std::string piece;
  while (i < word.size()) {
    size_t length = utf8_sequence_length(word, i);
    if (length == 0) length = 1;  // not reached for well-formed input
    const bool is_first = i == 0, is_last = i + length == word.size();
    piece.clear();
    if (!is_first && options_.continuing_subword_prefix) piece += *options_.continuing_subword_prefix;
    piece.append(word.substr(i, length));
    if (is_last && options_.end_of_word_suffix) piece += *options_.end_of_word_suffix;
    i += length;

    if (const auto id = token_to_id(piece)) {
      if (pending_unk.active) {
        add(pending_unk.id, pending_unk.length);
        pending_unk.active = false;
      }
      add(*id, length);
      continue;
    }
    if (options_.byte_fallback) {
      std::vector<int32_t> bytes;
      if (append_byte_fallback(*this, piece, bytes)) {
        for (const int32_t id : bytes) add(id, 1);
        continue;
      }
    }
    if (options_.unk_token) {
      if (!unk_id_)
        throw ValueError("tokenizer",
                         str_cat("the unknown token '", *options_.unk_token, "' is not in the vocabulary"));
      if (pending_unk.active && options_.fuse_unk) {
        pending_unk.length += length;
      } else {
        if (pending_unk.active) add(pending_unk.id, pending_unk.length);
        pending_unk = {true, *unk_id_, length};
      }
    }
    // Without an unknown token the character is dropped, as in Hugging Face.
  }
  if (pending_unk.active) add(pending_unk.id, pending_unk.length);

  // 2. Merge the best pair until none is left: a queue of candidates, stale entries skipped on pop.
  std::priority_queue<Candidate> queue;
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const MergeValue* m = find_merge(symbols[k].id, symbols[k + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(k), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.length == 0 || left.next == -1) continue;
    const int32_t right_pos = left.next;
    const Symbol right = symbols[right_pos];
    const MergeValue* current = find_merge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;  // the pair changed since it was queued

    left.id = top.new_id;
    left.length += right.length;
    left.next = right.next;
    symbols[right_pos].length = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;

    if (left.prev >= 0) {
      if (const MergeValue* m = find_merge(symbols[left.prev].id, left.id)) queue.push({m->rank, left.prev, m->new_id});
    }
    if (left.next >= 0) {
      if (const MergeValue* m = find_merge(left.id, symbols[left.next].id)) queue.push({m->rank, top.pos, m->new_id});
    }
  }
  for (const Symbol& s : symbols) {
    if (s.length != 0) out.push_back(s.id);
  }
}

}  // namespace microllm::tokenizer_detail

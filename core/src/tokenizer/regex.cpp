#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.hpp"

#include <pcre2.h>

#include <stdexcept>

#include "axengine/error.hpp"
#include "tokenizer/unicode.hpp"

namespace ax::tok {
namespace {

constexpr std::size_t kJitStackMax = 8 * 1024 * 1024;

// JIT matching runs on a per-thread stack; the 32 KiB default overflows on long whitespace runs.
struct JitStack {
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, kJitStackMax, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  JitStack() {
    if (stack && context) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~JitStack() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

pcre2_match_context* thread_match_context() {
  thread_local JitStack jit;
  return jit.context;
}

// What a failed match means for the person whose tokenizer or row it is.
std::string match_failure(int rc) {
  switch (rc) {
    case PCRE2_ERROR_JIT_STACKLIMIT:
      return "ran out of PCRE2's JIT stack (" + std::to_string(kJitStackMax >> 20) + " MiB)";
    case PCRE2_ERROR_MATCHLIMIT: return "hit PCRE2's match limit (too much backtracking)";
    case PCRE2_ERROR_DEPTHLIMIT: return "hit PCRE2's depth limit (too much backtracking)";
    case PCRE2_ERROR_HEAPLIMIT: return "hit PCRE2's heap limit";
    default: {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      return std::string("failed: ") + reinterpret_cast<const char*>(message);
    }
  }
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  std::string pattern, origin;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, std::string origin) : impl_(std::make_unique<Impl>()) {
  impl_->pattern = pattern;
  impl_->origin = std::move(origin);
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                              &error, &offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw std::invalid_argument("regex /" + pattern + "/ does not compile at offset " + std::to_string(offset) +
                                ": " + reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
}

Regex::~Regex() = default;

std::vector<std::pair<std::size_t, std::size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data.get(),
                               thread_match_context());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      // A pattern that backtracks exponentially, or a very long run for a recursive one: the tokenizer's
      // fault or the row's, so it is a usage error that names both (the caller adds the row).
      const std::string pattern = impl_->pattern.size() > 200 ? impl_->pattern.substr(0, 200) + "..." : impl_->pattern;
      throw UsageError((impl_->origin.empty() ? std::string("tokenizer") : impl_->origin) + ": regex /" + pattern + "/ " +
                       match_failure(rc) + " on a piece of " + std::to_string(text.size()) +
                       " bytes; simplify the pattern (nested quantifiers backtrack exponentially) or shorten the row");
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const std::size_t begin = ovector[0], end = ovector[1];
    matches.emplace_back(begin, end);
    if (end > begin) {
      start = end;
    } else if (end < text.size()) {
      start = end + utf8_length(static_cast<unsigned char>(text[end]));
    } else {
      break;
    }
  }
  return matches;
}

std::string Regex::escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ ").find(c) != std::string_view::npos) {
      if (c == ' ') {
        out += "\\x20";  // stays literal even under (?x)
        continue;
      }
      out += '\\';
    }
    out += c;
  }
  return out;
}

}  // namespace ax::tok

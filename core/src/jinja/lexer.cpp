// Jinja tokens, with the whitespace rules transformers' environment uses (trim_blocks=True, lstrip_blocks=True):
// the behaviour of jinja2.lexer.Lexer.tokeniter for the subset we parse.
#include <algorithm>

#include "jinja/ast.hpp"
#include "jinja/value.hpp"

namespace ax::jinja::detail {
namespace {

bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's str.rstrip()/lstrip() with no argument: Unicode whitespace, as Jinja's `\s` regex (re.UNICODE).
std::string_view rstrip_ws(std::string_view s) { return s.substr(0, s.size() - py_whitespace_suffix(s)); }
std::string_view lstrip_ws(std::string_view s) { return s.substr(py_whitespace_prefix(s)); }

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& name) : src_(src), name_(name) {
    for (std::size_t i = 0; i < src.size(); ++i)
      if (src[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    std::size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with '-': the text after it loses its leading whitespace
    while (pos <= src_.size()) {
      std::size_t tag = find_tag(pos);
      std::size_t text_begin = pos;
      std::string_view text = src_.substr(pos, (tag == std::string_view::npos ? src_.size() : tag) - pos);
      if (strip_next) {
        std::string_view s = lstrip_ws(text);
        text_begin += text.size() - s.size();
        text = s;
        strip_next = false;
      }
      if (tag != std::string_view::npos) {
        char type = src_[tag + 1];
        char mod = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
        if (mod == '-') {
          text = rstrip_ws(text);
        } else if ((type == '%' || type == '#') && mod != '+') {
          // lstrip_blocks: whitespace alone on the line before a block or comment tag goes.
          std::size_t nl = text.rfind('\n');
          std::size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
          bool line_starting = text_begin == 0 || src_[text_begin - 1] == '\n';
          std::string_view tail = text.substr(l_pos);
          if ((l_pos > 0 || line_starting) && !tail.empty() && py_whitespace_prefix(tail) == tail.size())
            text = text.substr(0, l_pos);
        }
      }
      if (!text.empty()) tokens_.push_back({Tok::text, std::string(text), at(text_begin)});
      if (tag == std::string_view::npos) break;
      pos = lex_tag(tag, strip_next);
    }
    tokens_.push_back({Tok::eof, "", at(src_.size())});
    return std::move(tokens_);
  }

 private:
  Pos at(std::size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    std::size_t line_start = it == line_starts_.begin() ? 0 : *(it - 1);
    return {static_cast<int>(it - line_starts_.begin()) + 1, static_cast<int>(offset - line_start) + 1};
  }
  [[noreturn]] void fail(std::size_t offset, const std::string& msg) const {
    Pos p = at(offset);
    throw Error(name_, p.line, p.column, msg);
  }

  std::size_t find_tag(std::size_t pos) const {
    for (std::size_t i = src_.find('{', pos); i != std::string_view::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string_view::npos;
  }

  // Lexes the tag starting at `tag` ("{{", "{%" or "{#"); returns the position after it.
  std::size_t lex_tag(std::size_t tag, bool& strip_next) {
    char type = src_[tag + 1];
    std::size_t pos = tag + 2;
    if (pos < src_.size() && (src_[pos] == '-' || src_[pos] == '+')) ++pos;
    if (type == '#') {
      std::size_t end = src_.find("#}", pos);
      if (end == std::string_view::npos) fail(tag, "unterminated comment");
      char mod = end > pos && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
      return after_end(end + 2, mod, /*block=*/true, strip_next);
    }
    bool block = type == '%';
    tokens_.push_back({block ? Tok::block_begin : Tok::var_begin, "", at(tag)});
    int depth = 0;
    while (true) {
      while (pos < src_.size() && ascii_space(src_[pos])) ++pos;
      if (pos >= src_.size()) fail(tag, block ? "unterminated block tag: no '%}'" : "unterminated '{{': no '}}'");
      if (depth == 0) {
        std::string_view rest = src_.substr(pos);
        const char* end = block ? "%}" : "}}";
        char mod = (rest[0] == '-' || rest[0] == '+') ? rest[0] : '\0';
        if (rest.substr(mod ? 1 : 0, 2) == end) {
          tokens_.push_back({block ? Tok::block_end : Tok::var_end, "", at(pos)});
          return after_end(pos + (mod ? 3 : 2), mod, block, strip_next);
        }
      }
      pos = lex_expr_token(pos, depth);
    }
  }

  std::size_t after_end(std::size_t pos, char mod, bool block, bool& strip_next) {
    if (mod == '-') strip_next = true;
    else if (block && mod != '+' && pos < src_.size() && src_[pos] == '\n') ++pos;  // trim_blocks
    return pos;
  }

  std::size_t lex_expr_token(std::size_t pos, int& depth) {
    char c = src_[pos];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t e = pos;
      while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      tokens_.push_back({Tok::name, std::string(src_.substr(pos, e - pos)), at(pos)});
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(pos);
    if (c == '\'' || c == '"') return lex_string(pos);
    static const char* two[] = {"**", "//", "==", "!=", "<=", ">="};
    for (const char* op : two)
      if (src_.substr(pos, 2) == op) {
        tokens_.push_back({Tok::op, op, at(pos)});
        return pos + 2;
      }
    if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos)
      fail(pos, std::string("unexpected character '") + c + "' in a tag");
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') depth = std::max(0, depth - 1);
    tokens_.push_back({Tok::op, std::string(1, c), at(pos)});
    return pos + 1;
  }

  std::size_t lex_number(std::size_t pos) {
    std::size_t e = pos;
    auto digits = [&] { while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e; };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      std::size_t m = e + 1;
      if (m < src_.size() && (src_[m] == '+' || src_[m] == '-')) ++m;
      if (m < src_.size() && std::isdigit(static_cast<unsigned char>(src_[m]))) {
        is_float = true;
        e = m;
        digits();
      }
    }
    std::string text;
    for (char ch : src_.substr(pos, e - pos))
      if (ch != '_') text += ch;
    tokens_.push_back({is_float ? Tok::floating : Tok::integer, text, at(pos)});
    return e;
  }

  std::size_t lex_string(std::size_t pos) {
    char q = src_[pos];
    std::string out;
    std::size_t i = pos + 1;
    while (true) {
      if (i >= src_.size()) fail(pos, "unterminated string literal");
      char c = src_[i];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) fail(pos, "unterminated string literal");
      char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '0': out += '\0'; break;
        case '\\': case '\'': case '"': out += e; break;
        case '\n': break;  // a backslash-newline continues the line, as in Python
        case 'x': case 'u': case 'U': {
          std::size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + n > src_.size()) fail(i - 2, "truncated \\" + std::string(1, e) + " escape");
          std::uint32_t cp = 0;
          for (std::size_t k = 0; k < n; ++k) {
            char h = src_[i + k];
            int v = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                    : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (v < 0) fail(i - 2, "bad \\" + std::string(1, e) + " escape");
            cp = cp * 16 + static_cast<std::uint32_t>(v);
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail(i - 2, "escape is not a Unicode scalar value");
          append_utf8(out, cp);
          i += n;
          break;
        }
        default: out += '\\'; out += e;  // Python keeps unknown escapes as written
      }
    }
    tokens_.push_back({Tok::string, std::move(out), at(pos)});
    return i + 1;
  }

  std::string_view src_;
  const std::string& name_;
  std::vector<std::size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const std::string& name) {
  // As jinja2's Environment does before lexing: newlines normalised (\r\n and \r become \n) and, with
  // keep_trailing_newline off, one newline at the very end dropped.
  std::string src;
  src.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(src, name).run();
}

}  // namespace ax::jinja::detail

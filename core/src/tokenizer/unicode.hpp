// UTF-8 and Unicode helpers for the tokenizer: code point iteration, HF's byte-level alphabet, Rust-compatible
// lossy decoding and character classes, and utf8proc normalization.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ax::tok {

// Length of the valid UTF-8 prefix of `s` (== s.size() when all of it is valid).
std::size_t valid_utf8_prefix(std::string_view s);

// Decodes the code point starting at s[i] and advances i. `s` must be valid UTF-8.
char32_t next_code_point(std::string_view s, std::size_t& i);
// Byte length of the UTF-8 sequence whose lead byte is `lead` (1 for stray bytes).
std::size_t utf8_length(unsigned char lead);
void append_utf8(std::string& out, char32_t cp);

// What Rust's String::from_utf8_lossy returns: every maximal invalid subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// GPT-2's reversible byte <-> printable character map used by the ByteLevel pre-tokenizer and decoder.
struct ByteLevelAlphabet {
  std::array<std::string, 256> byte_to_utf8;  // byte -> UTF-8 of its stand-in character
  std::array<int16_t, 324> char_to_byte;      // stand-in code point (all < 324) -> byte, -1 when not one
  ByteLevelAlphabet();
};
const ByteLevelAlphabet& byte_level_alphabet();

// Rust's char::is_whitespace (the Unicode White_Space property).
bool is_whitespace(char32_t c);
// Rust's char::is_alphanumeric, approximated by general categories L* and N*.
bool is_alphanumeric(char32_t c);
// Unicode general category N* (what Digits and \p{N} mean).
bool is_numeric(char32_t c);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view s, NormalForm form);

}  // namespace ax::tok

// ax::make_byte_level_tokenizer_json: what it writes is committed (tests/data/tokenizers/axengine_bytelevel),
// HF tokenizers loads that file and its encodings are the goldens (scripts/goldens/make_tokenizer_goldens.py),
// so "HF loads it and agrees with us" is checked, not assumed. Regenerate with
//   AXENGINE_REGEN_GOLDENS=1 build/bin/axengine_tests -tc="*generator output*"
// and then re-run the golden script.
#include <doctest/doctest.h>

#include <cstdlib>
#include <random>

#include "axengine/error.hpp"
#include "unit/tokenizer_test_util.hpp"

namespace {

// A corpus like the quickstart's generated arithmetic task, plus a little prose.
ax::ByteLevelTokenizerOptions arithmetic_options() {
  ax::ByteLevelTokenizerOptions o;
  for (int a = 0; a < 50; a += 3)
    for (int b = 0; b < 50; b += 7)
      o.corpus.push_back("Q: " + std::to_string(a) + " + " + std::to_string(b) + " = ? A: " + std::to_string(a + b));
  for (int i = 0; i < 20; ++i) o.corpus.push_back("The answer is the sum of the two numbers.\n");
  o.num_merges = 48;
  return o;
}

}  // namespace

TEST_CASE("byte-level tokenizer generator output is stable and HF tokenizers encodes it as we do") {
  const auto o = arithmetic_options();
  const std::string tokenizer_json = ax::make_byte_level_tokenizer_json(o);
  const std::string config_json = ax::make_byte_level_tokenizer_config_json(o);
  const std::filesystem::path dir = ax::test::tokenizer_data_dir("axengine_bytelevel");
  if (std::getenv("AXENGINE_REGEN_GOLDENS")) {
    ax::test::write_text(dir / "tokenizer.json", tokenizer_json);
    ax::test::write_text(dir / "tokenizer_config.json", config_json);
  }
  CHECK(tokenizer_json == ax::test::read_text(dir / "tokenizer.json"));
  CHECK(config_json == ax::test::read_text(dir / "tokenizer_config.json"));
  CHECK(ax::test::check_against_hf_goldens("axengine_bytelevel") >= 66);
}

TEST_CASE("byte-level tokenizer generator: learned merges, special tokens and byte round trips") {
  auto o = arithmetic_options();
  o.bos_token = "<|im_start|>";
  const auto tok = ax::parse_hf_tokenizer(ax::make_byte_level_tokenizer_json(o), "generated tokenizer.json",
                                          ax::make_byte_level_tokenizer_config_json(o));
  const int64_t merged_tokens = tok->vocab_size() - 256 - static_cast<int64_t>(o.special_tokens.size());
  CHECK(merged_tokens > 10);
  CHECK(merged_tokens <= o.num_merges);
  CHECK(tok->eos_id() == tok->vocab_size() - 4);  // <|endoftext|>: first special after bytes and merges
  CHECK(tok->bos_id() == tok->vocab_size() - 3);
  CHECK(tok->pad_id() == tok->vocab_size() - 1);

  const std::string sample = "Q: 12 + 7 = ? A: 19";
  const auto ids = tok->encode(sample);
  CHECK(ids.size() < sample.size());  // merges were learned and used
  CHECK(tok->decode(ids) == sample);
  const auto with_bos = tok->encode(sample, true);
  REQUIRE(with_bos.size() == ids.size() + 1);
  CHECK(with_bos.front() == tok->bos_id());

  const auto chat = tok->encode("<|im_start|>user\nhi<|im_end|><|endoftext|>");
  CHECK(chat.front() == tok->bos_id());
  CHECK(chat.back() == tok->eos_id());
  CHECK(tok->decode(chat, true) == "user\nhi");

  // Any valid UTF-8 survives encode/decode (NFC-stable code points only: NFC may legitimately change text).
  std::mt19937 rng(7);
  const char32_t ranges[][2] = {{0x20, 0x7E}, {0xA0, 0x2FF}, {0x400, 0x4FF}, {0x4E00, 0x4FFF}, {0x1F300, 0x1F5FF}};
  for (int trial = 0; trial < 50; ++trial) {
    std::string s;
    for (int k = 0; k < 40; ++k) {
      const auto& r = ranges[rng() % 5];
      const char32_t cp = r[0] + rng() % (r[1] - r[0] + 1);
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        s += static_cast<char>(0xF0 | (cp >> 18));
        s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }
    INFO("trial ", trial);
    CHECK(tok->decode(tok->encode(s)) == s);
  }
}

TEST_CASE("byte-level tokenizer generator: a pure byte vocabulary and bad options") {
  ax::ByteLevelTokenizerOptions o;
  const auto tok = ax::parse_hf_tokenizer(ax::make_byte_level_tokenizer_json(o), "bytes.json",
                                          ax::make_byte_level_tokenizer_config_json(o));
  CHECK(tok->vocab_size() == 256 + 4);
  CHECK(tok->bos_id() == -1);
  CHECK(tok->encode("ab").size() == 2);

  o.special_tokens = {"<a>", "<a>"};
  o.eos_token = o.pad_token = "";
  CHECK_THROWS_WITH_AS(ax::make_byte_level_tokenizer_json(o), doctest::Contains("'<a>' is listed twice"),
                       ax::UsageError);
  o.special_tokens = {"<a>"};
  o.eos_token = "<eos>";
  CHECK_THROWS_WITH_AS(ax::make_byte_level_tokenizer_json(o), doctest::Contains("'<eos>' must also be one of"),
                       ax::UsageError);
}

TEST_CASE("byte-level tokenizer generator: write_byte_level_tokenizer writes a directory the loader reads") {
  ax::test::ScratchDir dir("tok_writer");
  auto o = arithmetic_options();
  ax::write_byte_level_tokenizer(dir.path.string(), o);
  const auto tok = ax::load_hf_tokenizer(dir.path.string());
  const auto same = ax::parse_hf_tokenizer(ax::make_byte_level_tokenizer_json(o), "x",
                                           ax::make_byte_level_tokenizer_config_json(o));
  CHECK(tok->fingerprint() == same->fingerprint());
  CHECK(tok->eos_id() == same->eos_id());
  CHECK(tok->pad_id() == tok->vocab_size() - 1);
  CHECK_THROWS_WITH_AS(ax::write_byte_level_tokenizer((dir.path / "missing").string(), o),
                       doctest::Contains("missing/tokenizer.json: cannot be written"), ax::RuntimeError);
}

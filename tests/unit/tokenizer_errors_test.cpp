// Bad tokenizer files give a UsageError naming the file and the JSON path at fault, never a crash; plus the
// edge cases of encode/decode input (invalid UTF-8, unknown ids, very long words).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "axengine/config.hpp"
#include "axengine/error.hpp"
#include "axengine/registry.hpp"
#include "data/data_config.hpp"
#include "data/prepare.hpp"
#include "data/register.hpp"
#include "unit/tokenizer_test_util.hpp"

namespace {

using nlohmann::json;

// A small valid Metaspace BPE tokenizer to break in various ways.
json minimal_tokenizer() {
  return json::parse(R"({
    "version": "1.0", "added_tokens": [
      {"id": 0, "content": "<unk>", "special": true, "normalized": false},
      {"id": 1, "content": "<s>", "special": true, "normalized": false}],
    "normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "vocab": {"<unk>": 0, "<s>": 1, "\u2581": 2,
      "a": 3, "b": 4, "\u2581a": 5, "ab": 6, "\u2581ab": 7}, "merges": ["\u2581 a", ["a", "b"], "\u2581a b"]}
  })");
}

std::string error_of(const json& tokenizer, const std::string& config = "") {
  try {
    ax::parse_hf_tokenizer(tokenizer.dump(), "m/tokenizer.json", config);
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("tokenizer errors: the minimal fixture is valid and behaves") {
  const auto tok = ax::parse_hf_tokenizer(minimal_tokenizer().dump(), "m/tokenizer.json");
  CHECK(tok->encode("ab a") == std::vector<int32_t>{7, 5});
  CHECK(tok->encode("ab a", true) == std::vector<int32_t>{1, 7, 5});
  CHECK(tok->encode("abc  a") == std::vector<int32_t>{7, 0, 2, 5});  // c and the following "▁" fuse? no: ▁ known
  CHECK(tok->encode("ccc") == std::vector<int32_t>{2, 0});             // fuse_unk: one <unk> for "ccc"
  CHECK(tok->decode({1, 7, 5}, true) == "ab a");
  CHECK(tok->decode({1, 7, 5}, false) == "<s> ab a");
  CHECK(tok->decode({7, 999, -3, 5}) == "ab a");  // unknown ids are skipped, as HF does
  CHECK(tok->bos_id() == 1);
  CHECK(tok->eos_id() == -1);
  CHECK(tok->fingerprint().size() == 16);
}

TEST_CASE("tokenizer errors: unsupported components name the file and JSON path") {
  auto j = minimal_tokenizer();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  CHECK(error_of(j) == "m/tokenizer.json: pre_tokenizer.type 'Whitespace' is not supported");

  j = minimal_tokenizer();
  j["normalizer"]["normalizers"][1] = {{"type", "Lowercase"}};
  CHECK(error_of(j) == "m/tokenizer.json: normalizer.normalizers[1].type 'Lowercase' is not supported");

  j = minimal_tokenizer();
  j["model"]["type"] = "WordPiece";
  CHECK(error_of(j) == "m/tokenizer.json: model.type 'WordPiece' is not supported");

  j = minimal_tokenizer();
  j["decoder"]["decoders"][0] = {{"type", "CTC"}};
  CHECK(error_of(j) == "m/tokenizer.json: decoder.decoders[0].type 'CTC' is not supported");

  j = minimal_tokenizer();
  j["post_processor"] = {{"type", "Mystery"}};
  CHECK(error_of(j) == "m/tokenizer.json: post_processor.type 'Mystery' is not supported");

  j = minimal_tokenizer();
  j["model"]["dropout"] = 0.1;
  CHECK(error_of(j).find("model.dropout must be null or 0") != std::string::npos);
}

TEST_CASE("tokenizer errors: malformed fields name the file and JSON path") {
  auto j = minimal_tokenizer();
  j["model"]["merges"][1] = json::array({"a", "zz"});
  CHECK(error_of(j) == "m/tokenizer.json: model.merges[1] uses 'zz', which is not in model.vocab");

  j = minimal_tokenizer();
  j["model"]["merges"][0] = "a b c";
  CHECK(error_of(j).find("model.merges[0] must be two tokens separated by one space") != std::string::npos);

  j = minimal_tokenizer();
  j["model"]["vocab"]["a"] = "three";
  CHECK(error_of(j) == "m/tokenizer.json: model.vocab.a must be an integer, got string");

  j = minimal_tokenizer();
  j["model"]["vocab"]["a"] = -4;
  CHECK(error_of(j) == "m/tokenizer.json: model.vocab.a is not a valid token id: -4");

  j = minimal_tokenizer();
  j["model"]["vocab"]["a"] = 1 << 30;  // would mean a table of a billion entries
  CHECK(error_of(j) == "m/tokenizer.json: model.vocab.a is not a valid token id: 1073741824");

  j = minimal_tokenizer();
  j.erase("model");
  CHECK(error_of(j) == "m/tokenizer.json: model is missing");

  j = minimal_tokenizer();
  j["added_tokens"][1].erase("content");
  CHECK(error_of(j) == "m/tokenizer.json: added_tokens[1].content is missing");

  j = minimal_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  CHECK(error_of(j).find("m/tokenizer.json: pre_tokenizer.pattern regex /(unclosed/ does not compile") == 0);

  j = minimal_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
  CHECK(error_of(j) == "m/tokenizer.json: pre_tokenizer.behavior 'Sideways' is not a split behavior");

  j = minimal_tokenizer();
  j["post_processor"]["single"][0]["SpecialToken"]["id"] = "<bos>";
  CHECK(error_of(j) ==
        "m/tokenizer.json: post_processor.single[0].SpecialToken.id '<bos>' is not listed in "
        "post_processor.special_tokens");

  j = minimal_tokenizer();
  j["decoder"]["decoders"][2]["content"] = "ab";
  CHECK(error_of(j) == "m/tokenizer.json: decoder.decoders[2].content must be one character, got 'ab'");

  CHECK(error_of(json::array()) == "m/tokenizer.json: (top level) must be a JSON object, got array");

  // The unk token is only needed when a character is unknown, so its absence fails at encode time, clearly.
  j = minimal_tokenizer();
  j["model"]["unk_token"] = "<missing>";
  const auto tok = ax::parse_hf_tokenizer(j.dump(), "m/tokenizer.json");
  CHECK(tok->encode("ab") == std::vector<int32_t>{7});
  CHECK_THROWS_WITH_AS(tok->encode("xyz"), "m/tokenizer.json: model.unk_token '<missing>' is not in model.vocab",
                       ax::UsageError);
}

TEST_CASE("tokenizer errors: truncated and missing files, bad tokenizer_config.json") {
  ax::test::ScratchDir dir("tok_errors");
  const std::string full = minimal_tokenizer().dump(2);
  ax::test::write_text(dir.path / "tokenizer.json", full.substr(0, full.size() / 2));
  const std::string file = (dir.path / "tokenizer.json").string();
  CHECK_THROWS_WITH_AS(ax::load_hf_tokenizer(dir.path.string()), doctest::Contains((file + ": is not valid JSON").c_str()),
                       ax::UsageError);

  CHECK_THROWS_WITH_AS(ax::load_hf_tokenizer((dir.path / "nothing").string()), doctest::Contains("nothing: not found"),
                       ax::UsageError);
  std::filesystem::create_directories(dir.path / "empty");
  CHECK_THROWS_WITH_AS(ax::load_hf_tokenizer((dir.path / "empty").string()),
                       doctest::Contains("empty/tokenizer.json: not found"), ax::UsageError);

  ax::test::write_text(dir.path / "tokenizer.json", full);
  ax::test::write_text(dir.path / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  CHECK_THROWS_WITH_AS(ax::load_hf_tokenizer(file),
                       doctest::Contains("tokenizer_config.json: eos_token '</s>' is neither an added token nor in "
                                         "the vocabulary"),
                       ax::UsageError);
  ax::test::write_text(dir.path / "tokenizer_config.json", R"({"eos_token": {"content": 5}})");
  CHECK_THROWS_WITH_AS(ax::load_hf_tokenizer(file),
                       doctest::Contains("tokenizer_config.json: eos_token.content must be a string"), ax::UsageError);
  ax::test::write_text(dir.path / "tokenizer_config.json", R"({"eos_token": "<unk>", "pad_token": {"content": "<s>"}})");
  const auto tok = ax::load_hf_tokenizer(file);
  CHECK(tok->eos_id() == 0);
  CHECK(tok->pad_id() == 1);
  CHECK(tok->bos_id() == 1);  // from the template
}

TEST_CASE("tokenizer: invalid UTF-8 input is refused, long inputs stay fast, fingerprints track content") {
  const auto tok = ax::load_hf_tokenizer(ax::test::tokenizer_data_dir("llama2_metaspace"));
  CHECK_THROWS_WITH_AS(tok->encode("ok \xC3\x28 bad"), "tokenizer input is not valid UTF-8 (byte 3)", ax::UsageError);

  // Llama 2 has no pre-tokenizer: the whole text is one BPE word. A quadratic merge loop would take minutes.
  std::string long_text;
  for (int i = 0; i < 20000; ++i) long_text += "hello world 123 ";
  const auto start = std::chrono::steady_clock::now();
  const auto ids = tok->encode(long_text);
  const auto qwen = ax::load_hf_tokenizer(ax::test::tokenizer_data_dir("qwen2_bytelevel"));
  const auto ws_ids = qwen->encode(std::string(200000, ' ') + "x" + std::string(100000, '\n'));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(tok->decode(ids) == long_text);
  CHECK(qwen->decode(ws_ids) == std::string(200000, ' ') + "x" + std::string(100000, '\n'));
  CHECK(seconds < 10.0);

  auto j = minimal_tokenizer();
  const auto a = ax::parse_hf_tokenizer(j.dump(), "a")->fingerprint();
  CHECK(ax::parse_hf_tokenizer(j.dump(2), "b")->fingerprint() == a);  // formatting does not matter
  j["model"]["vocab"]["b"] = 8;
  j["model"]["vocab"]["c"] = 4;
  CHECK(ax::parse_hf_tokenizer(j.dump(), "a")->fingerprint() != a);
  CHECK(ax::parse_hf_tokenizer(minimal_tokenizer().dump(), "a", R"({"eos_token": "<s>"})")->fingerprint() != a);
}

TEST_CASE("tokenizer: concurrent encodes from many threads agree with a serial run") {
  const auto tok = ax::load_hf_tokenizer(ax::test::tokenizer_data_dir("qwen2_bytelevel"));
  const auto expected = nlohmann::json::parse(
      ax::test::read_text(ax::test::tokenizer_data_dir("qwen2_bytelevel") + "/expected.json"))["cases"];
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round)
        for (std::size_t k = (t + round) % expected.size(), n = 0; n < expected.size(); ++n, k = (k + 1) % expected.size())
          if (tok->encode(expected[k]["text"].get<std::string>()) != expected[k]["ids"].get<std::vector<int32_t>>())
            ++mismatches;
    });
  for (auto& th : threads) th.join();
  CHECK(mismatches.load() == 0);
}

TEST_CASE("tokenizer errors: a regex over PCRE2's limits names the file and the pattern and the dataset row") {
  // (a+)+$ backtracks exponentially on "aaa...!" (PCRE2's match limit); (a|b)* recurses once per character
  // (the 8 MiB JIT stack runs out after a few hundred thousand). Both were "tokenizer regex match failed",
  // naming no file, pattern or row.
  auto j = minimal_tokenizer();
  j["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": false})");
  const auto backtracking = ax::parse_hf_tokenizer(j.dump(), "m/tokenizer.json");
  CHECK(backtracking->encode("ab ab") == backtracking->encode("ab ab"));  // ordinary text is fine
  CHECK_THROWS_WITH_AS(backtracking->encode(std::string(40, 'a') + "!"),
                       doctest::Contains("m/tokenizer.json: pre_tokenizer.pattern: regex /(a+)+$/ hit PCRE2's match limit"),
                       ax::UsageError);
  j["pre_tokenizer"]["pattern"]["Regex"] = "(a|b)*";
  const auto recursive = ax::parse_hf_tokenizer(j.dump(), "m/tokenizer.json");
  CHECK_THROWS_WITH_AS(recursive->encode(std::string(1000000, 'a')),
                       doctest::Contains("m/tokenizer.json: pre_tokenizer.pattern: regex /(a|b)*/ "), ax::UsageError);

  // Through a dataset: the error also names the file and line of the row being encoded.
  ax::test::ScratchDir dir("tok_regex_row");
  ax::test::write_text(dir.path / "rows.jsonl", "{\"text\": \"ab ab\"}\n{\"text\": \"" + std::string(40, 'a') + "!\"}\n");
  ax::test::write_text(dir.path / "run.toml", "[data]\ncache = false\n[[datasets]]\ntype = \"completion\"\npath = \"rows.jsonl\"\n");
  auto cfg = ax::load_config((dir.path / "run.toml").string());
  ax::Registry reg;
  ax::data::register_builtin_datasets(reg);
  CHECK_THROWS_WITH_AS(ax::data::prepare_datasets(cfg, ax::data::read_data_config(cfg), reg, *backtracking),
                       doctest::Contains("rows.jsonl:2: m/tokenizer.json: pre_tokenizer.pattern: regex /(a+)+$/"), ax::UsageError);
}

TEST_CASE("tokenizer errors: a normalizer that multiplies the text names the file instead of exhausting memory") {
  // 40 Replace steps that each double every "a": 2^40 times the input. Stopped at the size limit (64 times
  // the input plus 1 MiB), naming the file, whether it runs on a row or on an added token at load.
  auto j = minimal_tokenizer();
  json steps = json::array();
  for (int i = 0; i < 40; ++i) steps.push_back(json::parse(R"({"type": "Replace", "pattern": {"String": "a"}, "content": "aa"})"));
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", steps}};
  const auto tok = ax::parse_hf_tokenizer(j.dump(), "m/tokenizer.json");
  CHECK(tok->encode("b b").size() > 0);  // no "a": nothing grows
  CHECK_THROWS_WITH_AS(tok->encode(std::string(1000, 'a')),
                       doctest::Contains("m/tokenizer.json: normalizer: Replace would make the text longer than"), ax::UsageError);
  j["added_tokens"].push_back(json::parse(R"({"id": 8, "content": "aaaa", "special": false, "normalized": true})"));
  CHECK(error_of(j).find("m/tokenizer.json: normalizer: ") == 0);
  // A real normalizer chain stays far below the limit: NFKD of a ligature, spaces replaced.
  auto k = minimal_tokenizer();
  k["normalizer"]["normalizers"].push_back(json::parse(R"({"type": "NFKD"})"));
  CHECK(ax::parse_hf_tokenizer(k.dump(), "m/tokenizer.json")->encode("\uFDFA \uFDFA").size() > 0);
}

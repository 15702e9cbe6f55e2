// Chat-template parity: axengine's Jinja interpreter renders the real chat templates of Qwen3, Qwen2.5,
// Llama 3.1/3.2, Mistral, Gemma 3 and gpt-oss exactly as transformers does, on the committed conversations
// (tests/data/chat_templates/goldens, made by scripts/goldens/make_chat_template_goldens.py): the same text,
// the same refusals (raise_exception messages), and for a {% generation %} template the same assistant spans.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "jinja/jinja.hpp"
#include "jinja/value.hpp"

namespace {

using ax::jinja::Json;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open " << path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Byte offset of code point `cp` in a UTF-8 string (the goldens count Python str indices).
std::size_t byte_offset(const std::string& s, std::size_t cp) {
  std::size_t i = 0;
  for (std::size_t n = 0; n < cp && i < s.size(); ++n) {
    auto b = static_cast<unsigned char>(s[i]);
    i += b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : 4;
  }
  return i;
}

// Renders every golden conversation of one template; returns how many there were.
int check_template(const std::string& name) {
  const std::string dir = std::string(AXENGINE_TEST_DATA_DIR) + "/chat_templates/";
  ax::jinja::Template tmpl(slurp(dir + name + ".jinja"), name + ".jinja");
  std::istringstream golden(slurp(dir + "goldens/" + name + ".jsonl"));
  ax::jinja::RenderOptions opt;
  std::tm fixed{};  // the date the golden script pins strftime_now to: 2025-03-14 15:09:26
  fixed.tm_year = 125;
  fixed.tm_mon = 2;
  fixed.tm_mday = 14;
  fixed.tm_hour = 15;
  fixed.tm_min = 9;
  fixed.tm_sec = 26;
  opt.now = fixed;
  std::string line;
  int n = 0;
  while (std::getline(golden, line)) {
    ++n;
    Json row = Json::parse(line);
    Json extra = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    for (const auto& [k, v] : row["kwargs"].items()) extra[k] = v;
    Json ctx = ax::jinja::chat_context(row["messages"], row["tools"], row["add_generation_prompt"].get<bool>(), extra);
    INFO(name << " conversation " << n);
    if (row.contains("error")) {
      try {
        tmpl.render(ctx, opt);
        FAIL("rendered, but transformers refused it: " << row["error"].get<std::string>());
      } catch (const ax::jinja::Error& e) {
        CHECK(e.raised());
        CHECK(e.message() == row["error"].get<std::string>());
      }
      continue;
    }
    ax::jinja::RenderResult r = tmpl.render(ctx, opt);
    const std::string expected = row["expected"].get<std::string>();
    CHECK(r.text == expected);
    if (row.contains("generation")) {
      REQUIRE(r.generation.size() == row["generation"].size());
      for (std::size_t i = 0; i < r.generation.size(); ++i) {
        CHECK(r.generation[i].first == byte_offset(expected, row["generation"][i][0].get<std::size_t>()));
        CHECK(r.generation[i].second == byte_offset(expected, row["generation"][i][1].get<std::size_t>()));
      }
    } else {
      CHECK(r.generation.empty());
    }
  }
  return n;
}

}  // namespace

TEST_CASE("jinja parity: Qwen3 chat template") { CHECK(check_template("Qwen-Qwen3-0.6B") >= 40); }
TEST_CASE("jinja parity: Qwen2.5 chat template") { CHECK(check_template("Qwen-Qwen2.5-7B-Instruct") >= 40); }
TEST_CASE("jinja parity: Llama 3.1 chat template") { CHECK(check_template("meta-llama-Llama-3.1-8B-Instruct") >= 40); }
TEST_CASE("jinja parity: Llama 3.2 chat template") { CHECK(check_template("meta-llama-Llama-3.2-3B-Instruct") >= 40); }
TEST_CASE("jinja parity: Mistral chat template") { CHECK(check_template("mistralai-Mistral-Nemo-Instruct-2407") >= 40); }
TEST_CASE("jinja parity: Gemma 3 chat template") { CHECK(check_template("google-gemma-3-it") >= 40); }
TEST_CASE("jinja parity: gpt-oss chat template") { CHECK(check_template("openai-gpt-oss-120b") >= 40); }
TEST_CASE("jinja parity: Qwen3-VL chat template") { CHECK(check_template("Qwen-Qwen3-VL-8B-Instruct") >= 40); }
TEST_CASE("jinja parity: generation spans of a {% generation %} template") {
  CHECK(check_template("chatml-generation") >= 40);
}

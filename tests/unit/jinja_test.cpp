// The Jinja interpreter (core/src/jinja) feature by feature: each small template of
// tests/data/chat_templates/jinja_cases.json renders as transformers' Jinja environment renders it
// (scripts/goldens/make_jinja_case_goldens.py); errors name the line and column; hostile templates end in an
// error within their budgets instead of hanging or overflowing the stack.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "jinja/jinja.hpp"

namespace {

using ax::jinja::Json;

std::string render(const std::string& src, const Json& ctx = Json::object(), ax::jinja::RenderOptions opt = {}) {
  return ax::jinja::Template(src, "t.jinja").render(ctx, opt).text;
}

// The error a template gives, parsing or rendering ("" when it renders).
std::string error_of(const std::string& src, const Json& ctx = Json::object(), ax::jinja::RenderOptions opt = {}) {
  try {
    render(src, ctx, opt);
  } catch (const ax::jinja::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("jinja: each feature renders as transformers' Jinja does") {
  std::ifstream f(std::string(AXENGINE_TEST_DATA_DIR) + "/chat_templates/jinja_cases.json");
  REQUIRE(f.good());
  Json cases = Json::parse(f);
  REQUIRE(cases.size() >= 20);
  for (const Json& c : cases) {
    INFO("case " << c["name"].get<std::string>() << ": " << c["template"].get<std::string>());
    CHECK(render(c["template"].get<std::string>(), c["context"]) == c["expected"].get<std::string>());
  }
}

TEST_CASE("jinja: errors name the template, line and column") {
  CHECK(error_of("line one\n{{ x | nosuchfilter }}") == "t.jinja:2:6: no filter named 'nosuchfilter'");
  CHECK(error_of("{% if true %}\n  {{ 1 +  }}") == "t.jinja:2:11: unexpected '}}' in an expression");
  CHECK(error_of("{% for x in xs %}") == "t.jinja:1:18: unexpected end of template: expected {% else %}");
  CHECK(error_of("{{ 'abc") == "t.jinja:1:4: unterminated string literal");
  CHECK(error_of("a\n  {% frobnicate %}") == "t.jinja:2:6: unknown or unsupported tag 'frobnicate'");
  CHECK(error_of("{{ u.attr }}") == "t.jinja:1:5: 'u' is undefined");
  CHECK(error_of("{{ 1 + 'a' }}") == "t.jinja:1:6: unsupported operand type(s) for +: 'int' and 'str'");
  CHECK(error_of("{% for x in none %}{% endfor %}") == "t.jinja:1:13: 'NoneType' object is not iterable");
  CHECK(error_of("{{ x|tojson(indnet=2) }}", {{"x", 1}}) ==
        "t.jinja:1:5: tojson got an unexpected keyword argument 'indnet'");
}

TEST_CASE("jinja: out-of-range number literals (found by fuzzing)") {
  CHECK(render("{{ 1e999 }} {{ -1e999 }}") == "inf -inf");  // Python's float('1e999')
  CHECK(error_of("{{ x.99999999999999999999 }}") == "t.jinja:1:6: integer literal out of range");
  CHECK(error_of("{{ 99999999999999999999 }}") == "t.jinja:1:4: integer literal out of range");
}

TEST_CASE("jinja: raise_exception is the template's own message") {
  try {
    render("{{ raise_exception('roles must alternate') }}");
    FAIL("no error");
  } catch (const ax::jinja::Error& e) {
    CHECK(e.raised());
    CHECK(e.message() == "roles must alternate");
    CHECK(e.line() == 1);
  }
  try {
    render("{{ nope( }}");
    FAIL("no error");
  } catch (const ax::jinja::Error& e) {
    CHECK_FALSE(e.raised());
  }
}

TEST_CASE("jinja: generation spans are byte ranges of what the block rendered") {
  ax::jinja::Template t("a{% generation %}bé{% endgeneration %}c{% for i in [1, 2] %}{% generation %}{{ i }}{% endgeneration %}{% endfor %}");
  ax::jinja::RenderResult r = t.render(Json::object());
  CHECK(t.has_generation());
  CHECK(r.text == "abéc12");
  REQUIRE(r.generation.size() == 3);
  CHECK(r.generation[0] == std::pair<std::size_t, std::size_t>{1, 4});
  CHECK(r.generation[1] == std::pair<std::size_t, std::size_t>{5, 6});
  CHECK(r.generation[2] == std::pair<std::size_t, std::size_t>{6, 7});
  CHECK_FALSE(ax::jinja::Template("{{ 'generation' }}").has_generation());
}

TEST_CASE("jinja: strftime_now formats the pinned time") {
  ax::jinja::RenderOptions opt;
  std::tm tm{};
  tm.tm_year = 124;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  opt.now = tm;
  CHECK(render("{{ strftime_now('%d %b %Y') }}", Json::object(), opt) == "26 Jul 2024");
}

TEST_CASE("jinja: hostile templates stop within their budgets") {
  ax::jinja::RenderOptions opt;
  opt.max_steps = 100000;
  CHECK(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", Json::object(), opt)
            .find("evaluation budget") != std::string::npos);
  CHECK(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("macro calls nest deeper") != std::string::npos);
  CHECK(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nests too deeply") != std::string::npos);
  CHECK(error_of("{{ 'x' * 1000000000000 }}").find("budget") != std::string::npos);
  opt = {};
  opt.max_output_bytes = 1000;
  CHECK(error_of("{% for i in range(2000) %}x{% endfor %}", Json::object(), opt).find("output exceeds") != std::string::npos);
  CHECK(error_of("{{ range(1000000)|length }}").find("range too big") != std::string::npos);
  // A macro stored in a namespace could outlive the loop scope it closes over: refused.
  CHECK(error_of("{% set ns = namespace(f=none) %}{% for i in [1] %}{% macro m() %}{% endmacro %}{% set ns.f = m %}{% endfor %}")
            .find("holds data") != std::string::npos);
}

TEST_CASE("jinja: chat_context aliases reasoning fields as transformers does") {
  Json msgs = Json::parse(R"([{"role": "assistant", "content": "c", "reasoning_content": "r"}, {"role": "user", "content": "u"}])");
  Json ctx = ax::jinja::chat_context(msgs, nullptr, true, {{"bos_token", "<s>"}, {"messages", "ignored"}});
  CHECK(ctx["messages"][0].dump() == R"({"thinking":"r","role":"assistant","content":"c","reasoning_content":"r"})");
  CHECK(ctx["messages"][1].dump() == R"({"role":"user","content":"u"})");
  CHECK(ctx["tools"].is_null());
  CHECK(ctx["add_generation_prompt"] == true);
  CHECK(ctx["bos_token"] == "<s>");
}

// `axengine generate` and `axengine chat` end to end on a tiny Llama with a byte-level tokenizer: JSONL in and
// out, --max-new-tokens, --stop, chat rows through the model's template, bad rows named by file:line, and a
// piped chat conversation whose answers are generate's for the same conversation.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "unit/cli_util.hpp"

namespace fs = std::filesystem;
using ax::test::lines_of;
using ax::test::run;
using ax::test::slurp;

namespace {

// ChatML, as Qwen's templates write it.
const char* kTemplate =
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

std::vector<nlohmann::json> rows(const fs::path& p) {
  std::vector<nlohmann::json> out;
  for (const auto& l : lines_of(p)) out.push_back(nlohmann::json::parse(l));
  return out;
}

}  // namespace

TEST_CASE("cli generate: JSONL in and out, max tokens, stop strings, chat rows, bad rows") {
  auto dir = ax::test::scratch_dir("cli_generate");
  ax::test::make_tiny_llama(dir / "model");
  std::ofstream(dir / "in.jsonl") << "{\"prompt\": \"The sum of 2 and 3 is\", \"id\": 7}\n\n"
                                  << "{\"prompt\": \"abc\"}\n{\"prompt\": \"Hello, world\"}\n";
  const std::string model = (dir / "model").string(), in = (dir / "in.jsonl").string();
  REQUIRE(run({"generate", "--model", model, "--input", in, "--output", (dir / "out.jsonl").string(), "--max-new-tokens", "12"},
              dir / "gen.log") == 0);
  auto out = rows(dir / "out.jsonl");
  REQUIRE(out.size() == 3);
  CHECK(out[0]["id"] == 7);
  CHECK(!out[1].contains("id"));
  std::size_t with_ascii = 3;
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& r = out[i];
    CHECK(r["tokens"].size() <= 12);
    CHECK((r["finish_reason"] == "eos" || (r["finish_reason"] == "length" && r["tokens"].size() == 12)));
    const std::string t = r["text"];
    if (with_ascii == 3 && t.size() > 2 && t.find_first_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 1) != std::string::npos)
      with_ascii = i;
  }
  // The same run with a stop string taken from an answer: that answer ends before its first occurrence.
  REQUIRE(with_ascii < 3);
  const std::string full = out[with_ascii]["text"];
  const std::string stop(1, full[full.find_first_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 1)]);
  REQUIRE(run({"generate", "--model", model, "--input", in, "--output", (dir / "stop.jsonl").string(), "--max-new-tokens",
               "12", "--stop", stop, "--stop", "\x01\x02"},
              dir / "stop.log") == 0);
  auto cut = rows(dir / "stop.jsonl");
  CHECK(cut[with_ascii]["text"] == full.substr(0, full.find(stop)));
  CHECK(cut[with_ascii]["finish_reason"] == "stop");
  const auto all = out[with_ascii]["tokens"].get<std::vector<int>>(), some = cut[with_ascii]["tokens"].get<std::vector<int>>();
  CHECK(std::equal(some.begin(), some.end(), all.begin()));  // the same tokens, fewer of them

  // --max-new-tokens 3: every answer is a prefix of the longer one.
  REQUIRE(run({"generate", "--model", model, "--input", in, "--output", (dir / "short.jsonl").string(), "--max-new-tokens", "3"},
              dir / "short.log") == 0);
  auto s = rows(dir / "short.jsonl");
  for (std::size_t i = 0; i < 3; ++i) {
    auto a = s[i]["tokens"].get<std::vector<int>>(), b = out[i]["tokens"].get<std::vector<int>>();
    CHECK(a.size() <= 3);
    CHECK(std::equal(a.begin(), a.end(), b.begin()));
  }

  // A chat row needs the model's template.
  std::ofstream(dir / "chat.jsonl") << "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n";
  CHECK(run({"generate", "--model", model, "--input", (dir / "chat.jsonl").string(), "--output", (dir / "c.jsonl").string()},
            dir / "notemplate.log") == 2);
  CHECK(slurp(dir / "notemplate.log").find("has no chat template") != std::string::npos);
  std::ofstream(dir / "model/chat_template.jinja") << kTemplate;
  REQUIRE(run({"generate", "--model", model, "--input", (dir / "chat.jsonl").string(), "--output", (dir / "c.jsonl").string(),
               "--max-new-tokens", "5"},
              dir / "chat.log") == 0);
  // --chat wraps a prompt row as that same user message.
  std::ofstream(dir / "hi.jsonl") << "{\"prompt\": \"hi\"}\n";
  REQUIRE(run({"generate", "--model", model, "--input", (dir / "hi.jsonl").string(), "--output", (dir / "h.jsonl").string(),
               "--max-new-tokens", "5", "--chat"},
              dir / "wrap.log") == 0);
  CHECK(rows(dir / "c.jsonl")[0]["tokens"] == rows(dir / "h.jsonl")[0]["tokens"]);
  CHECK(run({"generate", "--model", model, "--input", (dir / "chat.jsonl").string(), "--output", (dir / "c.jsonl").string(), "--raw"},
            dir / "raw.log") == 2);

  // Bad rows: named by file and line, before anything loads.
  for (const auto& [row, msg] : std::vector<std::pair<std::string, std::string>>{
           {"{\"promt\": \"x\"}", "unknown key \"promt\""},
           {"[1, 2]", "a row must be a JSON object"},
           {"{\"prompt\": 3}", "\"prompt\" must be a string"},
           {"{\"prompt\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"b\"}]}", "a row needs exactly one of"},
           {"{\"messages\": [{\"content\": \"b\"}]}", "messages[0] must be an object with a string \"role\""},
           {"{\"prompt\": ", "not valid JSON"}}) {
    CAPTURE(row);
    std::ofstream(dir / "bad.jsonl") << "{\"prompt\": \"fine\"}\n" << row << "\n";
    CHECK(run({"generate", "--model", model, "--input", (dir / "bad.jsonl").string(), "--output", (dir / "b.jsonl").string()},
              dir / "bad.log") == 2);
    const std::string log = slurp(dir / "bad.log");
    CHECK(log.find((dir / "bad.jsonl").string() + ":2: " + msg) != std::string::npos);
  }
  CHECK(!fs::exists(dir / "b.jsonl"));
  CHECK(run({"generate", "--model", model, "--input", in, "--output", (dir / "x.jsonl").string(), "--top-p", "0"}, dir / "topp.log") == 2);
  ax::test::remove_tree(dir);
}

TEST_CASE("cli chat: piped turns, each answer generate's for the conversation so far; /reset; no template refused") {
  auto dir = ax::test::scratch_dir("cli_chat");
  ax::test::make_tiny_llama(dir / "model");
  const std::string model = (dir / "model").string(), bin = std::string(AXENGINE_BIN_DIR) + "/axengine";
  auto chat = [&](const std::string& input, const std::string& tag) {
    std::ofstream(dir / (tag + ".in")) << input;
    const std::string cmd = "OMP_NUM_THREADS=1 " + bin + " chat --model " + model + " --max-new-tokens 6 --stop '\n' < " +
                            (dir / (tag + ".in")).string() + " > " + (dir / (tag + ".out")).string() + " 2> " +
                            (dir / (tag + ".err")).string();
    const int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  CHECK(chat("hi\n", "none") == 2);
  CHECK(slurp(dir / "none.err").find("has no chat template") != std::string::npos);

  std::ofstream(dir / "model/chat_template.jinja") << kTemplate;
  REQUIRE(chat("hi\nmore please\n/reset\nhi\n/exit\nnot read\n", "talk") == 0);
  const auto answers = lines_of(dir / "talk.out");
  REQUIRE(answers.size() == 3);
  CHECK(answers[2] == answers[0]);  // /reset: the same first turn again

  // generate over the same conversations gives the same answers.
  nlohmann::json turn1 = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  nlohmann::json turn2 = {{"messages",
                           {{{"role", "user"}, {"content", "hi"}},
                            {{"role", "assistant"}, {"content", answers[0]}},
                            {{"role", "user"}, {"content", "more please"}}}}};
  std::ofstream(dir / "conv.jsonl") << turn1.dump() << "\n" << turn2.dump() << "\n";
  REQUIRE(run({"generate", "--model", model, "--input", (dir / "conv.jsonl").string(), "--output", (dir / "conv.out").string(),
               "--max-new-tokens", "6", "--stop", "\n"},
              dir / "conv.log") == 0);
  auto got = rows(dir / "conv.out");
  CHECK(got[0]["text"] == answers[0]);
  CHECK(got[1]["text"] == answers[1]);
  ax::test::remove_tree(dir);
}

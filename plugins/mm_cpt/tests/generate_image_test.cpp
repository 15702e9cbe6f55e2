// `axengine generate` / `axengine chat` with images, through the CLI on the CPU (the images processed by this
// plugin, loaded beside the executable): --image puts image parts before the first user message's text, so it
// answers exactly as the same row with the parts written in it does; chat answers as generate; a missing or
// undecodable image, --image for a text-only family, or more images than the template writes markers for exit 2
// naming the file / row. The decode's tokens against transformers: tests/unit/model_vl_generate_test.cpp.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "axengine/models.hpp"
#include "e2e_util.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;
using nlohmann::json;
using mm_e2e::slurp;

namespace {

struct Family {
  const char* preset;
  const char* template_file;  // under tests/data/chat_templates ("": the preset writes its own)
};
constexpr Family kFamilies[] = {{"tiny-qwen2_5-vl", "Qwen-Qwen2.5-VL-7B-Instruct.jinja"},
                                {"tiny-qwen3-vl", "Qwen-Qwen3-VL-8B-Instruct.jinja"},
                                {"tiny-gemma3-mm", ""}};

// dir/model (the preset, with the chat template) and dir/img (the committed images).
fs::path make_dir(const std::string& preset, const std::string& template_file) {
  const fs::path dir = mm_e2e::corpus("mm_generate", preset, "");
  ax::init_model_dir(preset, (dir / "model").string(), 1);
  if (!template_file.empty())
    fs::copy_file(std::string(AXENGINE_SOURCE_DIR) + "/tests/data/chat_templates/" + template_file, dir / "model/chat_template.jinja",
                  fs::copy_options::overwrite_existing);
  return dir;
}

struct Cli {
  int rc = -1;
  std::string out, err;
};

// `axengine <args>` in `dir` (stdin from `input` when given), on the CPU (generate / chat: --device; run: its key).
Cli cli(const fs::path& dir, const std::string& args, const std::string& input = "") {
  const bool run = args.rfind("run ", 0) == 0;
  std::string cmd = "cd '" + dir.string() + "' && AXENGINE_CACHE_DIR=cache " + AXENGINE_BIN + " " + args +
                    (run ? " --set device.type=cpu" : " --device cpu");
  if (!input.empty()) {
    std::ofstream(dir / "stdin.txt") << input;
    cmd += " < stdin.txt";
  }
  cmd += " > cli.out 2> cli.err";
  Cli c;
  const int status = std::system(cmd.c_str());
  c.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  c.out = slurp(dir / "cli.out");
  c.err = slurp(dir / "cli.err");
  return c;
}

json user(const json& content) { return {{"role", "user"}, {"content", content}}; }

void write_rows(const fs::path& file, const std::vector<json>& rows) {
  std::ofstream out(file);
  for (const auto& r : rows) out << json{{"messages", r}}.dump() << "\n";
}

std::string generate_args(const std::string& input, const std::string& extra = "") {
  return "generate --model model --input " + input + " --output " + input + ".out --max-new-tokens 6 --batch-size 2" + extra;
}

}  // namespace

TEST_CASE("generate / chat --image: the images go before the first user message's text, as image parts written in the row") {
  for (const Family& f : kFamilies) {
    CAPTURE(f.preset);
    const fs::path dir = make_dir(f.preset, f.template_file);
    const json system = {{"role", "system"}, {"content", "Be brief."}};
    // Rows of different lengths, decoded together: a system message first, a longer question.
    write_rows(dir / "plain.jsonl", {json::array({system, user("What is it?")}), json::array({user("And what is this one, then?")})});
    const json a = {{"type", "image"}, {"image", "img/a.jpg"}}, b = {{"type", "image_url"}, {"image_url", {{"url", "img/b.png"}}}};
    write_rows(dir / "parts.jsonl", {json::array({system, user(json::array({a, b, {{"type", "text"}, {"text", "What is it?"}}}))}),
                                     json::array({user(json::array({a, b, {{"type", "text"}, {"text", "And what is this one, then?"}}}))})});
    auto answers = [&](const std::string& input, const std::string& extra) {
      Cli c = cli(dir, generate_args(input, extra));
      INFO(c.err);
      REQUIRE(c.rc == 0);
      return mm_e2e::lines(dir / (input + ".out"));
    };
    const auto with_flag = answers("plain.jsonl", " --image img/a.jpg --image img/b.png");
    const auto with_parts = answers("parts.jsonl", "");
    const auto text_only = answers("plain.jsonl", "");
    REQUIRE(with_flag.size() == 2);
    REQUIRE(with_parts.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      CAPTURE(i);
      CHECK(with_flag[i]["tokens"] == with_parts[i]["tokens"]);
      CHECK(with_flag[i]["prompt_tokens"] == with_parts[i]["prompt_tokens"]);
    }
    // The images' tokens are in the prompt (the text-only run is shorter by them).
    CHECK(text_only[0]["prompt_tokens"].get<int64_t>() < with_parts[0]["prompt_tokens"].get<int64_t>());
    // chat: the same conversation's answers, streamed; the second turn re-renders the conversation, images and all.
    const std::string first = with_parts[0]["text"].get<std::string>();
    write_rows(dir / "turn2.jsonl", {json::array({system, user(json::array({a, b, {{"type", "text"}, {"text", "What is it?"}}})),
                                                  {{"role", "assistant"}, {"content", first}}, user("And now?")})});
    const auto second = answers("turn2.jsonl", "");
    Cli chat = cli(dir, "chat --model model --system 'Be brief.' --max-new-tokens 6 --image img/a.jpg --image img/b.png",
                   "What is it?\nAnd now?\n");
    INFO(chat.err);
    REQUIRE(chat.rc == 0);
    CHECK(chat.out == first + "\n" + second[0]["text"].get<std::string>() + "\n");
    fs::remove_all(dir);
  }
}

TEST_CASE("generate / chat --image: bad images and families without images exit 2 naming the file and row") {
  const fs::path dir = make_dir("tiny-qwen2_5-vl", "Qwen-Qwen2.5-VL-7B-Instruct.jinja");
  write_rows(dir / "in.jsonl", {json::array({user("Hi.")}), json::array({user(json::array({{{"type", "image"}, {"image", "img/nope.png"}}}))})});
  write_rows(dir / "one.jsonl", {json::array({user("Hi.")})});
  std::ofstream(dir / "img/broken.png") << "not an image at all";
  auto refused = [&](const Cli& c, const std::vector<std::string>& words) {
    INFO(c.err);
    CHECK(c.rc == 2);
    for (const auto& w : words) CHECK(c.err.find(w) != std::string::npos);
  };
  // A missing --image file (every row takes it: the first names it), a row's own missing image, an undecodable one.
  refused(cli(dir, generate_args("in.jsonl", " --image img/missing.jpg")), {"in.jsonl:1", "missing.jpg"});
  refused(cli(dir, generate_args("in.jsonl")), {"in.jsonl:2", "nope.png"});
  refused(cli(dir, generate_args("one.jsonl", " --image img/broken.png")), {"one.jsonl:1", "broken.png"});
  refused(cli(dir, "chat --model model --image img/missing.jpg", "Hi.\n"), {"missing.jpg"});
  // --image with a raw "prompt" row: there is no user message to put it in.
  std::ofstream(dir / "raw.jsonl") << R"({"prompt": "Hi."})" "\n";
  refused(cli(dir, generate_args("raw.jsonl", " --image img/a.jpg")), {"raw.jsonl:1", "--image"});
  // More images than the template writes markers for: a template that renders text parts only.
  std::ofstream(dir / "model/chat_template.jinja")
      << "{% for m in messages %}{{ m.role }}: {% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
         "{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}\n{% endfor %}assistant:";
  refused(cli(dir, generate_args("one.jsonl", " --image img/a.jpg")), {"one.jsonl:1", "wrote 0 image marker(s)", "1 image(s)"});
  // A text-only family.
  const fs::path text = make_dir("tiny-qwen2", "Qwen-Qwen2.5-VL-7B-Instruct.jinja");
  write_rows(text / "one.jsonl", {json::array({user("Hi.")})});
  refused(cli(text, generate_args("one.jsonl", " --image img/a.jpg")), {"one.jsonl:1", "model_type 'qwen2'", "takes no images"});
  refused(cli(text, "chat --model model --image img/a.jpg", "Hi.\n"), {"model_type 'qwen2'", "takes no images"});
  fs::remove_all(dir);
  fs::remove_all(text);
}

// eval.exact_match on a vision-language model: each eval prompt (an mm_cpt row's image, then its text to produce)
// is prefilled with its sample's images; before the family could generate, exact_match was skipped.
TEST_CASE("eval.exact_match on tiny-qwen2_5-vl generates after each eval prompt's images") {
  const fs::path dir = mm_e2e::scratch("mm_generate", "exact_match");
  const std::string corpus = std::string(MM_CPT_PYTHON) + " " + AXENGINE_SOURCE_DIR + "/scripts/make-mm-corpus.py " +
                             (dir / "data/mm").string() + " --rows 24 --seed 1 > " + (dir / "corpus.log").string() + " 2>&1";
  REQUIRE_MESSAGE(std::system(corpus.c_str()) == 0, "make-mm-corpus.py failed (numpy and Pillow in AXENGINE_PYTHON?): ", corpus);
  ax::init_model_dir("tiny-qwen2_5-vl", (dir / "model").string(), 1);
  fs::create_directories(dir / "configs");
  fs::copy_file(std::string(AXENGINE_SOURCE_DIR) + "/configs/qwen2_5-vl-mm-cpt.toml", dir / "configs/mm.toml");
  std::string args = "run --config configs/mm.toml";
  for (const char* s : {"model.path=../model", "data.sequence_len=512", "data.eval_fraction=0.5", "train.max_steps=1",
                        "train.micro_batch_size=1", "train.grad_accum=1", "train.cpu_threads=1", "eval.exact_match=true",
                        "eval.max_new_tokens=512", "eval.max_samples=4", "lora.dropout=0.0"})
    args += std::string(" --set '") + s + "'";
  Cli c = cli(dir, args);
  INFO(c.err);
  REQUIRE(c.rc == 0);
  CHECK(c.err.find("exact_match: skipped") == std::string::npos);
  bool reported = false;
  for (const auto& row : mm_e2e::lines(dir / "runs/qwen2_5-vl-mm-cpt/metrics.jsonl")) reported |= row.contains("exact_match");
  CHECK(reported);
  fs::remove_all(dir);
}

// The summary `run` ends with: one line that says where the adapter is and the exact commands to chat with it (or,
// for a model without a chat template, to prompt it), merge it and open the report. The commands are run as
// printed: chat answers, generate writes answers, merge writes a model.
#include <doctest/doctest.h>

#include <filesystem>
#include <sstream>

#include "test_util.hpp"
#include "unit/tiny_model.hpp"

namespace fs = std::filesystem;

namespace {

// The text after `label` up to the next "; " (or the end of the line).
std::string field(const std::string& line, const std::string& label) {
  auto b = line.find(label);
  if (b == std::string::npos) return "";
  b += label.size();
  auto e = line.find("; ", b);
  return line.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

// Trains the tiny model in `dir`/"my model" for 2 steps; the summary's "next" line.
std::string train_and_summarise(const ax_test::TempDir& dir, const std::string& env) {
  auto r = ax_test::run(env + ax_test::axengine() + " make-data --task arithmetic --digits 1 --train 40 --eval 8 --out " + (dir / "data"));
  REQUIRE(r.exit_code == 0);
  ax_test::write_file(dir / "run.toml",
                      "[run]\noutput_dir = \"out\"\n[model]\npath = \"my model\"\n[data]\nsequence_len = 64\n"
                      "[[datasets]]\ntype = \"completion\"\npath = \"data/train.jsonl\"\neval_path = \"data/eval.jsonl\"\n"
                      "prompt_field = \"prompt\"\ntext_field = \"answer\"\n[lora]\nr = 4\nalpha = 8\n"
                      "[train]\nmax_steps = 2\nmicro_batch_size = 2\ncpu_threads = 1\n[eval]\nexact_match = false\n");
  r = ax_test::run(env + ax_test::axengine() + " run --config " + (dir / "run.toml"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::string line;
  std::istringstream in(r.output);
  for (std::string l; std::getline(in, l);)
    if (l.find("  next            adapter ") != std::string::npos) line = l;
  REQUIRE(!line.empty());
  return line;
}

}  // namespace

TEST_CASE("run summary: one line with the adapter and the commands to chat, merge and open the report, which work") {
  ax_test::TempDir dir;
  ax::test::make_tiny_llama(dir.path / "my model");  // a space: the printed commands quote it
  ax_test::write_file(dir / "my model/chat_template.jinja", "{% for m in messages %}{{ m['content'] }}{% endfor %}");
  const std::string env = "AXENGINE_CACHE_DIR=" + (dir / "prepared") + " OMP_NUM_THREADS=1 PATH=/usr/bin:/bin ";
  const std::string line = train_and_summarise(dir, env);
  const std::string adapter = field(line, "next            adapter ");
  CHECK(fs::exists(adapter + "/adapter_config.json"));
  // No axengine on PATH: the commands name this executable.
  const std::string chat = field(line, "chat: "), merge = field(line, "merge: "), report = field(line, "report: ");
  CHECK(chat == ax_test::axengine() + " chat --model '" + (dir / "my model") + "' --adapter " + adapter);
  CHECK(merge == ax_test::axengine() + " merge-lora --config " + (dir / "run.toml") + " --adapter " + adapter + " --out " +
                     (dir / "out/merged"));
  CHECK(report == "xdg-open " + (dir / "out/report.html"));
  CHECK(fs::exists(dir / "out/report.html"));
  auto c = ax_test::run("echo '1+1=' | " + env + chat + " --max-new-tokens 3");
  CHECK_MESSAGE(c.exit_code == 0, c.output);
  auto m = ax_test::run(env + merge);
  CHECK_MESSAGE(m.exit_code == 0, m.output);
  CHECK(fs::exists(dir / "out/merged/config.json"));
}

TEST_CASE("run summary: a model without a chat template gets the generate command, which works") {
  ax_test::TempDir dir;
  ax::test::make_tiny_llama(dir.path / "my model");
  const std::string env = "AXENGINE_CACHE_DIR=" + (dir / "prepared") + " OMP_NUM_THREADS=1 PATH=/usr/bin:/bin ";
  const std::string line = train_and_summarise(dir, env);
  CHECK(line.find("; chat: ") == std::string::npos);
  const std::string gen = field(line, "prompt it (no chat template for chat): ");
  const std::string adapter = field(line, "next            adapter ");
  CHECK(gen == ax_test::axengine() + " generate --model '" + (dir / "my model") + "' --adapter " + adapter +
                   " --input PROMPTS.jsonl --output ANSWERS.jsonl (rows {\"prompt\": \"...\"})");
  ax_test::write_file(dir / "PROMPTS.jsonl", "{\"prompt\": \"1+1=\"}\n");
  auto g = ax_test::run("cd '" + dir.path.string() + "' && " + env + gen.substr(0, gen.find(" (rows")) + " --max-new-tokens 2");
  CHECK_MESSAGE(g.exit_code == 0, g.output);
  CHECK(fs::exists(dir / "ANSWERS.jsonl"));
}

// The inputs that used to hang the CLI (issue 44, "Six hangs"; the seventh, num_hidden_layers = 10^9, is the
// config-size check's), each fed to the binary under `timeout`: each must end within the limit, with its message.
//   1. an mm_cpt image path that is a FIFO: validate (on_bad_row = "error") and run (on_bad_row = "skip");
//   2. data.sequence_len = 1,048,576 for 500 tokens: validate warns that the rows are almost all padding, and
//      run refuses when the activations cannot fit the memory it may use (here RLIMIT_AS, ulimit -v);
//   3. a 1 MB prompt in generate, and a 1 MB line in chat: refused by the model's max_position_embeddings.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "unit/cli_util.hpp"

namespace fs = std::filesystem;
using ax::test::slurp;

namespace {

constexpr int kLimitSeconds = 60;  // `timeout`: far beyond what each case takes, far below a hang

struct Outcome {
  int rc = -1;
  double seconds = 0;
  std::string output;
};

// `axengine ARGS` under timeout (stdin from `input`, or /dev/null), in `shell_prefix`'s environment (ulimit...).
Outcome axengine(const fs::path& dir, const std::string& tag, const std::string& args, const std::string& input = "/dev/null",
                 const std::string& shell_prefix = "") {
  const fs::path log = dir / (tag + ".log");
  const std::string cmd = "timeout " + std::to_string(kLimitSeconds) + " sh -c '" + shell_prefix + "OMP_NUM_THREADS=1 exec " +
                          std::string(AXENGINE_BIN_DIR) + "/axengine " + args + "' < " + input + " > " + log.string() + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  const int st = std::system(cmd.c_str());
  Outcome o;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  o.output = slurp(log);
  MESSAGE(tag, ": exit ", o.rc, " after ", o.seconds, " s");
  return o;
}

bool has(const Outcome& o, const std::string& text) { return o.output.find(text) != std::string::npos; }

// This process's address space in use (VmSize), in KiB: the test's own libraries are the CLI's too.
long vm_size_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmSize:", 0) == 0) return std::stol(line.substr(7));
  return 0;
}

}  // namespace

TEST_CASE("hangs: an mm_cpt image that is a FIFO ends validate and run at once (error and skip)") {
  if (!fs::exists(std::string(AXENGINE_PLUGIN_DIR) + "/axengine_mm_cpt.so")) {
    MESSAGE("skipped: this build has no mm_cpt plugin (libjpeg, libpng, libwebp not found)");
    return;
  }
  auto dir = ax::test::scratch_dir("hang_fifo");
  REQUIRE(ax::test::run({"init-model", "--preset", "tiny-qwen2_5-vl", "--out", (dir / "vl").string()}, dir / "init.log") == 0);
  REQUIRE(::mkfifo((dir / "pipe.png").c_str(), 0600) == 0);
  {
    std::ofstream rows(dir / "rows.jsonl");
    for (int i = 0; i < 6; ++i) rows << "{\"text\": \"a caption of a field, number " << i << "\"}\n";
    rows << "{\"text\": \"a photo <image> of a pipe\", \"images\": [\"pipe.png\"]}\n";
  }
  for (const std::string skip : {"error", "skip"}) {
    std::ofstream(dir / (skip + ".toml")) << "[run]\noutput_dir = \"out_" << skip << "\"\n[model]\npath = \"vl\"\n"
                                          << "[data]\nsequence_len = 128\ncache_dir = \"cache\"\n"
                                          << "[[datasets]]\ntype = \"mm_cpt\"\npath = \"rows.jsonl\"\non_bad_row = \"" << skip << "\"\n"
                                          << "[lora]\nr = 4\nalpha = 8\n[train]\nmax_steps = 1\nmicro_batch_size = 1\nwarmup_steps = 0\n";
  }
  const std::string refusal = (dir / "pipe.png").string() + ": not a regular file (a FIFO); expected an image file";
  Outcome v = axengine(dir, "fifo_validate", "validate --config " + (dir / "error.toml").string());
  INFO(v.output);
  CHECK(v.rc == 2);
  CHECK(has(v, "rows.jsonl:7: " + refusal));
  Outcome r = axengine(dir, "fifo_run_skip", "run --config " + (dir / "skip.toml").string());
  INFO(r.output);
  CHECK(r.rc == 0);
  CHECK(has(r, "1 bad rows skipped"));
  ax::test::remove_tree(dir);
}

TEST_CASE("hangs: data.sequence_len = 1048576 for 500 tokens warns at validate and is refused where it cannot fit") {
  auto dir = ax::test::setup_run("hang_seq", "max_steps = 1\n");
  const std::string cfg = (dir / "run.toml").string(), sets = " --set data.sequence_len=1048576 --set train.micro_batch_size=1 --set device.type=cpu";
  Outcome v = axengine(dir, "seq_validate", "validate --config " + cfg + sets);
  INFO(v.output);
  CHECK(v.rc == 0);
  CHECK(has(v, "data.sequence_len = 1048576: the packed rows are 0.049 % filled (514 tokens in 1 row(s) of 1048576; the "
               "longest sample has 7 tokens): every step computes the padding too. Lower data.sequence_len"));
  CHECK(has(v, "memory   at least 8.1 GiB of activations a micro-batch (1 x 1048576 tokens x 2 layers + logits over a "
               "vocabulary of 260 + attention scores); "));
  // The activations of one micro-batch are at least 8.1 GiB here (2 layers of hidden 64, the reference loss's
  // logits over 260 tokens, 2^20 tokens): a run allowed 4 GiB more address space than a process of the engine
  // holds is refused before any weight loads.
  const long limit_kib = vm_size_kib() + 4L * 1024 * 1024;
  Outcome r = axengine(dir, "seq_run", "run --config " + cfg + sets, "/dev/null", "ulimit -v " + std::to_string(limit_kib) + "; ");
  INFO(r.output);
  CHECK(r.rc == 2);
  CHECK(has(r, "data.sequence_len = 1048576 (with train.micro_batch_size = 1) needs at least "));
  CHECK(has(r, "RLIMIT_AS (ulimit -v) less the address space in use): it cannot run here"));
  CHECK_FALSE(fs::exists(dir / "out" / "metrics.jsonl"));
  ax::test::remove_tree(dir);
}

TEST_CASE("hangs: a 1 MB prompt in generate and a 1 MB line in chat are refused by max_position_embeddings") {
  auto dir = ax::test::scratch_dir("hang_prompt");
  ax::test::make_tiny_llama(dir / "model");  // max_position_embeddings 512
  std::ofstream(dir / "model" / "chat_template.jinja")
      << "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  std::string big;
  while (big.size() < (1u << 20)) big += "the quick brown fox jumps over the lazy dog ";
  std::ofstream(dir / "in.jsonl") << "{\"prompt\": \"short\"}\n{\"prompt\": \"" << big << "\"}\n";
  std::ofstream(dir / "line.txt") << big << "\n";
  const std::string model = (dir / "model").string();
  Outcome g = axengine(dir, "generate_1mb", "generate --model " + model + " --input " + (dir / "in.jsonl").string() +
                                                " --output " + (dir / "out.jsonl").string());
  CHECK(g.rc == 2);
  CHECK(has(g, (dir / "in.jsonl").string() + ":2: the prompt is "));
  CHECK(has(g, "tokens, more than the model's max_position_embeddings (512, "));
  CHECK_FALSE(fs::exists(dir / "out.jsonl"));
  // --max-prompt-tokens sets another limit: the short prompt passes it, and a lower one refuses it.
  Outcome lower = axengine(dir, "generate_limit", "generate --model " + model + " --input " + (dir / "in.jsonl").string() +
                                                      " --output " + (dir / "out.jsonl").string() + " --max-prompt-tokens 1");
  CHECK(lower.rc == 2);
  CHECK(has(lower, ":1: the prompt is 5 tokens, more than --max-prompt-tokens 1"));
  Outcome c = axengine(dir, "chat_1mb", "chat --model " + model, (dir / "line.txt").string());
  CHECK(c.rc == 2);
  CHECK(has(c, "chat: input line 1: the conversation with this turn is "));
  CHECK(has(c, "tokens, more than the model's max_position_embeddings (512, "));
  ax::test::remove_tree(dir);
}

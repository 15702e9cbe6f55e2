// `axengine validate` checks what `run` checks before its first step (they call the same function): for each
// class of bad config both exit 2 with the same one-line message; a good config passes both. An arch override
// plans on any machine but stops `run` with one line where that GPU is absent. The shipped configs validate
// against tiny models of their families.
#include <doctest/doctest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "unit/tiny_model.hpp"
#include "unit/validate_run_dir.hpp"

using namespace ax_test;

namespace {

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  auto pos = text.find(from);
  REQUIRE(pos != std::string::npos);
  return text.replace(pos, from.size(), to);
}

// The line of `output` holding `needle` ("" when none does).
std::string line_with(const std::string& output, const std::string& needle) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) return line;
  return "";
}

bool has_backtrace(const std::string& output) {
  return output.find("frame #") != std::string::npos || output.find("Exception raised from") != std::string::npos;
}

// Whether `needle` occurs in a TOML text outside its comments.
bool names_outside_comments(const std::string& toml, const std::string& needle) {
  std::istringstream in(toml);
  for (std::string line; std::getline(in, line);)
    if (line.substr(0, line.find('#')).find(needle) != std::string::npos) return true;
  return false;
}

struct BadCase {
  const char* what;
  std::string config;  // run.toml's text
  std::string args;    // extra command-line arguments (--set ...)
  std::string expect;  // in the error line
};

}  // namespace

TEST_CASE("validate cli: a good config passes validate and run and a resume that no longer fits fails both") {
  TempDir dir;
  make_run_dir(dir);
  auto v = run(env(dir) + axengine() + " validate --config " + (dir / "run.toml"));
  INFO(v.output);
  CHECK(v.exit_code == 0);
  CHECK(v.output.find("run.toml: ok") != std::string::npos);
  CHECK(v.output.find("model    llama: 2 layers, hidden 64; LoRA on 14 modules") != std::string::npos);
  CHECK(v.output.find("data     80 train / 20 eval samples") != std::string::npos);
  CHECK(v.output.find("kernels  ") != std::string::npos);
  CHECK(!std::filesystem::exists(dir.path / "out"));  // validate trains nothing, writes no run output

  auto r = run(env(dir) + axengine() + " run --config " + (dir / "run.toml"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("done: 2 steps") != std::string::npos);

  // Resuming: validate --resume finds the checkpoint run left; one from another batch size fails both the same way.
  v = run(env(dir) + axengine() + " validate --resume --config " + (dir / "run.toml"));
  INFO(v.output);
  CHECK(v.exit_code == 0);
  CHECK(v.output.find("resume   from " + (dir / "out/checkpoints/step-00000002") + " at step 2") != std::string::npos);
  const std::string other_batch = " --set train.micro_batch_size=1";
  v = run(env(dir) + axengine() + " validate --resume --config " + (dir / "run.toml") + other_batch);
  r = run(env(dir) + axengine() + " run --resume --config " + (dir / "run.toml") + other_batch);
  INFO(v.output);
  INFO(r.output);
  CHECK(v.exit_code == 2);
  CHECK(r.exit_code == 2);
  const std::string line = line_with(v.output, "checkpoint has steps_per_epoch = ");
  CHECK(!line.empty());
  CHECK(line == line_with(r.output, "checkpoint has steps_per_epoch = "));
}

TEST_CASE("validate cli: run and validate refuse each bad config with exit 2 and the same line") {
  TempDir dir;
  make_run_dir(dir);
  // A MoE model for the backend check: strict, and the only listed backend (a test plugin's) needs a CPU while
  // the config plans for an sm_90 GPU.
  REQUIRE(run(env(dir) + axengine() + " init-model --preset tiny-qwen3-moe --out " + (dir / "moe")).exit_code == 0);
  const std::string good = good_config();
  const std::vector<BadCase> cases = {
      {"empty config", "", "", "[model] path is required"},
      {"model path missing", good, "--set model.path=no_such_model", "model.path: " + (dir / "no_such_model") + " does not exist"},
      {"dataset type unknown", replaced(good, "type = \"completion\"", "type = \"completions\""), "",
       "unknown dataset type \"completions\" (known: "},
      {"data path missing", replaced(good, "data/train.jsonl", "data/no_such.jsonl"), "",
       "datasets[0].path: " + (dir / "data/no_such.jsonl") + " does not exist"},
      {"eval path missing", replaced(good, "data/eval.jsonl", "data/no_eval.jsonl"), "",
       "datasets[0].eval_path: " + (dir / "data/no_eval.jsonl") + " does not exist"},
      {"lora target matches no module", good, "--set 'lora.targets=[\"q_proj\", \"w1\"]'",
       "lora: target 'w1' matches no module of this llama model"},
      {"batch larger than the data", good, "--set train.micro_batch_size=64", "fewer than one step needs (micro_batch_size 64 x grad_accum 1)"},
      {"backend named that nothing provides", good, "--set 'kernels.attention=[\"flash9000\", \"reference\"]'",
       "kernels.attention names backend \"flash9000\", which neither a built-in nor a loaded plugin provides for attention"},
      {"no backend fits under strict", good,
       "--set model.path=moe --set kernels.strict=true --set device.arch=sm_90 --set 'kernels.attention=[\"conf_correct\"]' "
       "--set 'plugins.paths=[\"" + std::string(AXENGINE_TEST_PLUGIN_DIR) + "/conformance/axengine_conf_correct.so\"]'",
       "kernels.strict: no backend for attention (dtype bf16) on sm_90 from [kernels] — conf_correct: needs cpu"},
      {"resume dir not a checkpoint", good, "--set checkpoint.resume_from=model", "model: not a checkpoint"},
      {"optimizer not registered", good, "--set train.optimizer=sgd", "train.optimizer \"sgd\" is not registered"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    write_file(dir / "run.toml", c.config);
    auto v = run(env(dir) + axengine() + " validate --config " + (dir / "run.toml") + " " + c.args);
    auto r = run(env(dir) + axengine() + " run --config " + (dir / "run.toml") + " " + c.args);
    INFO("validate: " << v.output);
    INFO("run: " << r.output);
    CHECK(v.exit_code == 2);
    CHECK(r.exit_code == 2);
    const std::string line = line_with(v.output, c.expect);
    CHECK(!line.empty());
    CHECK(line == line_with(r.output, c.expect));
    CHECK(!has_backtrace(r.output));
  }
  CHECK(!std::filesystem::exists(dir.path / "out/checkpoints"));
}

TEST_CASE("validate cli: an arch override plans anywhere but stops run with one line where that GPU is absent") {
  TempDir dir;
  make_run_dir(dir);
  const std::string why = "AXENGINE_ARCH=sm_120 selects kernels as on an sm_120 GPU, but ";
  auto v = run("AXENGINE_ARCH=sm_120 " + env(dir) + axengine() + " validate --config " + (dir / "run.toml"));
  INFO(v.output);
  CHECK(v.exit_code == 0);
  CHECK(v.output.find("kernels  sm_120: ") != std::string::npos);
  CHECK(v.output.find("note     run on this machine would stop: " + why) != std::string::npos);

  auto r = run("AXENGINE_ARCH=sm_120 " + env(dir) + axengine() + " run --config " + (dir / "run.toml"));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(!line_with(r.output, why).empty());
  CHECK(!has_backtrace(r.output));
  CHECK(r.output.find("NVIDIA driver") == std::string::npos);
  CHECK(!std::filesystem::exists(dir.path / "out/checkpoints"));

  // device.arch in the config with device.type = "cpu": training on the CPU with kernels chosen for a GPU.
  r = run(env(dir) + axengine() + " run --config " + (dir / "run.toml") + " --set device.type=cpu --set device.arch=sm_90");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(!line_with(r.output, "device.arch = \"sm_90\" selects kernels as on an sm_90 GPU, but device.type = \"cpu\"").empty());
  CHECK(!has_backtrace(r.output));

  // device.type = "cuda" without an arch to plan for needs a GPU: validate and run both refuse it where there is none.
  if (!at::hasCUDA()) {
    for (const char* cmd : {" validate", " run"}) {
      r = run(env(dir) + axengine() + cmd + " --config " + (dir / "run.toml") + " --set device.type=cuda");
      INFO(r.output);
      CHECK(r.exit_code == 2);
      CHECK(!line_with(r.output, "device.type = \"cuda\", but this machine has no CUDA device").empty());
    }
  }
}

TEST_CASE("validate cli: every shipped config validates against a tiny model of its family") {
  TempDir dir;
  // The layout the shipped configs assume, relative to configs/: ../data/instructions.jsonl, ../runs/quickstart-*.
  std::ostringstream rows;
  for (int i = 0; i < 3000; ++i)
    rows << "{\"prompt\": \"Question " << i << ": what is the quick brown fox doing today?\", \"response\": \"It jumps over the lazy dog "
         << i << " times, then rests.\"}\n";
  write_file(dir / "data/instructions.jsonl", rows.str());
  // qwen3-chat-lora.toml's conversations and alpaca-lora.toml's Alpaca array.
  std::ostringstream chats, alpaca;
  alpaca << "[";
  for (int i = 0; i < 1500; ++i) {  // enough to pack into one step's 16 rows of 2048 tokens
    chats << "{\"messages\": [{\"role\": \"user\", \"content\": \"What is " << i << " + 1?\"}, "
          << "{\"role\": \"assistant\", \"content\": \"" << i + 1 << "\"}]}\n";
    if (i < 200) alpaca << (i ? ", " : "") << "{\"instruction\": \"Add one.\", \"input\": \"" << i << "\", \"output\": \"" << i + 1 << "\"}";
  }
  alpaca << "]";
  write_file(dir / "data/chats.jsonl", chats.str());
  write_file(dir / "data/alpaca_data.json", alpaca.str());
  auto init = [&](const std::string& preset, const std::string& out) {
    REQUIRE(run(env(dir) + axengine() + " init-model --preset " + preset + " --out " + (dir / out)).exit_code == 0);
  };
  init("tiny-llama", "runs/quickstart-model");
  REQUIRE(run(env(dir) + axengine() + " make-data --task arithmetic --digits 1 --train 80 --eval 20 --out " +
              (dir / "runs/quickstart-data")).exit_code == 0);
  init("tiny-qwen3", "models/qwen3");
  // A real Qwen3 model dir carries its chat template; the chat config renders with it.
  write_file(dir / "models/qwen3/chat_template.jinja",
             read_file(std::string(AXENGINE_TEST_DATA_DIR) + "/chat_templates/Qwen-Qwen3-0.6B.jinja"));
  init("tiny-qwen3-moe", "models/qwen3-moe");
  init("tiny-mixtral", "models/mixtral");
  init("tiny-qwen2", "models/qwen2");
  init("tiny-mistral", "models/mistral");
  init("tiny-gemma3", "models/gemma3");
  init("tiny-olmoe", "models/olmoe");
  init("tiny-gpt-oss", "models/gpt-oss");
  init("tiny-qwen3_5", "models/qwen3.5");
  init("tiny-qwen3_5-moe", "models/qwen3.5-moe");
  init("tiny-qwen3-next", "models/qwen3-next");
  init("tiny-qwen2_5-vl", "models/qwen2_5-vl");
  init("tiny-qwen3-vl", "models/qwen3-vl");
  init("tiny-qwen3-vl-moe", "models/qwen3-vl-moe");
  init("tiny-gemma3-mm", "models/gemma3-mm");
  init("tiny-glm4-moe", "models/glm4.5-air");
  init("tiny-deepseek-v3", "models/deepseek-v3");
  // qwen2_5-vl-mm-cpt.toml's image + text rows (../data/mm/train.jsonl) on the mm_cpt plugin's committed images:
  // 400, enough to pack into one step's 8 rows of 2048 tokens.
  fs::create_directories(dir.path / "data/mm/images");
  std::ostringstream mm;
  for (const char* img : {"a.jpg", "b.png", "c.webp", "j_large.jpg"}) {
    fs::copy_file(std::string(AXENGINE_SOURCE_DIR) + "/plugins/mm_cpt/tests/data/images/" + img, dir.path / "data/mm/images" / img);
    for (int i = 0; i < 100; ++i) mm << "{\"text\": \"<image>\\nPicture " << i << " of " << img << ".\", \"images\": [\"images/" << img << "\"]}\n";
  }
  write_file(dir / "data/mm/train.jsonl", mm.str());
  // qwen2_5-vl-chat-lora.toml's and qwen3-vl-chat-lora.toml's image conversations (../data/vl-chat/train.jsonl),
  // rendered with each model's template.
  write_file(dir / "models/qwen2_5-vl/chat_template.jinja",
             read_file(std::string(AXENGINE_TEST_DATA_DIR) + "/chat_templates/Qwen-Qwen2.5-VL-7B-Instruct.jinja"));
  for (const char* m : {"models/qwen3-vl/chat_template.jinja", "models/qwen3-vl-moe/chat_template.jinja"})
    write_file(dir / m, read_file(std::string(AXENGINE_TEST_DATA_DIR) + "/chat_templates/Qwen-Qwen3-VL-8B-Instruct.jinja"));
  fs::create_directories(dir.path / "data/vl-chat");
  fs::copy(dir.path / "data/mm/images", dir.path / "data/vl-chat/images");
  std::ostringstream vl;
  // 200 per image: tiny-qwen3-vl's images (32 x 32 pixels a token) take fewer tokens than tiny-qwen2_5-vl's, and
  // its config's step still needs 8 packed rows of 4096.
  for (const char* img : {"a.jpg", "b.png", "c.webp", "j_large.jpg"})
    for (int i = 0; i < 200; ++i)
      vl << "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"image\": \"images/" << img
         << "\"}, {\"type\": \"text\", \"text\": \"Picture " << i << "?\"}]}, {\"role\": \"assistant\", \"content\": \"" << img << ".\"}]}\n";
  write_file(dir / "data/vl-chat/train.jsonl", vl.str());
  fs::copy(dir.path / "data/vl-chat", dir.path / "data/gemma3-chat", fs::copy_options::recursive);  // gemma3-4b-chat-lora.toml's
  const std::vector<std::pair<std::string, std::string>> configs = {
      {"quickstart.toml", ""},
      {"qwen3-lora.toml", "models/qwen3"},
      {"qwen3-lora-compile.toml", "models/qwen3"},
      {"qwen3-qlora.toml", "models/qwen3"},
      {"qwen3-moe-lora.toml", "models/qwen3-moe"},
      {"qwen3-moe-qlora.toml", "models/qwen3-moe"},
      {"mixtral-lora.toml", "models/mixtral"},
      {"qwen2.5-lora.toml", "models/qwen2"},
      {"mistral-lora.toml", "models/mistral"},
      {"qwen3-chat-lora.toml", "models/qwen3"},
      {"alpaca-lora.toml", "models/qwen3"},
      {"gemma3-lora.toml", "models/gemma3"},
      {"olmoe-lora.toml", "models/olmoe"},
      {"gpt-oss-lora.toml", "models/gpt-oss"},
      {"qwen3.5-lora.toml", "models/qwen3.5"},
      {"qwen3.5-moe-lora.toml", "models/qwen3.5-moe"},
      {"qwen3.5-moe-qlora.toml", "models/qwen3.5-moe"},
      {"qwen3-next-lora.toml", "models/qwen3-next"},
      {"qwen2_5-vl-mm-cpt.toml", "models/qwen2_5-vl"},
      {"qwen2_5-vl-mm-cpt-streaming.toml", "models/qwen2_5-vl"},
      {"qwen2_5-vl-chat-lora.toml", "models/qwen2_5-vl"},
      {"qwen3-vl-chat-lora.toml", "models/qwen3-vl"},
      {"qwen3-vl-moe-chat-lora.toml", "models/qwen3-vl-moe"},
      {"gemma3-4b-chat-lora.toml", "models/gemma3-mm"},
      {"glm4.5-air-lora.toml", "models/glm4.5-air"},
      {"deepseek-v3-lora.toml", "models/deepseek-v3"},
  };
  std::size_t shipped = 0;
  for (const auto& e : fs::directory_iterator(std::string(AXENGINE_SOURCE_DIR) + "/configs")) shipped += e.path().extension() == ".toml";
  CHECK(shipped == configs.size());  // a new shipped config gets a model here
  // A build without nvcc has no scattermoe plugin: a config naming it is then refused, and says why. A build
  // without the codec libraries has no mm_cpt plugin, and its dataset type is then unknown.
  const bool have_scattermoe = fs::exists(std::string(AXENGINE_PLUGIN_DIR) + "/axengine_scattermoe.so");
  const bool have_mm_cpt = fs::exists(std::string(AXENGINE_PLUGIN_DIR) + "/axengine_mm_cpt.so");
  for (const auto& [name, model] : configs) {
    CAPTURE(name);
    const std::string text = read_file(std::string(AXENGINE_SOURCE_DIR) + "/configs/" + name);
    write_file(dir / ("configs/" + name), text);
    std::string cmd = env(dir) + axengine() + " validate --config " + (dir / ("configs/" + name));
    if (!model.empty()) cmd += " --set model.path=" + (dir / model);
    auto v = run(cmd);
    INFO(v.output);
    if (!have_scattermoe && names_outside_comments(text, "\"scattermoe\"")) {
      CHECK(v.exit_code == 2);
      CHECK(v.output.find("names backend \"scattermoe\", which neither a built-in nor a loaded plugin provides") != std::string::npos);
      continue;
    }
    // The chat config's images are the plugin's to process: without it every row is a bad row naming it.
    if (!have_mm_cpt && (names_outside_comments(text, "\"mm_cpt\"") || name.find("-vl-chat-lora.toml") != std::string::npos ||
                         name == "qwen3-vl-moe-chat-lora.toml" || name == "gemma3-4b-chat-lora.toml")) {
      CHECK(v.exit_code == 2);
      CHECK(v.output.find("mm_cpt") != std::string::npos);
      continue;
    }
    CHECK(v.exit_code == 0);
    CHECK(v.output.find(name + ": ok") != std::string::npos);
  }
}

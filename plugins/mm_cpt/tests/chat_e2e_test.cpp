// End to end on the CPU through the CLI: `axengine run` with configs/qwen2_5-vl-chat-lora.toml trains a LoRA on
// `init-model --preset tiny-qwen2_5-vl` over image conversations (core's chat_template type, the images processed by
// this plugin, loaded beside the executable as `axengine run` finds it): the loss falls, and image tokens are never
// trained on.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "e2e_util.hpp"
// Last: c10 (through ATen) defines a CHECK macro of its own, doctest's must win.
#include <doctest/doctest.h>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using mm_e2e::slurp;

// ../data/vl-chat/train.jsonl beside configs/: make-mm-corpus.py's captioned images made conversations (the
// images as content parts in varied places and spellings, some as ShareGPT-free text-only rows), the model dir
// with Qwen2.5-VL's chat template.
struct Family {
  const char* preset;    // init-model's
  const char* template_file;  // under tests/data/chat_templates
  const char* config;    // under configs/
  const char* run_dir;   // the config's output_dir, under runs/
};
constexpr Family kQwen25Vl{"tiny-qwen2_5-vl", "Qwen-Qwen2.5-VL-7B-Instruct.jinja", "qwen2_5-vl-chat-lora.toml", "qwen2_5-vl-chat-lora"};
constexpr Family kQwen3Vl{"tiny-qwen3-vl", "Qwen-Qwen3-VL-8B-Instruct.jinja", "qwen3-vl-chat-lora.toml", "qwen3-vl-chat-lora"};
constexpr Family kQwen3VlMoe{"tiny-qwen3-vl-moe", "Qwen-Qwen3-VL-8B-Instruct.jinja", "qwen3-vl-moe-chat-lora.toml",
                             "qwen3-vl-moe-chat-lora"};

void make_layout(const fs::path& dir, int rows, const Family& f) {
  const std::string cmd = std::string(MM_CPT_PYTHON) + " " + AXENGINE_SOURCE_DIR + "/scripts/make-mm-corpus.py " +
                          (dir / "data/vl-chat").string() + " --rows " + std::to_string(rows) + " --seed 3 > " +
                          (dir / "corpus.log").string() + " 2>&1";
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, "make-mm-corpus.py failed (numpy and Pillow in AXENGINE_PYTHON?): ", cmd);
  ax::init_model_dir(f.preset, (dir / "model").string(), 1);
  fs::copy_file(std::string(AXENGINE_SOURCE_DIR) + "/tests/data/chat_templates/" + f.template_file, dir / "model/chat_template.jinja");
  fs::create_directories(dir / "configs");
  fs::copy_file(std::string(AXENGINE_SOURCE_DIR) + "/configs/" + f.config, dir / "configs/vl.toml");
  std::ofstream out(dir / "data/vl-chat/train.jsonl.tmp");
  int k = 0;
  for (const auto& r : mm_e2e::lines(dir / "data/vl-chat/train.jsonl")) {
    std::string caption = r["text"].get<std::string>();
    for (std::size_t at; (at = caption.find("<image>")) != std::string::npos;) caption.erase(at, 7);
    json user = json::array();
    user.push_back({{"type", "text"}, {"text", "Describe it."}});
    for (const auto& img : r["images"]) {  // before or after the question, in both spellings
      json part = k % 2 ? json{{"type", "image_url"}, {"image_url", {{"url", img}}}} : json{{"type", "image"}, {"image", img}};
      if (k % 3 == 0) user.insert(user.begin(), part);
      else user.push_back(part);
    }
    json messages = json::array({{{"role", "user"}, {"content", user}}, {{"role", "assistant"}, {"content", caption}}});
    if (k % 4 == 0) messages.insert(messages.begin(), json{{"role", "system"}, {"content", "Be exact."}});
    out << json{{"messages", messages}}.dump() << "\n";
    if (k++ % 5 == 0) out << R"({"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."}]})" "\n";
  }
  out.close();
  fs::rename(dir / "data/vl-chat/train.jsonl.tmp", dir / "data/vl-chat/train.jsonl");
}

// `axengine run` with the family's config over 48 generated conversations: 30 steps, the loss falls. `vision_targets`
// (a TOML array): LoRA on the tower too, whose adapters the final checkpoint then holds.
void train_and_check(const Family& f, const std::string& vision_targets = "") {
  const fs::path dir = mm_e2e::scratch("mm_chat_e2e", std::string(f.preset) + (vision_targets.empty() ? "" : "-vision"));
  make_layout(dir, 48, f);
  std::string cmd = std::string("AXENGINE_CACHE_DIR=") + (dir / "cache").string() + " " + AXENGINE_BIN + " run --config " +
                    (dir / "configs/vl.toml").string();
  for (const std::string s : {"model.path=" + (dir / "model").string(), std::string("data.sequence_len=512"),
                              std::string("train.micro_batch_size=2"), std::string("train.grad_accum=1"), std::string("train.lr=3e-3"),
                              std::string("train.warmup_steps=2"), std::string("train.cpu_threads=1"), std::string("eval.every_steps=0"),
                              std::string("lora.dropout=0.0"), std::string("train.max_steps=30"), std::string("device.type=cpu"),
                              std::string("train.activation_checkpointing=false")})
    cmd += " --set '" + s + "'";
  if (!vision_targets.empty()) cmd += " --set 'lora.vision_targets=" + vision_targets + "'";
  cmd += " > " + (dir / "run.log").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string log = slurp(dir / "run.log");
  INFO(log);
  REQUIRE(rc == 0);
  CHECK(log.find("bad rows skipped") == std::string::npos);  // every generated row is good
  auto steps = mm_e2e::steps_of(dir / "runs" / f.run_dir / "metrics.jsonl");
  REQUIRE(steps.size() == 30);
  auto mean = [&](std::size_t from) {
    double s = 0;
    for (std::size_t i = from; i < from + 5; ++i) s += steps[i]["loss"].get<double>();
    return s / 5;
  };
  MESSAGE("mean loss, steps 1-5: ", mean(0), ", steps 26-30: ", mean(25));
  CHECK(mean(25) < 0.7 * mean(0));
  // Only the assistant turns train: every step feeds more tokens (prompts, images) than it trains on.
  for (const auto& s : steps) CHECK(s["trainable_tokens"].get<int64_t>() < s["tokens"].get<int64_t>());
  if (!vision_targets.empty()) {  // the tower's adapters trained: B moved off its zeros
    const fs::path adapter = dir / "runs" / f.run_dir / "checkpoints/step-00000030/adapter_model.safetensors";
    auto st = ax::safetensors::File::open(adapter.string());
    int vision = 0;
    for (const auto& t : st->tensors())
      if (t.name.find(".visual.") != std::string::npos && t.name.find("lora_B") != std::string::npos) {
        ++vision;
        CHECK(st->get(t.name).abs().max().item<double>() > 0);
      }
    CHECK(vision > 0);
  }
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("chat_template with images e2e: axengine run trains tiny-qwen2_5-vl on image conversations, loss falls") {
  train_and_check(kQwen25Vl);
}

TEST_CASE("chat_template with images e2e: axengine run trains tiny-qwen3-vl on image conversations, loss falls") {
  train_and_check(kQwen3Vl);
}

TEST_CASE("chat_template with images e2e: axengine run trains tiny-qwen3-vl with LoRA on the tower too (lora.vision_targets), loss falls") {
  train_and_check(kQwen3Vl, R"(["qkv", "attn.proj", "linear_fc1", "linear_fc2"])");
}

TEST_CASE("chat_template with images e2e: axengine run trains tiny-qwen3-vl-moe on image conversations, loss falls") {
  train_and_check(kQwen3VlMoe);
}

// streaming = true over the same conversations: the rows are rendered and their images decoded as training
// reaches them, and a run resumed from a mid-stream checkpoint continues at its cursor with the uninterrupted
// run's steps (docs/datasets.md, "Streaming").
TEST_CASE("chat_template with images e2e, streamed: a run resumed mid-stream trains the uninterrupted run's steps") {
  const fs::path dir = mm_e2e::scratch("mm_chat_e2e", "stream");
  make_layout(dir, 24, kQwen25Vl);
  std::ofstream(dir / "configs/stream.toml") << "[model]\npath = \"../model\"\n[data]\nsequence_len = 512\n"
                                                "[[datasets]]\ntype = \"chat_template\"\npath = \"../data/vl-chat/train.jsonl\"\n"
                                                "streaming = true\n[lora]\nr = 8\nalpha = 16\ndropout = 0.0\n"
                                                "targets = [\"q_proj\", \"v_proj\"]\n[train]\nmax_steps = 6\nmicro_batch_size = 2\n"
                                                "lr = 3e-3\nwarmup_steps = 2\ncpu_threads = 1\n[checkpoint]\nevery_steps = 3\n"
                                                "keep_last = 10\n[device]\ntype = \"cpu\"\n";
  auto run = [&](const std::string& out, const std::string& extra) {
    const std::string cmd = std::string("AXENGINE_CACHE_DIR=") + (dir / "cache").string() + " " + AXENGINE_BIN + " run --config " +
                            (dir / "configs/stream.toml").string() + " --set 'run.output_dir=" + (dir / out).string() + "'" +
                            extra + " > " + (dir / (out + ".log")).string() + " 2>&1";
    const int rc = std::system(cmd.c_str());
    INFO(slurp(dir / (out + ".log")));
    REQUIRE(rc == 0);
  };
  run("full", "");
  run("resumed", " --set 'checkpoint.resume_from=" + (dir / "full/checkpoints/step-00000003").string() + "'");
  auto ref = mm_e2e::steps_of(dir / "full/metrics.jsonl");
  auto resumed = mm_e2e::steps_of(dir / "resumed/metrics.jsonl");
  REQUIRE(ref.size() == 6);
  REQUIRE(resumed.size() == 3);  // steps 4..6
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(resumed[i]["step"] == ref[i + 3]["step"]);
    CHECK(resumed[i]["tokens"] == ref[i + 3]["tokens"]);
    CHECK(resumed[i]["trainable_tokens"] == ref[i + 3]["trainable_tokens"]);
    CHECK(resumed[i]["loss"].get<double>() == doctest::Approx(ref[i + 3]["loss"].get<double>()).epsilon(1e-5));
  }
  auto cursor = [&](const std::string& out) {
    return json::parse(std::ifstream(dir / out / "checkpoints/step-00000006/trainer_state.json"))["data_stream"]["cursor"];
  };
  CHECK(cursor("resumed") == cursor("full"));
  fs::remove_all(dir);
}

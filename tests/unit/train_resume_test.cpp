// Resume never trusts a bad checkpoint, and nothing bad is checkpointed: trainer_state.json is checked field by
// field, the manifest's sizes and CRC-32C catch damaged files, "latest" falls back to the newest checkpoint that
// verifies (and stops when none does), non-finite weights are never saved, a non-finite eval loss is recorded
// as null instead of crashing the report.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "train/checkpoint.hpp"
#include "train/checkpoint_manifest.hpp"
#include "unit/train_harness.hpp"

namespace fs = std::filesystem;
using ax::test::Harness;
using ax::test::make_run_dir;

namespace {

fs::path ckpt(const fs::path& out, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return out / "checkpoints" / name;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Edits trainer_state.json; `reseal` rewrites the manifest so that the state's own checks are what is tested.
void edit_state(const fs::path& ck, const std::function<void(nlohmann::json&)>& edit, bool reseal = true) {
  auto j = nlohmann::json::parse(read(ck / "trainer_state.json"));
  edit(j);
  ax::test::write_text(ck / "trainer_state.json", j.dump(2));
  if (reseal) ax::train::write_manifest(ck.string(), "test");
}

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

}  // namespace

TEST_CASE("checkpoint manifest: CRC-32C is the Castagnoli CRC, and every file of a checkpoint is listed") {
  CHECK(ax::train::crc32c("123456789") == 0xE3069283u);  // the standard check value
  CHECK(ax::train::crc32c("") == 0u);
  auto dir = make_run_dir("resume_manifest", "");
  Harness h(dir, {"train.max_steps=4"});
  h.run();
  auto m = nlohmann::json::parse(read(ckpt(dir / "out", 4) / "manifest.json"));
  CHECK(m["format"] == "axengine-checkpoint-manifest-v1");
  std::vector<std::string> listed;
  for (auto it = m["files"].begin(); it != m["files"].end(); ++it) listed.push_back(it.key());
  CHECK(listed == std::vector<std::string>{"adapter_config.json", "adapter_model.safetensors", "trainer_state.json",
                                           "trainer_state.safetensors"});
  uint64_t size = 0;
  auto crc = ax::train::crc32c_file((ckpt(dir / "out", 4) / "trainer_state.json").string(), size);
  CHECK(m["files"]["trainer_state.json"]["size"] == size);
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  CHECK(m["files"]["trainer_state.json"]["crc32c"] == hex);
  // One byte changed, the size the same: only the checksum sees it.
  const fs::path tensors = ckpt(dir / "out", 4) / "trainer_state.safetensors";
  std::string bytes = read(tensors);
  bytes[bytes.size() - 1] ^= 0x40;
  ax::test::write_text(tensors, bytes);
  std::string err = usage_error([&] { ax::train::load_checkpoint(ckpt(dir / "out", 4).string()); });
  CHECK(err.find(tensors.string() + ": CRC-32C ") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("resume: every field of trainer_state.json is checked and errors name the file and the field") {
  auto dir = make_run_dir("resume_fields", "");
  Harness full(dir);
  full.run();
  const fs::path good = ckpt(dir / "out", 8);
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    const char* error;
  };
  const std::vector<Case> cases{
      {"negative step", [](auto& j) { j["step"] = -5; }, "trainer_state.json: field 'step' = -5 is outside [1, 12]"},
      {"step of 10^12", [](auto& j) { j["step"] = 1000000000000LL; }, "field 'step' = 1000000000000 is outside [1, 12]"},
      {"step unlike the directory", [](auto& j) { j["step"] = 9; j["epoch"] = 1; j["step_in_epoch"] = 3; },
       "field 'step' = 9 disagrees with the directory's name (step 8)"},
      {"epoch not a number", [](auto& j) { j["epoch"] = "x"; }, "field 'epoch' = \"x\" is not an integer"},
      {"epoch inconsistent", [](auto& j) { j["epoch"] = 0; }, "field 'epoch' = 0 disagrees with step 8 at 6 steps per epoch"},
      {"data cursor inconsistent", [](auto& j) { j["step_in_epoch"] = 0; }, "field 'step_in_epoch' = 0 disagrees"},
      {"zero steps per epoch", [](auto& j) { j["steps_per_epoch"] = 0; }, "field 'steps_per_epoch' = 0 is outside"},
      {"total below step", [](auto& j) { j["total_steps"] = 4; }, "field 'step' = 8 is outside [1, 4]"},
      {"seed not an integer", [](auto& j) { j["seed"] = 1.5; }, "field 'seed' = 1.5 is not an integer"},
      {"negative lr", [](auto& j) { j["lr_next"] = -1.0; }, "field 'lr_next' = -1.0 is not a finite number >= 0"},
      {"best eval a string", [](auto& j) { j["best_eval_loss"] = "low"; }, "field 'best_eval_loss' = \"low\" is neither"},
      {"config missing", [](auto& j) { j.erase("config"); }, "field 'config' is missing"},
      {"unknown field", [](auto& j) { j["cursor"] = 3; }, "field 'cursor' is unknown"},
      {"negative token count", [](auto& j) { j["tokens_seen"] = -1; }, "field 'tokens_seen' = -1 is outside"},
      {"token counts unpaired", [](auto& j) { j.erase("trainable_tokens_seen"); }, "field 'trainable_tokens_seen' is missing"},
      {"more trainable than seen", [](auto& j) { j["trainable_tokens_seen"] = j["tokens_seen"].template get<int64_t>() + 1; },
       "exceeds tokens_seen"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const fs::path ck = dir / "cases" / c.name / "step-00000008";
    fs::create_directories(ck.parent_path());
    fs::copy(good, ck);
    edit_state(ck, c.edit);
    Harness h(dir, {"run.output_dir=out_case", "checkpoint.resume_from=" + ck.string()});
    std::string err = usage_error([&] { h.run(); });
    CHECK(err.find(c.error) != std::string::npos);
    CHECK(err.find(ck.string()) != std::string::npos);
  }
  // Edited without resealing: the manifest's checksum names the file.
  const fs::path ck = dir / "cases" / "tampered" / "step-00000008";
  fs::create_directories(ck.parent_path());
  fs::copy(good, ck);
  edit_state(ck, [](auto& j) { j["lr_next"] = 0.5; }, /*reseal=*/false);
  std::string err = usage_error([&] { ax::train::load_checkpoint(ck.string()); });
  CHECK(err.find((ck / "trainer_state.json").string() + ": ") != std::string::npos);
  CHECK(err.find("manifest.json says") != std::string::npos);
  // A checkpoint past the end of this run is refused rather than "resumed" backwards.
  Harness shorter(dir, {"run.output_dir=out_short", "train.max_steps=6", "checkpoint.resume_from=" + good.string()});
  CHECK(usage_error([&] { shorter.run(); }).find("checkpoint is at step 8, past the 6 steps of this run") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("resume latest: skips checkpoints that do not verify, says why, and the run still ends bitwise equal") {
  auto dir = make_run_dir("resume_fallback", "");
  Harness full(dir);
  auto a = full.run();
  REQUIRE(a.losses.size() == 12);
  const fs::path out = dir / "out";
  // The newest three "checkpoints" are bad: an empty directory, a truncated adapter, a missing state file.
  fs::create_directories(out / "checkpoints" / "step-00000999");
  const fs::path adapter = ckpt(out, 12) / "adapter_model.safetensors";
  fs::resize_file(adapter, fs::file_size(adapter) / 2);
  fs::remove(ckpt(out, 8) / "trainer_state.json");

  auto latest = ax::train::load_latest_checkpoint(out.string());
  REQUIRE(latest.loaded);
  CHECK(latest.loaded->dir == ckpt(out, 4).string());
  REQUIRE(latest.skipped.size() == 3);
  CHECK(latest.skipped[0].first == (out / "checkpoints" / "step-00000999").string());
  CHECK(latest.skipped[0].second.find("not a checkpoint (no manifest.json, no trainer_state.json)") != std::string::npos);
  CHECK(latest.skipped[1].second.find(adapter.string() + ": ") != std::string::npos);
  CHECK(latest.skipped[1].second.find("bytes, manifest.json says") != std::string::npos);
  CHECK(latest.skipped[2].second.find((ckpt(out, 8) / "trainer_state.json").string() + ": missing") != std::string::npos);

  // An explicit resume_from of a bad one is an error naming the file.
  Harness explicit_bad(dir, {"checkpoint.resume_from=" + ckpt(out, 12).string()});
  CHECK(usage_error([&] { explicit_bad.run(); }).find(adapter.string()) != std::string::npos);

  Harness resumed(dir, {"checkpoint.resume_from=latest"});
  auto b = resumed.run();
  CHECK(b.first_step == 4);
  REQUIRE(b.losses.size() == 8);
  for (std::size_t i = 0; i < b.losses.size(); ++i) CHECK(b.losses[i] == a.losses[4 + i]);  // bitwise
  for (const auto& [n, p] : full.model.trainable_parameters()) CHECK(at::equal(p, resumed.model.w(n)));
  // The bad 8 and 12 were replaced by good ones; the empty directory is still skipped.
  CHECK(ax::train::find_latest_checkpoint(out.string()) == ckpt(out, 12).string());
  CHECK_NOTHROW(ax::train::load_checkpoint(ckpt(out, 8).string()));
  ax::test::remove_tree(dir);
}

TEST_CASE("resume latest: when checkpoints exist but none verifies, the run stops instead of starting afresh") {
  auto dir = make_run_dir("resume_none", "");
  Harness full(dir, {"train.max_steps=8"});
  full.run();
  for (int step : {4, 8}) {
    fs::remove(ckpt(dir / "out", step) / "manifest.json");
    fs::remove(ckpt(dir / "out", step) / "trainer_state.json");
  }
  Harness again(dir, {"train.max_steps=8", "checkpoint.resume_from=latest"});
  std::string err = usage_error([&] { again.run(); });
  CHECK(err.find("none of the 2 checkpoints in " + (dir / "out" / "checkpoints").string() + " verifies") != std::string::npos);
  CHECK(fs::exists(dir / "out" / "metrics.jsonl"));  // nothing was reset
  ax::test::remove_tree(dir);
}

TEST_CASE("checkpoints: one without a manifest (written before manifests) loads after structural checks") {
  auto dir = make_run_dir("resume_legacy", "");
  Harness full(dir, {"train.max_steps=4"});
  full.run();
  const fs::path ck = ckpt(dir / "out", 4);
  fs::remove(ck / "manifest.json");
  auto loaded = ax::train::load_checkpoint(ck.string());
  CHECK_FALSE(loaded.has_manifest);
  CHECK(loaded.state.step == 4);
  // Its files are still checked for structure: a truncated adapter is caught.
  fs::resize_file(ck / "adapter_model.safetensors", fs::file_size(ck / "adapter_model.safetensors") - 3);
  std::string err = usage_error([&] { ax::train::load_checkpoint(ck.string()); });
  CHECK(err.find((ck / "adapter_model.safetensors").string() + ": ") != std::string::npos);
  CHECK(err.find("truncated") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("resume: token counts carry across resume; a checkpoint without them counts on from its step") {
  auto dir = make_run_dir("resume_tokens", "");
  Harness full(dir);  // 12 steps, checkpoints every 4
  full.run();
  auto records = [&](const fs::path& metrics) {
    std::vector<nlohmann::json> out;
    std::istringstream in(read(metrics));
    for (std::string l; std::getline(in, l);)
      if (l.find("\"loss\"") != std::string::npos) out.push_back(nlohmann::json::parse(l));
    return out;
  };
  auto ref = records(dir / "out/metrics.jsonl");
  REQUIRE(ref.size() == 12);
  int64_t sum = 0, trainable = 0;
  for (const auto& r : ref) {
    sum += r["tokens"].get<int64_t>();
    trainable += r["trainable_tokens"].get<int64_t>();
    CHECK(r["tokens_seen"] == sum);  // running sums of the per-step counts
    CHECK(r["trainable_tokens_seen"] == trainable);
    CHECK(r["trainable_tokens"].get<int64_t>() < r["tokens"].get<int64_t>());  // prompts carry no loss
  }
  // Resumed from step 8 into another output dir: the counts come from the checkpoint, not from a metrics file.
  const fs::path step8 = ckpt(dir / "out", 8);
  Harness resumed(dir, {"run.output_dir=out_resumed", "checkpoint.resume_from=" + step8.string()});
  resumed.run();
  auto after = records(dir / "out_resumed/metrics.jsonl");
  REQUIRE(after.size() == 4);
  CHECK(after.back()["tokens_seen"] == ref.back()["tokens_seen"]);
  CHECK(after.back()["trainable_tokens_seen"] == ref.back()["trainable_tokens_seen"]);
  // A checkpoint written before the counts existed: the resume says so and counts from its step on.
  edit_state(step8, [](nlohmann::json& j) {
    j.erase("tokens_seen");
    j.erase("trainable_tokens_seen");
  });
  Harness legacy(dir, {"run.output_dir=out_legacy", "checkpoint.resume_from=" + step8.string()});
  legacy.run();
  auto counted = records(dir / "out_legacy/metrics.jsonl");
  REQUIRE(counted.size() == 4);
  CHECK(counted.back()["tokens_seen"] == ref.back()["tokens_seen"].get<int64_t>() - ref[7]["tokens_seen"].get<int64_t>());
  ax::test::remove_tree(dir);
}

TEST_CASE("trainer: non-finite weights are never checkpointed and the run stops naming the last good checkpoint") {
  auto dir = make_run_dir("train_nan_weights", "");
  Harness h(dir);
  h.model.nan_weight_after_evals = 2;  // after the eval at step 6: the checkpoint of step 8 would hold a NaN
  std::string err;
  try {
    h.run();
  } catch (const ax::RuntimeError& e) {
    err = e.what();
  }
  CHECK(err.find("non-finite trainable parameter 'pos.weight' at step 8") != std::string::npos);
  CHECK(err.find("the last good one is " + ckpt(dir / "out", 4).string()) != std::string::npos);
  CHECK_FALSE(fs::exists(ckpt(dir / "out", 8)));
  CHECK(ax::train::find_latest_checkpoint((dir / "out").string()) == ckpt(dir / "out", 4).string());
  ax::test::remove_tree(dir);
}

TEST_CASE("trainer: a non-finite eval loss is recorded as null and the run finishes with its report") {
  auto dir = make_run_dir("train_nan_eval", "");
  Harness h(dir);
  h.model.nan_eval_loss = true;
  auto sum = h.run();
  CHECK(sum.steps == 12);
  CHECK(std::isnan(sum.final_eval_loss));
  CHECK(std::isnan(sum.best_eval_loss));
  int null_evals = 0;
  std::ifstream in(dir / "out" / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval_loss")) null_evals += j["eval_loss"].is_null();
  }
  CHECK(null_evals == 3);  // steps 0, 6 and 12
  CHECK(read(dir / "out" / "report.html").find("<svg") != std::string::npos);
  auto ck = ax::train::load_checkpoint(ckpt(dir / "out", 12).string());
  CHECK_FALSE(ck.state.best_eval_loss.has_value());
  ax::test::remove_tree(dir);
}

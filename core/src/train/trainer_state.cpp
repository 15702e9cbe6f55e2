// See trainer_state.hpp.
#include "train/trainer_state.hpp"

#include <cmath>
#include <limits>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::train {

nlohmann::json TrainerState::to_json() const {
  nlohmann::json j = {{"step", step},
          {"epoch", epoch},
          {"step_in_epoch", step_in_epoch},
          {"steps_per_epoch", steps_per_epoch},
          {"total_steps", total_steps},
          {"seed", seed},
          {"lr_next", lr_next},
          {"best_eval_loss", best_eval_loss ? nlohmann::json(*best_eval_loss) : nlohmann::json()},
          {"config", config}};
  if (tokens_seen) j["tokens_seen"] = *tokens_seen;
  if (trainable_tokens_seen) j["trainable_tokens_seen"] = *trainable_tokens_seen;
  if (data_stream) j["data_stream"] = *data_stream;
  if (loss_scale) j["loss_scale"] = {{"scale", static_cast<double>(loss_scale->scale)}, {"growth_tracker", loss_scale->growth_tracker}};
  return j;
}

TrainerState parse_trainer_state(const nlohmann::json& j, const std::string& file, std::optional<int64_t> dir_step) {
  auto bad = [&](const std::string& key, const std::string& msg) {
    return UsageError(str(file, ": field '", key, "' ", msg));
  };
  if (!j.is_object()) throw UsageError(str(file, ": not a JSON object"));
  static const char* kFields[] = {"step",  "epoch",   "step_in_epoch",  "steps_per_epoch", "total_steps",
                                  "seed",  "lr_next", "best_eval_loss", "config", "tokens_seen",
                                  "trainable_tokens_seen", "data_stream", "loss_scale"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* f : kFields) known |= it.key() == f;
    if (!known) throw bad(it.key(), "is unknown (a trainer state holds: step, epoch, step_in_epoch, steps_per_epoch, "
                                    "total_steps, seed, lr_next, best_eval_loss, config, tokens_seen, trainable_tokens_seen, data_stream, "
                                    "loss_scale)");
  }
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key)) throw bad(key, "is missing");
    return j[key];
  };
  auto integer = [&](const char* key, int64_t lo, int64_t hi) {
    const auto& v = field(key);
    if (!v.is_number_integer()) throw bad(key, str("= ", v.dump(), " is not an integer"));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw bad(key, str("= ", v.dump(), " is out of range"));
    int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) throw bad(key, str("= ", x, " is outside [", lo, ", ", hi, "]"));
    return x;
  };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  TrainerState s;
  s.steps_per_epoch = integer("steps_per_epoch", 1, kMax);
  s.total_steps = integer("total_steps", 1, kMax);
  s.step = integer("step", 1, s.total_steps);
  if (dir_step && *dir_step != s.step)
    throw bad("step", str("= ", s.step, " disagrees with the directory's name (step ", *dir_step, ")"));
  s.epoch = integer("epoch", 0, kMax);
  if (s.epoch != s.step / s.steps_per_epoch)
    throw bad("epoch", str("= ", s.epoch, " disagrees with step ", s.step, " at ", s.steps_per_epoch, " steps per epoch (expected ",
                           s.step / s.steps_per_epoch, ")"));
  s.step_in_epoch = integer("step_in_epoch", 0, kMax);
  if (s.step_in_epoch != s.step % s.steps_per_epoch)
    throw bad("step_in_epoch", str("= ", s.step_in_epoch, " disagrees with step ", s.step, " at ", s.steps_per_epoch,
                                   " steps per epoch (expected ", s.step % s.steps_per_epoch, ")"));
  s.seed = integer("seed", std::numeric_limits<int64_t>::min(), kMax);
  const auto& lr = field("lr_next");
  if (!lr.is_number() || !std::isfinite(lr.get<double>()) || lr.get<double>() < 0)
    throw bad("lr_next", str("= ", lr.dump(), " is not a finite number >= 0"));
  s.lr_next = lr.get<double>();
  const auto& best = field("best_eval_loss");
  if (!best.is_null()) {
    if (!best.is_number() || !std::isfinite(best.get<double>()))
      throw bad("best_eval_loss", str("= ", best.dump(), " is neither a finite number nor null"));
    s.best_eval_loss = best.get<double>();
  }
  const auto& cfg = field("config");
  if (!cfg.is_string()) throw bad("config", str("= ", cfg.dump(), " is not a string"));
  s.config = cfg.get<std::string>();
  if (auto it = j.find("data_stream"); it != j.end()) {  // its fields are checked when a streamed run resumes from it
    if (!it->is_object()) throw bad("data_stream", "must be an object (a streamed run's data cursor)");
    s.data_stream = *it;
  }
  if (auto it = j.find("loss_scale"); it != j.end()) {
    const auto& ls = *it;
    if (!ls.is_object() || ls.size() != 2 || !ls.contains("scale") || !ls.contains("growth_tracker"))
      throw bad("loss_scale", str("= ", ls.dump(), " is not {\"scale\": ..., \"growth_tracker\": ...}"));
    const auto& sc = ls["scale"];
    const double v = sc.is_number() ? sc.get<double>() : -1;
    // A float32 value, as the scaler holds it: anything else would not come back bitwise.
    if (!sc.is_number() || !std::isfinite(v) || !(v > 0) || static_cast<double>(static_cast<float>(v)) != v)
      throw bad("loss_scale.scale", str("= ", sc.dump(), " is not a finite float32 value > 0"));
    const auto& gt = ls["growth_tracker"];
    if (!gt.is_number_integer() || gt.get<int64_t>() < 0 || gt.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw bad("loss_scale.growth_tracker", str("= ", gt.dump(), " is not an integer in [0, 2^31 - 1]"));
    s.loss_scale = LossScaleState{static_cast<float>(v), static_cast<int32_t>(gt.get<int64_t>())};
  }
  if (j.contains("tokens_seen")) s.tokens_seen = integer("tokens_seen", 0, kMax);
  if (j.contains("trainable_tokens_seen")) s.trainable_tokens_seen = integer("trainable_tokens_seen", 0, kMax);
  if (s.tokens_seen.has_value() != s.trainable_tokens_seen.has_value())
    throw bad(s.tokens_seen ? "trainable_tokens_seen" : "tokens_seen", "is missing (the token counts come in pairs)");
  if (s.tokens_seen && *s.trainable_tokens_seen > *s.tokens_seen)
    throw bad("trainable_tokens_seen", str("= ", *s.trainable_tokens_seen, " exceeds tokens_seen = ", *s.tokens_seen));
  return s;
}

}  // namespace ax::train

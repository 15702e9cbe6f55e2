// axengine make-data --task arithmetic --out DIR: the quickstart's self-made dataset (no downloads).
#include <iostream>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "axengine/training.hpp"
#include "command.hpp"

namespace {

namespace po = boost::program_options;

int run_make_data(const std::vector<std::string>& args) {
  ax::ArithmeticOptions o;
  std::string task = "arithmetic", out;
  int64_t seed = 1;
  po::options_description opts("make-data options");
  opts.add_options()("task", po::value(&task)->default_value("arithmetic"), "dataset to generate: arithmetic (\"12+35=\" -> \"47\")")(
      "out", po::value(&out), "output directory (train.jsonl, eval.jsonl)")(
      "train", po::value(&o.train_rows)->default_value(o.train_rows), "training rows")(
      "eval", po::value(&o.eval_rows)->default_value(o.eval_rows), "held-out evaluation rows")(
      "digits", po::value(&o.digits)->default_value(o.digits), "digits per operand")(
      "seed", po::value(&seed)->default_value(seed), "generator seed");
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine make-data --task arithmetic --out DIR [--train N] [--eval N] [--digits D]", args, opts, vm)) return 0;
  if (out.empty()) throw ax::UsageError("make-data: --out DIR is required");
  if (task != "arithmetic") throw ax::UsageError(ax::str("make-data: unknown --task '", task, "' (known: arithmetic)"));
  o.seed = static_cast<uint64_t>(seed);
  ax::write_arithmetic_task(out, o);
  ax::log::info(ax::str("wrote ", o.train_rows, " training and ", o.eval_rows, " held-out sums to ", out, "/{train,eval}.jsonl"));
  return 0;
}

ax::cli::CommandRegistrar reg({"make-data", "generate the quickstart's dataset (arithmetic: \"12+35=\" -> \"47\")", run_make_data});

}  // namespace

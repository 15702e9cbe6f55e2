// What `axengine generate` and `axengine chat` share: their model, sampling and device options, and loading
// the model (base + adapter, or a merged dir), its tokenizer and its eos ids through the engine's families
// (built-ins and plugins, as a run gets them).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "axengine/engine.hpp"
#include "axengine/model.hpp"
#include "axengine/tokenizer.hpp"
#include "train/generate.hpp"

namespace ax::cli {

// Adds --model, --adapter, --max-new-tokens, --temperature, --top-p, --top-k, --seed, --stop, --device,
// --dtype, --config, --set.
void add_generation_options(boost::program_options::options_description& opts);

struct GenSession {
  std::unique_ptr<Engine> engine;
  std::string model_dir;
  std::unique_ptr<Model> model;
  CausalLmDecode* decoder = nullptr;
  std::unique_ptr<Tokenizer> tokenizer;
  train::GenerateOptions options;  // from the command line, eos ids and detokenizer filled in
};

// Loads what the options name. `command` prefixes error messages.
GenSession open_session(const std::string& command, const boost::program_options::variables_map& vm);

}  // namespace ax::cli

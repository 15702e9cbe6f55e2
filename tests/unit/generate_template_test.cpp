// Generation prompted as training rendered the data: template kwargs (--template-kwargs, and by default the
// training run's from the adapter's record), and chat answers that end at the template's end-of-turn token
// even when generation_config.json names another eos (docs/generate.md).
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/generation.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/safetensors.hpp"
#include "train/generate_io.hpp"
#include "unit/cli_util.hpp"

namespace fs = std::filesystem;
using ax::test::lines_of;
using ax::test::run;
using ax::test::slurp;

namespace {

std::string templ(const std::string& name) { return slurp(fs::path(AXENGINE_TEST_DATA_DIR) / "chat_templates" / name); }

std::vector<nlohmann::json> rows(const fs::path& p) {
  std::vector<nlohmann::json> out;
  for (const auto& l : lines_of(p)) out.push_back(nlohmann::json::parse(l));
  return out;
}

// A model dir holding only what the chat prompt needs: a byte-level tokenizer with `specials` and a template.
fs::path template_dir(const fs::path& dir, const std::string& jinja, const std::vector<std::string>& specials,
                      const std::string& bos, const std::string& eos) {
  fs::create_directories(dir);
  ax::ByteLevelTokenizerOptions tok;
  tok.special_tokens = specials;
  tok.special_tokens.push_back("<|pad|>");
  tok.bos_token = bos;
  tok.eos_token = eos;
  std::ofstream(dir / "tokenizer.json") << ax::make_byte_level_tokenizer_json(tok);
  std::ofstream(dir / "tokenizer_config.json") << ax::make_byte_level_tokenizer_config_json(tok);
  std::ofstream(dir / "chat_template.jinja") << jinja;
  return dir;
}

// make_tiny_llama's model with weights that make every next token <|im_end|> (id 258): the embeddings are one
// constant vector, attention and MLP write nothing to the residual stream, and only lm_head's row 258 is not
// zero. Its config.json and generation_config name <|endoftext|> (256) as eos, as the tiny presets do.
void make_im_end_model(const fs::path& dir) {
  ax::test::make_tiny_llama(dir);
  auto ckpt = ax::safetensors::Checkpoint::open_dir(dir.string());
  std::vector<std::pair<std::string, at::Tensor>> w;
  for (const auto& n : ckpt.names()) {
    at::Tensor t = ckpt.get(n).clone();
    if (n == "model.embed_tokens.weight") t.fill_(0.1);
    else if (n == "lm_head.weight") t.zero_()[258].fill_(1.0);
    else if (n.find("norm") == std::string::npos) t.zero_();
    w.emplace_back(n, t);
  }
  ax::safetensors::save((dir / "model.safetensors").string(), w);
  std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": 256}\n";
}

}  // namespace

TEST_CASE("chat templates: the end-of-turn token follows the assistant's text (ChatML, Llama 3, Gemma 3, gpt-oss, Mistral)") {
  auto dir = ax::test::scratch_dir("eot_templates");
  struct Case {
    std::string file;
    std::vector<std::string> specials;
    std::string bos, eos, marker;
  };
  const std::vector<Case> cases{
      {"Qwen-Qwen3-0.6B.jinja", {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, "", "<|endoftext|>", "<|im_end|>"},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja",
       {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
       "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"},
      {"google-gemma-3-it.jinja", {"<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"}, "<bos>", "<eos>", "<end_of_turn>"},
      {"openai-gpt-oss-120b.jinja", {"<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>"}, "",
       "<|return|>", "<|return|>"},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", {"<s>", "</s>", "[INST]", "[/INST]"}, "<s>", "</s>", "</s>"}};
  for (const auto& c : cases) {
    CAPTURE(c.file);
    const fs::path d = template_dir(dir / c.file, templ(c.file), c.specials, c.bos, c.eos);
    auto tok = ax::load_hf_tokenizer(d.string());
    const auto chat = ax::train::ChatPrompt::load(d.string());
    const auto marker = tok->encode(c.marker, false);
    REQUIRE(marker.size() == 1);
    CHECK(ax::train::chat_end_of_turn_ids(chat, *tok) == std::vector<int64_t>{marker[0]});
  }
  // A template that ends turns with no marker: nothing derived.
  const fs::path plain = template_dir(dir / "plain", "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
                                      {"<|endoftext|>"}, "", "<|endoftext|>");
  CHECK(ax::train::chat_end_of_turn_ids(ax::train::ChatPrompt::load(plain.string()), *ax::load_hf_tokenizer(plain.string())).empty());
  ax::test::remove_tree(dir);
}

TEST_CASE("generate: --template-kwargs values, and Qwen3's enable_thinking rendered as transformers renders it") {
  CHECK(ax::parse_template_kwargs({"enable_thinking=false"}) == nlohmann::json{{"enable_thinking", false}});
  CHECK(ax::parse_template_kwargs({"{\"a\": 1, \"b\": \"x\"}", "b=y", "c=[1, 2]", "d=3.5"}) ==
        nlohmann::json{{"a", 1}, {"b", "y"}, {"c", {1, 2}}, {"d", 3.5}});
  for (const char* bad : {"=x", "noequals", "{\"a\": ", "{1}"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(ax::parse_template_kwargs({bad}), ax::UsageError);
  }
  auto dir = ax::test::scratch_dir("qwen3_kwargs");
  const fs::path d = template_dir(dir / "m", templ("Qwen-Qwen3-0.6B.jinja"), {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, "",
                                  "<|endoftext|>");
  auto chat = ax::train::ChatPrompt::load(d.string());
  const auto hi = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  // transformers 5.23's apply_chat_template renderings (tests/data/chat_templates/goldens/Qwen-Qwen3-0.6B.jsonl)
  const std::string thinking = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  CHECK(chat.render(hi, true) == thinking);
  chat.set_template_kwargs({{"enable_thinking", false}});
  CHECK(chat.render(hi, true) == thinking + "<think>\n\n</think>\n\n");
  ax::test::remove_tree(dir);
}

TEST_CASE("cli generate: template kwargs from --template-kwargs, or the adapter's training run's (Qwen3, enable_thinking)") {
  auto dir = ax::test::scratch_dir("cli_template_kwargs");
  ax::test::make_tiny_llama(dir / "model");
  std::ofstream(dir / "model" / "chat_template.jinja") << templ("Qwen-Qwen3-0.6B.jinja");
  {
    std::ofstream chats(dir / "chats.jsonl");
    for (int i = 0; i < 12; ++i)
      chats << nlohmann::json{{"messages", {{{"role", "user"}, {"content", std::to_string(i) + "+1?"}},
                                            {{"role", "assistant"}, {"content", std::to_string(i + 1)}}}}}
                   .dump()
            << "\n";
  }
  std::ofstream(dir / "run.toml") << "[run]\noutput_dir = \"out\"\n[model]\npath = \"model\"\n"
                                  << "[data]\nsequence_len = 64\ncache_dir = \"cache\"\n"
                                  << "[[datasets]]\ntype = \"chat_template\"\npath = \"chats.jsonl\"\n"
                                  << "[datasets.template_kwargs]\nenable_thinking = false\n"
                                  << "[lora]\nr = 4\nalpha = 8\n[train]\nmax_steps = 2\nmicro_batch_size = 1\nwarmup_steps = 0\n";
  REQUIRE(run({"run", "--config", (dir / "run.toml").string()}, dir / "run.log") == 0);
  const fs::path adapter = dir / "out" / "checkpoints" / "step-00000002";
  CHECK(nlohmann::json::parse(slurp(adapter / "axengine_training.json"))["template_kwargs"] ==
        nlohmann::json::array({{{"enable_thinking", false}}}));

  auto tok = ax::load_hf_tokenizer((dir / "model").string());
  const std::string prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  const std::size_t thinking = tok->encode(prompt, false).size(), not_thinking = tok->encode(prompt + "<think>\n\n</think>\n\n", false).size();
  REQUIRE(not_thinking > thinking);
  std::ofstream(dir / "in.jsonl") << "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n";
  auto prompt_tokens = [&](std::vector<std::string> extra, const std::string& tag) {
    std::vector<std::string> args{"generate", "--model", (dir / "model").string(), "--input", (dir / "in.jsonl").string(),
                                  "--output", (dir / (tag + ".jsonl")).string(), "--max-new-tokens", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    REQUIRE(run(args, dir / (tag + ".log")) == 0);
    return rows(dir / (tag + ".jsonl"))[0]["prompt_tokens"].get<std::size_t>();
  };
  CHECK(prompt_tokens({}, "plain") == thinking);
  CHECK(prompt_tokens({"--template-kwargs", "enable_thinking=false"}, "flag") == not_thinking);
  CHECK(prompt_tokens({"--template-kwargs", "{\"enable_thinking\": false}"}, "json") == not_thinking);
  // With the adapter: the run's kwargs, unless the command line says otherwise.
  CHECK(prompt_tokens({"--adapter", adapter.string()}, "adapter") == not_thinking);
  CHECK(slurp(dir / "adapter.log").find("template kwargs {\"enable_thinking\":false} (the training run's") != std::string::npos);
  CHECK(prompt_tokens({"--adapter", adapter.string(), "--template-kwargs", "enable_thinking=true"}, "override") == thinking);
  CHECK(run({"generate", "--model", (dir / "model").string(), "--input", (dir / "in.jsonl").string(), "--output",
             (dir / "bad.jsonl").string(), "--template-kwargs", "enable_thinking"},
            dir / "bad.log") == 2);
  // A merged model keeps the run's kwargs in its merge record.
  REQUIRE(run({"merge-lora", "--adapter", adapter.string(), "--out", (dir / "merged").string()}, dir / "merge.log") == 0);
  std::vector<std::string> args{"generate", "--model", (dir / "merged").string(), "--input", (dir / "in.jsonl").string(),
                                "--output", (dir / "merged.jsonl").string(), "--max-new-tokens", "1"};
  REQUIRE(run(args, dir / "merged.log") == 0);
  CHECK(rows(dir / "merged.jsonl")[0]["prompt_tokens"].get<std::size_t>() == not_thinking);
  ax::test::remove_tree(dir);
}

TEST_CASE("cli generate and chat: a chat answer ends at the template's end-of-turn token when generation_config names another eos") {
  auto dir = ax::test::scratch_dir("cli_end_of_turn");
  make_im_end_model(dir / "model");
  std::ofstream(dir / "model" / "chat_template.jinja")
      << "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  std::ofstream(dir / "in.jsonl") << "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n{\"prompt\": \"hi\"}\n";
  REQUIRE(run({"generate", "--model", (dir / "model").string(), "--input", (dir / "in.jsonl").string(), "--output",
               (dir / "out.jsonl").string(), "--max-new-tokens", "4"},
              dir / "gen.log") == 0);
  const auto out = rows(dir / "out.jsonl");
  REQUIRE(out.size() == 2);
  // The chat row ends at <|im_end|>, as it would in transformers with Qwen's generation_config.
  CHECK(out[0]["finish_reason"] == "eos");
  CHECK(out[0]["tokens"] == nlohmann::json::array({258}));
  CHECK(out[0]["text"] == "");
  // A raw prompt has no turns to end: only the model's eos ends it.
  CHECK(out[1]["finish_reason"] == "length");
  CHECK(out[1]["tokens"] == nlohmann::json::array({258, 258, 258, 258}));

  // chat: each answer ends there too (one empty answer a turn, not four <|im_end|>).
  std::ofstream(dir / "turns.in") << "hi\nagain\n";
  const std::string cmd = "OMP_NUM_THREADS=1 " + std::string(AXENGINE_BIN_DIR) + "/axengine chat --model " +
                          (dir / "model").string() + " --max-new-tokens 4 < " + (dir / "turns.in").string() + " > " +
                          (dir / "turns.out").string() + " 2> " + (dir / "turns.err").string();
  REQUIRE(std::system(cmd.c_str()) == 0);
  CHECK(lines_of(dir / "turns.out") == std::vector<std::string>{"", ""});
  ax::test::remove_tree(dir);
}

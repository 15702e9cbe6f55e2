// The chat_template dataset type: train_on modes, ShareGPT mapping, the template lookup, each refusal (naming the
// key, the row, the template line), and a quickstart-sized CPU run on committed conversations whose loss falls.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <toml++/toml.h>

#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "data/chat_template.hpp"
#include "data/types.hpp"
#include "unit/cli_util.hpp"
#include "unit/test_util.hpp"

namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(AXENGINE_TEST_DATA_DIR) + "/";
const char* kChatml =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";

struct Fixture {
  ax_test::TempDir dir;
  std::string model = dir / "model";
  std::unique_ptr<ax::Tokenizer> tok;
  Fixture(const std::string& template_text = kChatml) {
    fs::create_directories(model);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(kData + "tokenizers/qwen2_bytelevel/" + f, model + "/" + f);
    if (!template_text.empty()) ax_test::write_file(model + "/chat_template.jinja", template_text);
    tok = ax::load_hf_tokenizer(model);
  }
  std::shared_ptr<ax::Dataset> open(const std::string& rows, const std::string& keys = "") {
    ax_test::write_file(dir / "d.jsonl", rows);
    auto table = toml::parse("type = \"chat_template\"\npath = \"d.jsonl\"\n" + keys);
    return ax::data::make_chat_template_type()->open(table, ax::DatasetContext{tok.get(), "run.toml", dir.path.string(), model});
  }
  std::string error(const std::string& rows, const std::string& keys = "") {
    try {
      auto ds = open(rows, keys);
      for (std::size_t i = 0; i < ds->size(); ++i) ds->get(i);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
  std::string trained(const ax::Sample& s) const {
    std::vector<int32_t> ids;
    for (int32_t l : s.labels)
      if (l != -100) ids.push_back(l);
    return tok->decode(ids);
  }
};

const std::string kRow =
    R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},)"
    R"( {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}, {"role": "assistant", "content": "ciao"}]})"
    "\n";

}  // namespace

TEST_CASE("chat_template: train_on assistant / last / all, spans extended over the end-of-turn marker") {
  Fixture f;
  auto s = f.open(kRow)->get(0);
  CHECK(f.tok->decode(s.input_ids) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>user\nbye<|im_end|>\n<|im_start|>assistant\nciao<|im_end|>\n");
  CHECK(f.trained(s) == "hello<|im_end|>ciao<|im_end|>");
  CHECK(f.trained(f.open(kRow, "train_on = \"last\"\n")->get(0)) == "ciao<|im_end|>");
  auto all = f.open(kRow, "train_on = \"all\"\n")->get(0);
  CHECK(all.labels == all.input_ids);
  // The rule on its own: a span ends at the content when no marker follows; custom markers replace the defaults.
  ax::jinja::Json msgs = ax::jinja::Json::parse(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])");
  CHECK((ax::data::find_assistant_spans("U: a\nA: b</s>", msgs, {}) == std::vector<ax::data::ByteSpan>{{8, 9}}));
  CHECK((ax::data::find_assistant_spans("U: a\nA: b</s>", msgs, {"</s>"}) == std::vector<ax::data::ByteSpan>{{8, 13}}));
  // A user text containing the assistant's words does not capture the span: messages are found in order.
  msgs = ax::jinja::Json::parse(R"([{"role": "user", "content": "say b"}, {"role": "assistant", "content": "b"}])");
  CHECK((ax::data::find_assistant_spans("U: say b\nA: b", msgs, {}) == std::vector<ax::data::ByteSpan>{{12, 13}}));
}

TEST_CASE("chat_template: ShareGPT rows through field/role mappings; other message keys reach the template") {
  Fixture f("{% for m in messages %}[{{ m.role }}{% if m.name %}:{{ m.name }}{% endif %}] {{ m.content }}<|im_end|>{% endfor %}");
  const std::string sharegpt =
      R"({"conversations": [{"from": "human", "value": "hi", "name": "bob"}, {"from": "gpt", "value": "yo"}]})" "\n";
  auto s = f.open(sharegpt, "field_messages = \"conversations\"\nmessage_field_role = \"from\"\nmessage_field_content = \"value\"\n"
                            "roles = { human = \"user\", gpt = \"assistant\" }\n")->get(0);
  CHECK(f.tok->decode(s.input_ids) == "[user:bob] hi<|im_end|>[assistant] yo<|im_end|>");
  CHECK(f.trained(s) == " yo<|im_end|>");  // the byte-level token " yo" overlaps the span
}

TEST_CASE("chat_template: the template comes from the model dir, tokenizer_config.json, or a file; none is an error") {
  Fixture none("");
  const std::string err = none.error(kRow);
  CHECK(err.find("no chat template") != std::string::npos);
  CHECK(err.find("chat_template.jinja") != std::string::npos);
  CHECK(err.find("tokenizer_config.json (key chat_template)") != std::string::npos);
  ax_test::write_file(none.dir / "t.jinja", "{% for m in messages %}{{ m.content }}|{% endfor %}");
  CHECK(none.trained(none.open(kRow, "chat_template = \"t.jinja\"\n")->get(0)) == "hellociao");  // "|" ends no turn
  CHECK(none.error(kRow, "chat_template = \"missing.jinja\"\n").find("'chat_template': ") != std::string::npos);
}

TEST_CASE("chat_template: refusals name the key, the row and the template line") {
  Fixture f;
  CHECK(f.error(kRow, "train_on = \"assistants\"\n").find("train_on") != std::string::npos);
  CHECK(f.error(kRow, "field_mesages = \"m\"\n").find("did you mean 'datasets.field_messages'") != std::string::npos);
  CHECK(f.error("{\"msgs\": []}\n").find("d.jsonl:1: field 'messages' is missing") != std::string::npos);
  CHECK(f.error(R"({"messages": [{"role": "robot", "content": "x"}]})" "\n").find("d.jsonl:1: message 0: role 'robot'") !=
        std::string::npos);
  CHECK(f.error(R"({"messages": [{"role": "user", "content": 5}]})" "\n").find("must be a string, a list of content parts (or null)") != std::string::npos);
  Fixture rewrites("{% for m in messages %}{{ m.content | upper }}{% endfor %}");
  const std::string row = R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "answer"}]})" "\n";
  CHECK(rewrites.error(row).find("d.jsonl:1: message 1 (assistant): its content is not in the rendered text") != std::string::npos);
  Fixture raises("{% for m in messages %}\n{% if m.role == 'user' %}{{ raise_exception('no users') }}{% endif %}{% endfor %}");
  const std::string err = raises.error(row);
  CHECK(err.find("d.jsonl:1: the chat template refused the conversation") != std::string::npos);
  CHECK(err.find("chat_template.jinja:2:") != std::string::npos);
  CHECK(err.find("no users") != std::string::npos);
}

TEST_CASE("chat_template: a quickstart-sized CPU run on OpenAI and ShareGPT conversations learns") {
  using ax::test::run;
  auto dir = ax::test::scratch_dir("chat_template_train");
  const fs::path model = dir / "model";
  REQUIRE(run({"init-model", "--preset", "tiny-llama", "--out", model.string()}, dir / "init.log") == 0);
  fs::copy_file(kData + "chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja", model / "chat_template.jinja");
  const std::string chat = kData + "datasets/chat/";
  std::ofstream(dir / "run.toml") << "[run]\noutput_dir = \"out\"\nseed = 1\n[model]\npath = \"model\"\n"
                                     "[data]\nsequence_len = 512\neval_fraction = 0\n"
                                     "[[datasets]]\ntype = \"chat_template\"\npath = \"" << chat << "messages.jsonl\"\n"
                                     "[[datasets]]\ntype = \"chat_template\"\npath = \"" << chat << "sharegpt.jsonl\"\n"
                                     "field_messages = \"conversations\"\nmessage_field_role = \"from\"\nmessage_field_content = \"value\"\n"
                                     "roles = { human = \"user\", gpt = \"assistant\" }\n"
                                     "[lora]\ntargets = [\"q_proj\", \"v_proj\", \"o_proj\", \"up_proj\", \"down_proj\"]\nr = 16\nalpha = 32\n"
                                     "[train]\nlr = 3e-3\nmax_steps = 40\nmicro_batch_size = 2\nlog_every = 10\ncpu_threads = 1\n";
  const int rc = run({"run", "--config", (dir / "run.toml").string(), "--set", "device.type=cpu"}, dir / "run.log");
  INFO(ax::test::slurp(dir / "run.log"));
  REQUIRE(rc == 0);
  auto steps = ax::test::step_records(dir / "out/metrics.jsonl");
  REQUIRE(steps.size() == 40);
  auto mean = [&](std::size_t from) {
    double s = 0;
    for (std::size_t i = from; i < from + 5; ++i) s += steps[i]["loss"].get<double>();
    return s / 5;
  };
  CHECK(mean(35) < 0.7 * mean(0));
}

#include "axengine/config.hpp"

#include <filesystem>
#include <sstream>

#include "axengine/error.hpp"
#include "axengine/kernel_op.hpp"
#include "axengine/model.hpp"
#include "axengine/strings.hpp"
#include "input_file.hpp"

namespace fs = std::filesystem;

namespace ax {
namespace {

std::vector<ConfigSection>& extra_sections() {
  static std::vector<ConfigSection> all;
  return all;
}

std::string resolve_path(const std::string& dir, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute() || dir.empty()) return p;
  return (fs::path(dir) / p).lexically_normal().string();
}

// [kernels]: one preference list per op (by config key), `strict`, and [kernels.arch.sm_XX] overrides.
void bind_kernel_lists(TableBinder& t, std::map<std::string, std::vector<std::string>>& out) {
  for (const auto& op : known_ops()) {
    std::vector<std::string> list;
    t.field(op.config_key.c_str(), list, ("backends to try for " + op.id + ", in order").c_str());
    if (t.table() && t.table()->get(op.config_key)) {
      if (list.empty()) t.fail(t.table()->get(op.config_key), str("'", t.path(), ".", op.config_key, "' is empty"));
      out[op.id] = list;
    }
  }
}

void bind_kernels(TableBinder& t, KernelPreferences& k) {
  t.field("strict", k.strict, "error out when no listed backend fits, instead of falling back to `reference`");
  bind_kernel_lists(t, k.prefer);
  TableBinder arch = t.sub("arch", "per-GPU overrides: [kernels.arch.sm_120] moe = [...] replaces the lists on that arch");
  if (arch.table()) {
    for (const auto& [key, node] : *arch.table()) {
      std::string name(key.str());
      auto a = parse_arch(name);
      if (!a) arch.fail(&node, str("'kernels.arch.", name, "' is not a CUDA arch like sm_90 or sm_120"));
      arch.accept(name);
      TableBinder per = arch.sub(name.c_str(), "");
      bind_kernel_lists(per, k.by_arch[*a]);
      per.finish();
    }
  } else if (t.context().docs) {
    TableBinder per(nullptr, "kernels.arch.<sm_XX>", t.context());
    std::map<std::string, std::vector<std::string>> unused;
    bind_kernel_lists(per, unused);
  }
  arch.finish();
}

// The weight keys that only mean something with some formats are refused elsewhere, never ignored.
void bind_weight_keys(const TableBinder& t, const ModelSection& m) {
  const toml::table* tab = t.table();
  if (!tab) return;
  auto given = [&](const char* key) { return tab->get(key); };
  const int64_t bs = m.quant_blocksize;
  if ((bs & (bs - 1)) != 0) t.fail(given("quant_blocksize"), str("'model.quant_blocksize' is ", bs, ", not a power of two"));
  if (m.weight_format != "nf4")
    for (const char* key : {"quant_blocksize", "double_quant"})
      if (given(key))
        t.fail(given(key), str("'model.", key, "' applies to weight_format = \"nf4\" only (this config has \"",
                               m.weight_format, "\")"));
  if (m.weight_format == "dense" && given("skip_modules"))
    t.fail(given("skip_modules"), "'model.skip_modules' needs a weight_format other than \"dense\" (nothing is packed)");
}

void bind_all(const toml::table* doc, RunConfig& c, const BindContext& ctx) {
  TableBinder root(doc, "", ctx);
  {
    TableBinder t = root.sub("run", "where results go and how the run is seeded");
    t.field("output_dir", c.run.output_dir, "output directory (checkpoints, metrics, report), relative to the config file");
    t.field("seed", c.run.seed, "seed for initialisation, shuffling and dropout");
    t.choice("log_level", c.run.log_level, {"trace", "debug", "info", "warn", "error", "off"}, "log verbosity (env AXENGINE_LOG overrides)");
    t.finish();
  }
  {
    TableBinder t = root.sub("model", "the base model");
    t.field("path", c.model.path, "Hugging Face model directory (config.json, *.safetensors, tokenizer.json), relative to the config file");
    t.choice("dtype", c.model.dtype, {"auto", "fp32", "bf16", "fp16"}, "compute dtype; auto = bf16 on CUDA, fp32 on CPU");
    t.choice("weight_format", c.model.weight_format, {"dense", "nf4", "mxfp4", "nvfp4"},
             "format the frozen base projections are packed into at load (QLoRA when not dense); embeddings, lm_head, "
             "routers and norms stay in the compute dtype (docs/weights.md)");
    t.field("skip_modules", c.model.skip_modules,
            "projections kept in the compute dtype although weight_format packs the rest: module names matched as "
            "dotted segments of the path (\"o_proj\", \"experts\", \"layers.0\"); each must match a module");
    t.bounded("quant_blocksize", c.model.quant_blocksize, 16, 4096, "nf4: elements per absmax block (a power of two)");
    t.field("double_quant", c.model.double_quant, "nf4: quantise the per-block absmax too (bitsandbytes compress_statistics)");
    t.finish();
    bind_weight_keys(t, c.model);
  }
  {
    TableBinder t = root.sub("device", "which device runs, and which one kernel selection assumes");
    t.choice("type", c.device.type, {"auto", "cpu", "cuda"}, "auto = CUDA when available");
    t.field("arch", c.device.arch, "select kernels as on this GPU arch (e.g. \"sm_120\"); env AXENGINE_ARCH wins");
    t.finish();
    if (!c.device.arch.empty() && !parse_arch(c.device.arch))
      t.fail(doc && t.table() ? t.table()->get("arch") : nullptr, str("'device.arch' is \"", c.device.arch, "\", not a CUDA arch like sm_90 or sm_120"));
  }
  {
    TableBinder t = root.sub("plugins", "plugin discovery");
    t.field("paths", c.plugins.paths, "directories or .so files searched before AXENGINE_PLUGIN_PATH and <exe dir>/plugins");
    t.finish();
  }
  {
    TableBinder t = root.sub("kernels", "kernel backend preference per op: the first whose requirements fit the device wins");
    bind_kernels(t, c.kernels);
    t.finish();
  }
  for (const auto& s : extra_sections()) {
    if (s.array) {
      root.accept(s.name);
      if (ctx.docs) {
        ctx.docs->push_back({s.name + "[]", "table", "", s.doc});
        TableBinder t(nullptr, s.name + "[]", ctx);
        s.bind(t, c);
      }
      const toml::node* n = doc ? doc->get(s.name) : nullptr;
      if (!n) continue;
      if (!n->is_array_of_tables()) config_fail(ctx.file, n, str("'", s.name, "' must be written as [[", s.name, "]] tables"));
      for (const auto& e : *n->as_array()) {
        TableBinder t(e.as_table(), s.name, ctx);
        s.bind(t, c);
        t.finish();
      }
      continue;
    }
    TableBinder t = root.sub(s.name.c_str(), s.doc.c_str());
    s.bind(t, c);
    t.finish();
  }
  root.finish();
}

// "a.b.c=value": value parsed as a TOML value when it is one, else taken as a bare string.
void apply_override(toml::table& doc, const std::string& text) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) throw UsageError(str("--set '", text, "': expected KEY=VALUE (e.g. run.seed=7)"));
  std::string key = text.substr(0, eq), value = text.substr(eq + 1);
  std::string source = "--set " + text;
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value, source);
  } catch (const toml::parse_error&) {
    parsed = toml::parse("v = \"\"", source);
    parsed.insert_or_assign("v", value);
  }
  toml::table* t = &doc;
  std::size_t start = 0;
  for (std::size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1) {
    std::string part = key.substr(start, dot - start);
    if (part.empty()) throw UsageError(str("--set '", text, "': empty key component"));
    toml::node* n = t->get(part);
    if (!n) n = &t->insert_or_assign(part, toml::table{}).first->second;
    if (!n->is_table()) throw UsageError(str("--set '", text, "': '", key.substr(0, dot), "' is not a table"));
    t = n->as_table();
  }
  std::string last = key.substr(start);
  if (last.empty()) throw UsageError(str("--set '", text, "': empty key component"));
  t->insert_or_assign(last, *parsed.get("v"));
}

}  // namespace

void register_config_section(ConfigSection section) { extra_sections().push_back(std::move(section)); }

RunConfig load_config(const std::string& file, const std::vector<std::string>& overrides) {
  RunConfig c;
  c.file = file;
  std::error_code ec;
  if (!fs::exists(file, ec)) throw UsageError(str(file, ": no such config file"));
  // Read through InputFile, not toml::parse_file: a FIFO or device named as the config is refused with
  // "not a regular file" rather than opened (which would block on a FIFO).
  const std::string text = read_regular_file(file, "run config");
  c.dir = fs::absolute(file, ec).parent_path().string();
  try {
    c.document = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    throw ConfigError(file, static_cast<int>(src.begin.line), static_cast<int>(src.begin.column), std::string(e.description()));
  }
  for (const auto& o : overrides) apply_override(c.document, o);
  bind_all(&c.document, c, BindContext{file, nullptr});
  c.run.output_dir = resolve_path(c.dir, c.run.output_dir);
  c.model.path = resolve_path(c.dir, c.model.path);
  for (auto& p : c.plugins.paths) p = resolve_path(c.dir, p);
  return c;
}

std::string config_reference_markdown() {
  std::vector<ConfigKeyDoc> docs;
  RunConfig defaults;
  bind_all(nullptr, defaults, BindContext{"", &docs});
  std::ostringstream os;
  std::string section;
  for (const auto& d : docs) {
    if (d.type == "table") {
      os << (section.empty() ? "" : "\n") << "### [" << d.key << "]\n\n" << d.doc << "\n\n"
         << "| key | type | default | meaning |\n|---|---|---|---|\n";
      section = d.key;
      continue;
    }
    std::string def = d.deflt.empty() ? "—" : "`" + d.deflt + "`";
    os << "| `" << d.key << "` | " << d.type << " | " << def << " | " << d.doc << " |\n";
  }
  return os.str();
}

WeightPolicy weight_policy(const ModelSection& m) {
  WeightPolicy p;
  p.format = m.weight_format;
  p.skip_modules = m.skip_modules;
  p.blocksize = m.quant_blocksize;
  p.double_quant = m.double_quant;
  return p;
}

std::string resolve_dtype(const std::string& dtype, bool cuda) {
  if (dtype == "auto") return cuda ? "bf16" : "fp32";
  return dtype;
}

}  // namespace ax

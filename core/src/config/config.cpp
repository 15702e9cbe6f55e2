#include "axengine/config.hpp"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "axengine/error.hpp"
#include "axengine/hub_cache.hpp"
#include "axengine/input_file.hpp"
#include "axengine/kernel_op.hpp"
#include "axengine/model.hpp"
#include "axengine/strings.hpp"

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

// Ops that no model calls: building blocks that other ops' backends run inside their own kernels (scattermoe's
// and the reference's moe.mlp compose their own moe.experts; every linear_lora and moe.mlp backend decodes its
// packed weights itself). A list for one would change nothing in a run, so it is refused, naming the key that
// does choose that kernel (docs/config.md, "Kernel selection"). `conformance --op` and `bench moe` take their
// backends from the command line, not from these lists.
struct InnerOp {
  const char* op;
  const char* why;
  std::vector<std::string> instead;  // the config keys that choose those kernels, under the same table
};
const InnerOp* inner_op(const std::string& id) {
  static const std::vector<InnerOp> ops = {
      {"moe.experts", "every MoE model calls moe.mlp, the whole expert block, and its backend runs its own expert kernels",
       {"moe_mlp"}},
      {"dequant", "packed weights are decoded inside the linear_lora and moe_mlp backends", {"linear_lora", "moe_mlp"}},
  };
  for (const auto& o : ops)
    if (id == o.op) return &o;
  return nullptr;
}

// [kernels]: one preference list per op (by config key), `strict`, and [kernels.arch.sm_XX] overrides.
void bind_kernel_lists(TableBinder& t, std::map<std::string, std::vector<std::string>>& out) {
  for (const auto& op : known_ops()) {
    if (const InnerOp* inner = inner_op(op.id)) {
      const toml::node* given = t.table() ? t.table()->get(op.config_key) : nullptr;
      if (given) {
        std::vector<std::string> keys;
        for (const auto& k : inner->instead) keys.push_back(str("'", t.path(), ".", k, "'"));
        t.fail(given, str("'", t.path(), ".", op.config_key, "' would choose a ", op.id, " backend, but no model calls ", op.id,
                          ": ", inner->why, "; choose the kernel with ", join(keys, " or "),
                          " (`axengine plugins explain` shows the choice; docs/config.md, \"Kernel selection\")"));
      }
      continue;
    }
    std::vector<std::string> list;
    t.field(op.config_key.c_str(), list, ("backends to try for " + op.id + ", in order").c_str());
    if (t.table() && t.table()->get(op.config_key)) {
      if (list.empty()) t.fail(t.table()->get(op.config_key), str("'", t.path(), ".", op.config_key, "' is empty"));
      out[op.id] = list;
    }
  }
}

const std::string kOptionsPrefix = "kernels.options.";

// [kernels.options.<backend>]: each table belongs to the loaded plugin that declared it and is bound by its
// code; one that no loaded plugin owns is an error naming the backend. (When documenting, the plugin tables
// are listed after the core sections instead: bind_all.)
void bind_backend_options(TableBinder& t, const std::vector<PluginConfigTable>& tables) {
  TableBinder opts = t.sub("options", "per-backend options: one table [kernels.options.<backend>] per backend, declared and "
                                      "documented by the plugin that provides it (plugin tables, below)");
  if (!opts.table()) return;
  std::vector<std::string> owned;
  for (const auto& pt : tables)
    if (pt.path.rfind(kOptionsPrefix, 0) == 0) owned.push_back(pt.path.substr(kOptionsPrefix.size()));
  for (const auto& [key, node] : *opts.table()) {
    const std::string name(key.str());
    auto it = std::find_if(tables.begin(), tables.end(), [&](const PluginConfigTable& pt) { return pt.path == kOptionsPrefix + name; });
    if (it == tables.end()) {
      const std::string hint = closest(name, owned);
      opts.fail(&node, str("'", kOptionsPrefix, name, "': no loaded plugin provides backend '", name, "'",
                           hint.empty() ? "" : str(" (did you mean '", kOptionsPrefix, hint, "'?)"),
                           "; `axengine plugins list` shows the plugins found and why any was refused"));
    }
    opts.accept(name);
    TableBinder per = opts.sub(name.c_str(), it->doc.c_str());
    it->bind(per);
    per.finish();
  }
  opts.finish();
}

void bind_kernels(TableBinder& t, KernelPreferences& k, const std::vector<PluginConfigTable>& tables) {
  t.field("strict", k.strict, "error out when no listed backend fits, instead of falling back to `reference`");
  bind_kernel_lists(t, k.prefer);
  TableBinder arch = t.sub("arch", "per-GPU overrides: [kernels.arch.sm_90] moe_mlp = [...] replaces the lists on that arch");
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
  bind_backend_options(t, tables);
}

void bind_run(TableBinder& t, RunSection& r) {
  t.field("output_dir", r.output_dir, "output directory (checkpoints, metrics, report), relative to the config file");
  t.field("seed", r.seed, "seed for initialisation, shuffling and dropout");
  t.choice("log_level", r.log_level, {"trace", "debug", "info", "warn", "error", "off"}, "log verbosity (env AXENGINE_LOG overrides)");
}

void bind_plugins(TableBinder& t, PluginsSection& p) {
  t.field("paths", p.paths, "directories or .so files searched before AXENGINE_PLUGIN_PATH and <exe dir>/plugins");
}

// A plugin's top-level table must not take a name core binds.
void check_not_core(const PluginConfigTable& pt) {
  static const std::vector<std::string> core{"run", "model", "device", "plugins", "kernels"};
  bool taken = std::find(core.begin(), core.end(), pt.path) != core.end();
  for (const auto& s : extra_sections()) taken = taken || s.name == pt.path;
  if (taken) throw UsageError(str("plugin '", pt.plugin, "' declares the config table [", pt.path, "], which core owns"));
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

void bind_all(const toml::table* doc, RunConfig& c, const BindContext& ctx, const std::vector<PluginConfigTable>& tables) {
  TableBinder root(doc, "", ctx);
  {
    TableBinder t = root.sub("run", "where results go and how the run is seeded");
    bind_run(t, c.run);
    t.finish();
  }
  {
    TableBinder t = root.sub("model", "the base model");
    t.field("path", c.model.path, "Hugging Face model directory (config.json, *.safetensors, tokenizer.json), relative to the config file; or a hub ID (\"Qwen/Qwen3-8B\", \"org/name@revision\") found offline in the Hugging Face hub cache (docs/models.md)");
    t.choice("dtype", c.model.dtype, {"auto", "fp32", "bf16", "fp16"}, "compute dtype; auto = bf16 on CUDA, fp32 on CPU; fp16 trains with dynamic loss scaling on fp32 LoRA factors (docs/training.md)");
    t.choice("weight_format", c.model.weight_format, {"dense", "nf4", "mxfp4", "nvfp4", "fp8"},
             "format the frozen base projections are packed into at load (QLoRA when not dense); embeddings, lm_head, "
             "routers and norms stay in the compute dtype; a pre-quantised (bitsandbytes nf4) checkpoint loads packed as "
             "stored under dense or nf4; fp8 keeps a fine-grained FP8 checkpoint's projections as stored (e4m3 + block "
             "scales, decoded on use; dense dequantises them at load) and is refused for any other checkpoint "
             "(docs/weights.md)");
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
    bind_plugins(t, c.plugins);
    t.finish();
  }
  {
    TableBinder t = root.sub("kernels", "kernel backend preference per op: the first whose requirements fit the device wins. An op not listed "
                                        "tries plugin backends, then core's production `aten`, then `reference` (the fp32 oracle)");
    bind_kernels(t, c.kernels, ctx.docs ? std::vector<PluginConfigTable>{} : tables);
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
  // Plugin tables: the top-level ones are bound here ([kernels.options.*] inside [kernels]); the schema lists
  // them all after the core sections, by path.
  std::vector<const PluginConfigTable*> sorted;
  for (const auto& pt : tables) sorted.push_back(&pt);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->path < b->path; });
  for (const PluginConfigTable* pt : sorted) {
    const bool top = pt->path.find('.') == std::string::npos;
    if (top) check_not_core(*pt);
    if (ctx.docs) {
      ctx.docs->push_back({pt->path, "table", "", str(pt->doc, " (plugin `", pt->plugin, "`)")});
      TableBinder t(nullptr, pt->path, ctx);
      pt->bind(t);
      if (top) root.accept(pt->path);
      continue;
    }
    if (!top) continue;
    TableBinder t = root.sub(pt->path.c_str(), pt->doc.c_str());
    pt->bind(t);
    t.finish();
  }
  root.finish();
}

// One component of a --set key: "datasets[0]" is the name "datasets" and the index 0 (npos: none).
struct KeyPart {
  std::string name;
  std::size_t index = std::string::npos;
};

KeyPart parse_key_part(const std::string& part, const std::string& text) {
  if (part.empty()) throw UsageError(str("--set '", text, "': empty key component"));
  const auto open = part.find('[');
  if (open == std::string::npos) return {part, std::string::npos};
  const std::string digits = part.substr(open + 1, part.size() - open - 2);
  if (open == 0 || part.back() != ']' || digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    throw UsageError(str("--set '", text, "': '", part, "' is not a key or key[index] (e.g. datasets[0].path)"));
  return {part.substr(0, open), static_cast<std::size_t>(std::stoul(digits))};
}

// The element `p.index` of the array at `n` (a list, or [[name]] tables), named in errors as `shown`.
toml::node* element(toml::node* n, const KeyPart& p, const std::string& shown, const std::string& text) {
  toml::array* a = n ? n->as_array() : nullptr;
  if (!a) throw UsageError(str("--set '", text, "': '", shown, "' is ", n ? "not a list" : "not in the config", " (",
                               p.name, "[", p.index, "] indexes a list or [[", p.name, "]] tables)"));
  if (p.index >= a->size())
    throw UsageError(str("--set '", text, "': index ", p.index, " is out of range: '", shown, "' has ", a->size(),
                         a->size() == 1 ? " entry" : " entries", a->size() ? str(" (", p.name, "[0] to ", p.name, "[", a->size() - 1, "])") : ""));
  return a->get(p.index);
}

// "a.b.c=value": value parsed as a TOML value when it is one, else taken as a bare string. A component may index
// a list or an array of tables: "datasets[0].path=x" sets the first [[datasets]] entry's path (an index past the
// end is an error: --set changes entries, it does not add them).
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
    const KeyPart part = parse_key_part(key.substr(start, dot - start), text);
    toml::node* n = t->get(part.name);
    if (part.index != std::string::npos) {
      n = element(n, part, key.substr(0, start) + part.name, text);
    } else if (!n) {
      n = &t->insert_or_assign(part.name, toml::table{}).first->second;
    }
    if (!n->is_table()) throw UsageError(str("--set '", text, "': '", key.substr(0, dot), "' is not a table"));
    t = n->as_table();
  }
  const KeyPart last = parse_key_part(key.substr(start), text);
  if (last.index == std::string::npos) {
    t->insert_or_assign(last.name, *parsed.get("v"));
    return;
  }
  element(t->get(last.name), last, key.substr(0, start) + last.name, text);  // a list, and the index in range
  toml::array* a = t->get(last.name)->as_array();
  a->replace(a->cbegin() + static_cast<std::ptrdiff_t>(last.index), *parsed.get("v"));
}

}  // namespace

// Kept in name order, as the plugin tables are: the sections register from static objects of several files, whose
// constructors run in link order, which a unity build (cmake/AxUnity.cmake) changes; the schema and the order of
// binding must not.
void register_config_section(ConfigSection section) {
  auto& all = extra_sections();
  auto at = std::upper_bound(all.begin(), all.end(), section.name, [](const std::string& n, const ConfigSection& s) { return n < s.name; });
  all.insert(at, std::move(section));
}

RunConfig read_config(const std::string& file, const std::vector<std::string>& overrides) {
  RunConfig c;
  c.file = file;
  std::error_code ec;
  if (!file.empty()) {
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
  }
  for (const auto& o : overrides) apply_override(c.document, o);
  // What discovery needs; bind_config binds these again with everything else.
  TableBinder root(&c.document, "", BindContext{file, nullptr});
  TableBinder run = root.sub("run", "");
  bind_run(run, c.run);
  run.finish();
  TableBinder plugins = root.sub("plugins", "");
  bind_plugins(plugins, c.plugins);
  plugins.finish();
  for (auto& p : c.plugins.paths) p = resolve_path(c.dir, p);
  return c;
}

void bind_config(RunConfig& c, const std::vector<PluginConfigTable>& plugin_tables) {
  bind_all(&c.document, c, BindContext{c.file, nullptr}, plugin_tables);
  c.run.output_dir = resolve_path(c.dir, c.run.output_dir);
  c.model.path = hub::find_model_dir(c.model.path, c.dir);  // a directory, or a hub ID in the hub cache
  for (auto& p : c.plugins.paths) p = resolve_path(c.dir, p);
}

RunConfig load_config(const std::string& file, const std::vector<std::string>& overrides) {
  if (file.empty()) throw UsageError("no config file given");
  RunConfig c = read_config(file, overrides);
  bind_config(c);
  return c;
}

std::string config_reference_markdown(const std::vector<PluginConfigTable>& plugin_tables) {
  std::vector<ConfigKeyDoc> docs;
  RunConfig defaults;
  bind_all(nullptr, defaults, BindContext{"", &docs}, plugin_tables);
  std::ostringstream os;
  std::string section;
  bool header = false;  // a section's key table starts with its first key (a section may have none)
  for (const auto& d : docs) {
    if (d.type == "table") {
      os << (section.empty() ? "" : "\n") << "### [" << d.key << "]\n\n" << d.doc << "\n";
      section = d.key;
      header = false;
      continue;
    }
    if (!header) os << "\n| key | type | default | meaning |\n|---|---|---|---|\n";
    header = true;
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

#include "models/fp8_load.hpp"

#include <cctype>
#include <set>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/strings.hpp"

namespace ax::models {
using nlohmann::json;

namespace {

bool given(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

std::string shape_str(const std::vector<int64_t>& s) {
  std::vector<std::string> v;
  for (auto d : s) v.push_back(std::to_string(d));
  return "[" + join(v, ", ") + "]";
}

bool is_fp8(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2; }

}  // namespace

Fp8Config parse_fp8_config(const json& cfg, const std::string& source) {
  Fp8Config out;
  if (!cfg.is_object() || !given(cfg, "quantization_config")) return out;
  const json& q = cfg["quantization_config"];
  if (!q.is_object() || !q.contains("quant_method") || q["quant_method"] != "fp8") return out;
  auto bad = [&](const std::string& key, const std::string& msg) {
    return UsageError(str(source, ": 'quantization_config.", key, "' ", msg));
  };
  // FineGrainedFP8Config's keys (transformers 5.23); anything else would be a setting we silently ignore.
  static const std::set<std::string> known{"quant_method", "activation_scheme", "weight_block_size", "fmt", "scale_fmt",
                                           "dequantize", "modules_to_not_convert", "modules_to_convert", "expert_dtype"};
  for (const auto& [k, v] : q.items())
    if (!known.count(k)) throw bad(k, "is not a key of an fp8 quantization_config (FineGrainedFP8Config)");
  auto string_or = [&](const char* key, const std::string& def) {
    if (!given(q, key)) return def;
    if (!q[key].is_string()) throw bad(key, str("must be a string, got ", q[key].dump()));
    return q[key].get<std::string>();
  };
  std::string scheme = string_or("activation_scheme", "dynamic");
  for (auto& ch : scheme) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));  // transformers lowercases it
  if (scheme != "dynamic")
    throw bad("activation_scheme", str("'", scheme, "' is not supported (only dynamic: the weights are dequantised at "
                                       "load and the activations stay in the compute dtype)"));
  if (const std::string fmt = string_or("fmt", "e4m3"); fmt != "e4m3")
    throw bad("fmt", str("'", fmt, "' is not supported (only e4m3: float8_e4m3fn weights)"));
  if (const std::string sf = string_or("scale_fmt", "float"); sf != "float")
    throw bad("scale_fmt", str("'", sf, "' is not supported (only float: fp32 weight_scale_inv)"));
  if (const std::string ed = string_or("expert_dtype", "fp8"); ed != "fp8")
    throw bad("expert_dtype", str("'", ed, "' is not supported (only fp8)"));
  if (q.contains("dequantize") && !q["dequantize"].is_boolean() && !q["dequantize"].is_null())
    throw bad("dequantize", str("must be true or false, got ", q["dequantize"].dump()));
  for (const char* key : {"modules_to_not_convert", "modules_to_convert"})
    if (given(q, key) && !q[key].is_array()) throw bad(key, str("must be a list of module names, got ", q[key].dump()));
  if (q.contains("weight_block_size") && q["weight_block_size"].is_null())
    throw bad("weight_block_size", "null (one scale per tensor) is not supported: only block-wise FP8 ([rows, cols] per scale)");
  if (given(q, "weight_block_size")) {
    const json& b = q["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() || b[0].get<int64_t>() <= 0 ||
        b[1].get<int64_t>() <= 0 || b[0].get<int64_t>() > 65536 || b[1].get<int64_t>() > 65536)
      throw bad("weight_block_size", str("must be two block sizes in 1..65536 ([rows, cols], e.g. [128, 128]), got ", b.dump()));
    out.block_rows = b[0].get<int64_t>();
    out.block_cols = b[1].get<int64_t>();
  }
  out.present = true;
  return out;
}

std::string fp8_scale_key(const std::string& key) { return key + "_scale_inv"; }

bool fp8_stored(const safetensors::Checkpoint& ckpt, const std::string& key) {
  return ckpt.has(fp8_scale_key(key)) || (ckpt.has(key) && is_fp8(ckpt.info(key).scalar_type));
}

void check_fp8_weight(const Fp8Config& c, const std::string& config_source, const safetensors::Checkpoint& ckpt,
                      const std::string& key) {
  const std::string sk = fp8_scale_key(key);
  const auto& w = ckpt.info(key);
  if (!c.present)
    throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' is stored as FP8 (", w.dtype, ckpt.has(sk) ? str(", with '", sk, "'") : "",
                         ") but ", config_source, " has no quantization_config with quant_method fp8"));
  if (w.scalar_type != at::kFloat8_e4m3fn)
    throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' has dtype ", w.dtype, " but '", sk,
                         "' beside it makes it an FP8 weight: only F8_E4M3 (float8_e4m3fn) is supported"));
  if (!ckpt.has(sk))
    throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' is FP8 (", w.dtype, ") but its scale '", sk,
                         "' is missing (fine-grained FP8 stores one fp32 scale per ", c.block_rows, "x", c.block_cols, " block)"));
  const auto& s = ckpt.info(sk);
  if (s.scalar_type != at::kFloat && s.scalar_type != at::kBFloat16)
    throw UsageError(str(ckpt.file_of(sk), ": tensor '", sk, "' has dtype ", s.dtype, " (an FP8 weight's scales must be F32 or BF16)"));
  std::vector<int64_t> want = w.shape;
  if (want.size() < 2)
    throw UsageError(str(ckpt.file_of(key), ": tensor '", key, "' is FP8 with shape ", shape_str(w.shape),
                         " (block-wise FP8 weights have at least 2 dims)"));
  const std::size_t n = want.size();
  want[n - 2] = (want[n - 2] + c.block_rows - 1) / c.block_rows;
  want[n - 1] = (want[n - 1] + c.block_cols - 1) / c.block_cols;
  if (s.shape != want)
    throw UsageError(str(ckpt.file_of(sk), ": tensor '", sk, "' has shape ", shape_str(s.shape), " but '", key, "' ",
                         shape_str(w.shape), " in blocks of weight_block_size [", c.block_rows, ", ", c.block_cols, "] needs ",
                         shape_str(want)));
}

ops::WeightTensor fp8_weight(const at::Tensor& w, const at::Tensor& scale_inv, int64_t block_rows, int64_t block_cols) {
  ops::WeightTensor out;
  out.format = ops::WeightFormat::fp8;
  out.shape = w.sizes().vec();
  out.block_rows = static_cast<int32_t>(block_rows);
  out.blocksize = block_cols;
  out.codes = w;
  out.scales = scale_inv.to(at::kFloat);  // bf16 scales are exact in fp32
  return out;
}

at::Tensor fp8_dequantize(const at::Tensor& w, const at::Tensor& scale_inv, int64_t block_rows, int64_t block_cols) {
  return ops::dequantize(fp8_weight(w, scale_inv, block_rows, block_cols), at::kFloat);
}

at::Tensor read_fp8_dequantized(const Fp8Config& c, const std::string& config_source, const safetensors::Checkpoint& ckpt,
                                const std::string& key) {
  check_fp8_weight(c, config_source, ckpt, key);
  return fp8_dequantize(ckpt.get(key), ckpt.get(fp8_scale_key(key)), c.block_rows, c.block_cols);
}

ops::WeightTensor read_fp8_packed(const Fp8Config& c, const std::string& config_source, const safetensors::Checkpoint& ckpt,
                                  const std::string& key) {
  check_fp8_weight(c, config_source, ckpt, key);
  return fp8_weight(ckpt.get(key), ckpt.get(fp8_scale_key(key)), c.block_rows, c.block_cols);
}

std::string fp8_unpackable(const Fp8Config& c, const safetensors::Checkpoint& ckpt,
                           const std::vector<std::pair<std::string, std::vector<int64_t>>>& keys, int64_t per) {
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto& [key, shape] = keys[i];
    if (!ckpt.has(key) || !fp8_stored(ckpt, key)) return "not stored in FP8 in the checkpoint";
    // Every piece but an expert's last one must end on a block boundary of the fused rows.
    if (per > 1 && (i + 1) % static_cast<std::size_t>(per) != 0 && shape.size() == 2 && shape[0] % c.block_rows != 0)
      return str("its per-expert pieces have ", shape[0], " rows, not a multiple of weight_block_size's ", c.block_rows,
                 ": fused, one block would hold two pieces (dequantised at load)");
  }
  return "";
}

ops::WeightTensor stack_fp8_experts(const std::vector<ops::WeightTensor>& parts, int64_t per) {
  std::vector<at::Tensor> codes, scales, c_piece, s_piece;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    c_piece.push_back(parts[i].codes.view(at::kByte));  // bytes: cat and stack need no fp8 kernels
    s_piece.push_back(parts[i].scales);
    if (static_cast<int64_t>(c_piece.size()) == per) {
      codes.push_back(at::cat(c_piece, 0));
      scales.push_back(at::cat(s_piece, 0));
      c_piece.clear();
      s_piece.clear();
    }
  }
  return fp8_weight(at::stack(codes, 0).view(at::kFloat8_e4m3fn), at::stack(scales, 0), parts.front().block_rows,
                    parts.front().blocksize);
}

}  // namespace ax::models

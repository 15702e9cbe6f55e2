#include "models/bnb_load.hpp"

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/strings.hpp"

namespace ax::models {

namespace {

const char* const kStateNf4 = ".quant_state.bitsandbytes__nf4";
const char* const kStateFp4 = ".quant_state.bitsandbytes__fp4";

std::string shape_str(const std::vector<int64_t>& s) {
  std::vector<std::string> v;
  for (auto d : s) v.push_back(std::to_string(d));
  return str("[", join(v, ", "), "]");
}

// One field of a packed weight, checked for dtype and element count; a CPU tensor, flattened.
struct Fields {
  const safetensors::Checkpoint& ckpt;
  const std::string& key;

  std::string where(const std::string& name) const { return str(ckpt.file_of(name), ": tensor '", name, "'"); }
  at::Tensor get(const std::string& suffix, at::ScalarType dtype, int64_t numel) const {
    const std::string name = key + suffix;
    if (!ckpt.has(name))
      throw UsageError(str(ckpt.source(), ": tensor '", name, "' is missing: the packed weight '", key, "' needs it"));
    const auto& info = ckpt.info(name);
    if (info.scalar_type != dtype)
      throw UsageError(str(where(name), " has dtype ", info.dtype, ", a bitsandbytes 4-bit ",
                           suffix.empty() ? "weight" : suffix.substr(1), " is ", safetensors::dtype_name(dtype)));
    int64_t n = 1;
    for (auto d : info.shape) n *= d;
    if (n != numel)
      throw UsageError(str(where(name), " has shape ", shape_str(info.shape), " (", n, " elements) but its quant state implies ",
                           numel, " elements"));
    return ckpt.get(name).reshape(-1);
  }
};

at::Tensor nf4_table() {
  const auto& v = ops::nf4_values();
  return at::tensor(at::ArrayRef<float>(v.data(), v.size()), at::kFloat);
}

}  // namespace

bool bnb_packed(const safetensors::Checkpoint& ckpt, const std::string& key) {
  return ckpt.has(key + kStateNf4) || ckpt.has(key + kStateFp4);
}

std::vector<std::string> bnb_field_keys(const safetensors::Checkpoint& ckpt, const std::string& key) {
  std::vector<std::string> out;
  for (const char* s : {"", ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", kStateNf4, kStateFp4})
    if (ckpt.has(key + s)) out.push_back(key + s);
  return out;
}

BnbQuantState read_bnb_quant_state(const safetensors::Checkpoint& ckpt, const std::string& key) {
  if (ckpt.has(key + kStateFp4))
    throw UsageError(str(ckpt.file_of(key + kStateFp4), ": tensor '", key, kStateFp4,
                         "': the weight is packed in bitsandbytes fp4, which is not supported (only nf4)"));
  const std::string name = key + kStateNf4;
  const std::string where = str(ckpt.file_of(name), ": tensor '", name, "'");
  const auto& info = ckpt.info(name);
  if (info.scalar_type != at::kByte || info.shape.size() != 1)
    throw UsageError(str(where, " must be a 1-dim U8 tensor (UTF-8 JSON), got ", info.dtype, " ", shape_str(info.shape)));
  at::Tensor bytes = ckpt.get(name).contiguous();
  const std::string_view text(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(bytes.numel()));
  return parse_bnb_quant_state(text, where);
}

BnbQuantState check_bnb_weight(const safetensors::Checkpoint& ckpt, const std::string& key, const std::vector<int64_t>& shape) {
  const BnbQuantState s = read_bnb_quant_state(ckpt, key);
  const std::string state = key + kStateNf4;
  if (s.shape != shape)
    throw UsageError(str(ckpt.file_of(state), ": tensor '", state, "' gives the weight shape ", shape_str(s.shape),
                         " but the model config implies ", shape_str(shape)));
  ckpt.info(key);  // the packed codes themselves: missing names the tensor
  return s;
}

ops::WeightTensor read_bnb_nf4(const safetensors::Checkpoint& ckpt, const std::string& key,
                               const std::vector<int64_t>& shape, at::Tensor& nested_code) {
  const BnbQuantState s = check_bnb_weight(ckpt, key, shape);
  const Fields f{ckpt, key};
  const int64_t n = s.numel(), nblocks = n / s.blocksize;  // parse_bnb_quant_state: n % blocksize == 0
  ops::WeightTensor w;
  w.format = ops::WeightFormat::nf4;
  w.shape = s.shape;
  w.blocksize = s.blocksize;
  w.codes = f.get("", at::kByte, n / 2);  // [n/2, 1] as bitsandbytes stores it; the even element in the high nibble
  // Dequantisation looks codes up in quant_map: anything but the NF4 table (fp4's, a custom map) would make
  // our nf4 kernels compute other values than bitsandbytes does.
  at::Tensor qmap = f.get(".quant_map", at::kFloat, 16);
  if (!at::equal(qmap, nf4_table()))
    throw UsageError(str(f.where(key + ".quant_map"), " is not the NF4 table (bitsandbytes get_4bit_type(\"nf4\")): "
                         "fp4 or a custom code map is not supported"));
  if (!s.nested) {
    w.scales = f.get(".absmax", at::kFloat, nblocks);
    return w;
  }
  w.scales = f.get(".absmax", at::kByte, nblocks);
  w.nested_blocksize = s.nested_blocksize;
  w.nested_scales = f.get(".nested_absmax", at::kFloat, (nblocks + s.nested_blocksize - 1) / s.nested_blocksize);
  w.nested_offset = s.nested_offset;
  at::Tensor code = f.get(".nested_quant_map", at::kFloat, 256);
  if (!nested_code.defined()) {
    const at::Tensor want = ops::bnb_dynamic_map();
    if (!at::equal(code, want))
      throw UsageError(str(f.where(key + ".nested_quant_map"),
                           " is not bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(signed=True))"));
    nested_code = want;
  } else if (!at::equal(code, nested_code)) {
    throw UsageError(str(f.where(key + ".nested_quant_map"),
                         " is not bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(signed=True))"));
  }
  w.nested_code = nested_code;
  ops::validate_weight(w, str(ckpt.file_of(key), ": packed weight '", key, "'"));
  return w;
}

ops::WeightTensor concat_nf4(const std::vector<ops::WeightTensor>& parts, const std::vector<int64_t>& shape,
                             const std::string& what) {
  if (parts.empty()) throw RuntimeError(str(what, ": no parts to concatenate"));
  ops::WeightTensor out;
  out.format = ops::WeightFormat::nf4;
  out.shape = shape;
  out.blocksize = parts.front().blocksize;
  std::vector<at::Tensor> codes, absmax;
  for (const auto& p : parts) {
    if (p.blocksize != out.blocksize)
      throw UsageError(str(what, ": the experts' packed weights have different blocksizes (", out.blocksize, " and ",
                           p.blocksize, ")"));
    codes.push_back(p.codes.reshape(-1));
    if (!p.double_quant()) {
      absmax.push_back(p.scales.reshape(-1));
      continue;
    }
    // dequantize()'s absmax step: code[q] · nested_absmax[b / nested_blocksize] + offset, in fp32.
    const int64_t nb = p.scales.numel();
    at::Tensor idx = at::arange(nb, at::kLong).div(p.nested_blocksize, "floor");
    absmax.push_back(p.nested_code.index({p.scales.reshape(-1).to(at::kLong)}) * p.nested_scales.index({idx}) +
                     p.nested_offset);
  }
  out.codes = at::cat(codes);
  out.scales = at::cat(absmax);
  ops::validate_weight(out, what);
  return out;
}

}  // namespace ax::models

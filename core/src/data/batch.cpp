// Batch::to (one move of a whole batch, extras included, from pinned host memory) and the default
// collation of a dataset type's extras (per-token tensors laid out like the batch's tokens).
#include <algorithm>

#include <ATen/ATen.h>

#include "axengine/dataset.hpp"
#include "axengine/error.hpp"
#include "axengine/model.hpp"
#include "axengine/strings.hpp"

namespace ax {

// Pinned source memory makes a non_blocking copy truly asynchronous (from pageable memory the driver
// stages it while the host waits); the caching host allocator keeps the block until the copy is done.
at::Tensor to_device_async(const at::Tensor& t, const at::Device& device) {
  if (!t.defined() || t.device() == device) return t;
  if (t.is_cpu() && device.is_cuda()) return t.pin_memory().to(device, /*non_blocking=*/true);
  return t.to(device, /*non_blocking=*/true);
}

Batch Batch::to(const at::Device& device) const {
  Batch b = *this;
  if (!b.cu_seqlens_host.defined() && b.cu_seqlens.defined() && b.cu_seqlens.is_cpu()) b.cu_seqlens_host = b.cu_seqlens;
  if (b.max_token_id < b.min_token_id && b.input_ids.defined() && b.input_ids.is_cpu() && b.input_ids.numel() > 0) {
    b.min_token_id = b.input_ids.min().item<int64_t>();  // host tensors: no device involved
    b.max_token_id = b.input_ids.max().item<int64_t>();
  }
  if (!b.input_ids_host.defined() && b.input_ids.defined() && b.input_ids.is_cpu()) b.input_ids_host = b.input_ids;
  for (const auto& [name, t] : b.extras)
    if (t.defined() && t.is_cpu() && !at::isFloatingType(t.scalar_type()) && !b.extras_host.count(name)) b.extras_host[name] = t;
  b.input_ids = to_device_async(b.input_ids, device);
  b.labels = to_device_async(b.labels, device);
  b.position_ids = to_device_async(b.position_ids, device);
  b.cu_seqlens = to_device_async(b.cu_seqlens, device);
  for (auto& [name, t] : b.extras) t = to_device_async(t, device);
  return b;
}

std::map<std::string, at::Tensor> DatasetType::collate(const BatchLayout& layout) const {
  return collate_per_token_extras(layout);
}

std::map<std::string, at::Tensor> collate_per_token_extras(const BatchLayout& layout, const std::vector<std::string>& names) {
  std::map<std::string, at::Tensor> out;
  for (const SamplePlacement& p : layout.samples)
    for (const auto& [name, t] : p.sample->extras) {
      if (!names.empty() && std::find(names.begin(), names.end(), name) == names.end()) continue;
      const int64_t n = static_cast<int64_t>(p.sample->input_ids.size());
      if (t.dim() < 1 || t.size(0) != n)
        throw UsageError(ax::str("extra '", name, "' of a sample with ", n, " tokens has shape ", t.sizes(),
                                 ": the default collation takes per-token extras (dim 0 = tokens) only; its dataset type must override collate()"));
      at::Tensor& dst = out[name];
      if (!dst.defined()) {
        std::vector<int64_t> shape{layout.rows, layout.sequence_len};
        for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
        dst = at::zeros(shape, t.options());
      }
      dst[p.row].narrow(0, p.offset, p.length).copy_(t.narrow(0, 0, p.length));
    }
  return out;
}

}  // namespace ax

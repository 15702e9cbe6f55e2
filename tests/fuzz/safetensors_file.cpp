// A .safetensors file (8-byte header length, JSON header, data), as every model, adapter and checkpoint load
// opens it: File::open validates the header, then every tensor is read out.
#include <cstdlib>

#include <ATen/ATen.h>

#include "axengine/safetensors.hpp"
#include "harness.hpp"

AX_FUZZ_HARNESS(safetensors_file) {
  const std::string path = ax::fuzz::scratch() + "/model.safetensors";
  ax::fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  auto f = ax::safetensors::File::open(path);
  for (const auto& t : f->tensors()) {
    at::Tensor x = f->get(t.name);
    if (static_cast<uint64_t>(x.nbytes()) != t.end - t.begin) std::abort();  // the header's span is what is copied
  }
  for (const auto& [k, v] : f->metadata()) (void)f->find(k);
}

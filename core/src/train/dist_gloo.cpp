// ProcessGroupGloo from the wheel's libtorch_cpu; its header is read with the declarations of
// dist_gloo_shim/ (the wheel carries no Gloo headers; README.md there says why that is enough).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "train/dist_backend.hpp"

namespace ax::train {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                                    std::chrono::milliseconds timeout) {
  // create_default: the interfaces of GLOO_SOCKET_IFNAME when set, else this host's name (loopback when it
  // does not resolve) -- what torch.distributed does for backend="gloo".
  auto options = c10d::ProcessGroupGloo::Options::create_default(timeout);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
}

}  // namespace ax::train

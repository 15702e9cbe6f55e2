// ProcessGroupNCCL from the wheel's libtorch_cuda. core/CMakeLists.txt defines AXENGINE_DIST_NCCL (and gives
// this file the CUDA and NCCL include directories) where the CUDA toolkit and the wheel's nccl.h were found;
// elsewhere backend "nccl" is refused by name.
#include "train/dist_backend.hpp"

#if AXENGINE_DIST_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <c10/cuda/CUDAFunctions.h>
#else
#include "axengine/error.hpp"
#endif

namespace ax::train {

#if AXENGINE_DIST_NCCL
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                                    std::chrono::milliseconds timeout, int device_index) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));  // NCCL binds its communicator to it
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, options);
}
#else
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds, int) {
  throw RuntimeError("[distributed] backend nccl: this axengine was built without NCCL (no CUDA toolkit or nccl.h at configure "
                     "time); use backend = \"gloo\"");
}
#endif

}  // namespace ax::train

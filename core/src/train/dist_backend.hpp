// The c10d backends behind DistGroup, one translation unit each (dist_gloo.cpp, dist_nccl.cpp /
// dist_nccl_none.cpp): each needs its own macros and include directories to see its c10d header.
#pragma once
#include <chrono>
#include <cstdint>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace ax::train {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                                    std::chrono::milliseconds timeout);
// Throws RuntimeError where this build has no NCCL (no CUDA toolkit or no nccl.h at configure time).
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                                    std::chrono::milliseconds timeout, int device_index);

}  // namespace ax::train

#include "axengine/tuning.hpp"

#include <atomic>

namespace ax {

namespace {
std::atomic<bool> g_kernel_tuning{false};  // read at kernel launches on any thread
}

void request_kernel_tuning(bool on) { g_kernel_tuning.store(on, std::memory_order_relaxed); }
bool kernel_tuning_requested() { return g_kernel_tuning.load(std::memory_order_relaxed); }

}  // namespace ax

// Process-wide tuning requests that reach every plugin: one plugin (compile: [compile] autotune_kernels) asks,
// the kernels that tune themselves (scattermoe's tile tuner) read it at launch, alongside their own options.
// A plugin's own option stays authoritative for turning tuning on; the request only adds to it.
#pragma once

namespace ax {

void request_kernel_tuning(bool on);
bool kernel_tuning_requested();

}  // namespace ax

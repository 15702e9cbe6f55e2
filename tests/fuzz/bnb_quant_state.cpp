// The JSON a bitsandbytes 4-bit checkpoint stores per packed weight ("<weight>.quant_state.bitsandbytes__nf4", a
// uint8 tensor), parsed as the model load parses it (parse_bnb_quant_state). What it accepts must describe a weight
// the nf4 format can hold: a blocksize the format allows that divides a positive element count, and for double
// quantisation a positive nested blocksize and a finite offset.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "harness.hpp"
#include "models/bnb_config.hpp"

AX_FUZZ_HARNESS(bnb_quant_state) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto s = ax::models::parse_bnb_quant_state(text, "model.safetensors: tensor 'w.quant_state.bitsandbytes__nf4'");
  const int64_t n = s.numel();
  const bool ok = s.quant_type == "nf4" && s.blocksize >= 16 && s.blocksize <= 4096 && (s.blocksize & (s.blocksize - 1)) == 0 &&
                  n > 0 && n % s.blocksize == 0 && (!s.nested || (s.nested_blocksize > 0 && std::isfinite(s.nested_offset)));
  if (!ok) {
    std::fprintf(stderr, "bnb_quant_state: accepted a quant state the nf4 format cannot hold\n");
    std::abort();
  }
}

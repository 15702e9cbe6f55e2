#include "conformance/harness.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "axengine/ops/fp8.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/strings.hpp"

namespace ax::conformance::detail {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

}  // namespace


bool Target::claims_dtype(const std::string& d) const { return contains(dtypes, d); }
bool Target::claims_format(const std::string& f) const { return contains(formats, f); }
bool Target::claims_layout(const std::string& l) const { return contains(layouts, l); }

CaseRunner::CaseRunner(const Target& target, std::string device_name, std::vector<CaseResult>& out,
                       const std::function<void(const CaseResult&)>& on_case,
                       const std::function<void(const std::string&)>& on_start)
    : target_(target), device_name_(std::move(device_name)), out_(out), on_case_(on_case), on_start_(on_start) {}

void CaseRunner::record(CaseResult r) {
  r.op = target_.backend->info.op;
  r.backend = target_.backend->info.name;
  r.plugin = target_.backend->info.plugin;
  r.device = device_name_;
  out_.push_back(r);
  if (on_case_) on_case_(out_.back());
}

void CaseRunner::run(const std::string& name, const std::function<std::string()>& body) {
  CaseResult r;
  r.name = name;
  if (on_start_) on_start_(ax::str(target_.backend->info.op, " / ", target_.backend->info.name, " on ", device_name_, ": ", name));
  auto t0 = std::chrono::steady_clock::now();
  try {
    r.message = body();
    r.status = Status::pass;
  } catch (const CaseSkip& e) {
    r.status = Status::skip;
    r.message = e.what();
  } catch (const CaseFailure& e) {
    r.status = Status::fail;
    r.message = e.what();
  } catch (const c10::Error& e) {
    r.status = Status::fail;
    r.message = ax::str("threw on valid input: ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    // The backend (or the reference) threw on valid input.
    r.status = Status::fail;
    r.message = ax::str("threw on valid input: ", e.what());
  } catch (...) {
    r.status = Status::fail;
    r.message = "threw a non-std::exception on valid input";
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  record(std::move(r));
}

void CaseRunner::skip_case(const std::string& name, const std::string& reason) {
  CaseResult r;
  r.name = name;
  r.status = Status::skip;
  r.message = reason;
  record(std::move(r));
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    default: return c10::toString(t);
  }
}

double rel_error(const at::Tensor& got, const at::Tensor& want) {
  at::Tensor g = got.detach().to(at::kCPU, at::kDouble);
  at::Tensor w = want.detach().to(at::kCPU, at::kDouble);
  if (!at::isfinite(g).all().item<bool>()) return std::nan("");
  double num = (g - w).norm().item<double>();
  double den = w.norm().item<double>();
  // An all-zero reference (e.g. a gradient no entry reaches): the result must be exactly zero too.
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return num / den;
}

std::string check_close(const std::string& what, const at::Tensor& got, const at::Tensor& want, double tol,
                        double zero_scale) {
  if (got.defined() && got.sizes() == want.sizes() && zero_scale > 0 &&
      want.detach().to(at::kCPU, at::kDouble).norm().item<double>() < tol * zero_scale) {
    double diff = (got.detach().to(at::kCPU, at::kDouble) - want.detach().to(at::kCPU, at::kDouble)).norm().item<double>();
    if (!(diff <= tol * zero_scale))
      fail(ax::str(what, ": the reference vanishes by cancellation; |output - reference| ", diff, " > ", tol, " x ", zero_scale));
    return ax::str(what, " |output - reference| ", diff, " (reference vanishes by cancellation)");
  }
  return check_close(what, got, want, tol);
}

std::string check_throws_naming(const std::string& argument, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (auto* c10e = dynamic_cast<const c10::Error*>(&e)) msg = c10e->what_without_backtrace();
    if (msg.find(argument) == std::string::npos)
      fail(ax::str("threw, but the message does not name '", argument, "': ", msg.substr(0, 300)));
    return ax::str("threw naming '", argument, "'");
  } catch (...) {
    fail("threw something that is not a std::exception");
  }
  fail(ax::str("accepted the bad input (expected an exception naming '", argument, "')"));
}

at::Tensor bytes_of(const at::Tensor& t) {
  // A fresh buffer: contiguous() keeps odd strides on size-1 dims, which view(kByte) refuses.
  at::Tensor flat = at::empty({t.numel()}, t.options().device(at::kCPU));
  flat.copy_(t.detach().reshape(-1));
  return flat.view(at::kByte);
}

void InputGuard::add(const std::string& name, const at::Tensor& t) {
  if (t.defined()) saved_.push_back({name, {t, t.detach().clone()}});
}

std::string InputGuard::check() const {
  for (const auto& [name, pair] : saved_) {
    const auto& [live, copy] = pair;
    if (!at::equal(bytes_of(live), bytes_of(copy))) fail(ax::str("the call modified its input '", name, "'"));
  }
  return ax::str(saved_.size(), " inputs unchanged");
}

GuardedOut::GuardedOut(at::IntArrayRef shape, at::ScalarType dtype, at::Device device, int64_t guard) {
  // Pad every dim by `guard` on both sides: the view is then non-contiguous and surrounded on all sides.
  std::vector<int64_t> padded;
  for (auto s : shape) padded.push_back(s + 2 * guard);
  buffer_ = at::empty(padded, at::TensorOptions().dtype(dtype).device(device));
  // A byte pattern that is a NaN/huge value in every float dtype, so reading it back shows up too.
  buffer_.view(at::kByte).fill_(0x7F);
  pristine_ = buffer_.clone();
  mask_ = at::zeros(padded, at::TensorOptions().dtype(at::kBool).device(device));
  view_ = buffer_;
  at::Tensor m = mask_;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    view_ = view_.narrow(d, guard, shape[d]);
    m = m.narrow(d, guard, shape[d]);
  }
  m.fill_(true);
}

std::string GuardedOut::check(const std::string& what, const at::Tensor& returned) const {
  at::Tensor now = buffer_.view(at::kByte).to(at::kCPU), before = pristine_.view(at::kByte).to(at::kCPU);
  // view(kByte) multiplies the last dim by the element size: widen the element mask the same way.
  at::Tensor mask = mask_.to(at::kCPU);
  int64_t esize = static_cast<int64_t>(c10::elementSize(buffer_.scalar_type()));
  at::Tensor byte_mask = mask.repeat_interleave(esize, -1);
  at::Tensor changed = (now != before).logical_and(byte_mask.logical_not());
  if (changed.any().item<bool>())
    fail(ax::str(what, ": the backend wrote outside the preallocated output (",
             changed.sum().item<long>() / esize, "+ guard-band elements changed)"));
  if (!returned.defined()) fail(ax::str(what, ": returned an undefined tensor although `out` was given"));
  if (returned.data_ptr() != view_.data_ptr() || returned.strides() != view_.strides())
    fail(ax::str(what, ": did not return the preallocated `out` it was given"));
  return ax::str(what, " guard bands intact");
}

std::string base_format(const std::string& v) { return v.substr(0, v.find('-')); }


ops::WeightTensor make_weight(const at::Tensor& w32, const std::string& v, int64_t axis, at::ScalarType dtype) {
  if (v == "dense") return ops::WeightTensor::dense(w32.to(dtype));
  if (v == "nf4") return ops::quantize_nf4(w32, 64, false);
  if (v == "nf4-dq") return ops::quantize_nf4(w32, 64, true);
  // Other blocksizes (bitsandbytes allows powers of two 16..4096): a kernel that assumes 64 fails these.
  if (v == "nf4-b16") return ops::quantize_nf4(w32, 16, false);
  if (v == "nf4-dq-b32") return ops::quantize_nf4(w32, 32, true);
  if (v == "mxfp4") return ops::quantize_mxfp4(w32, axis);
  if (v == "nvfp4") return ops::quantize_nvfp4(w32, axis, false);
  if (v == "nvfp4-pe") return ops::quantize_nvfp4(w32, axis, true);
  if (v == "fp8") return ops::quantize_fp8_blocks(w32, 128, 128);    // the releases' blocks
  if (v == "fp8-b8x16") return ops::quantize_fp8_blocks(w32, 8, 16);  // many blocks per weight, ragged edges
  throw std::invalid_argument(ax::str("conformance: unknown weight variant '", v, "'"));
}

ops::WeightTensor weight_to(const ops::WeightTensor& w, at::Device device) {
  ops::WeightTensor o = w;
  auto mv = [&](at::Tensor& t) {
    if (t.defined()) t = t.to(device);
  };
  mv(o.values);
  mv(o.codes);
  mv(o.scales);
  mv(o.nested_scales);
  mv(o.nested_code);
  mv(o.global_scale);
  return o;
}

std::size_t cuda_free_bytes(int index) {
  // Through the CUDA runtime LibTorch loaded, as device.cpp does: no CUDA headers in core.
  using SetFn = int (*)(int);
  using InfoFn = int (*)(std::size_t*, std::size_t*);
  auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "cudaSetDevice"));
  auto info = reinterpret_cast<InfoFn>(dlsym(RTLD_DEFAULT, "cudaMemGetInfo"));
  if (!set || !info || set(index) != 0) return 0;
  std::size_t free_b = 0, total = 0;
  if (info(&free_b, &total) != 0) return 0;
  return free_b;
}

}  // namespace ax::conformance::detail

namespace ax::conformance {

using detail::CaseFailure;
using detail::CaseSkip;
using detail::dtype_name;
using detail::rel_error;

namespace {
std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}
}  // namespace

void fail(const std::string& message) { throw CaseFailure(message); }
void skip(const std::string& reason) { throw CaseSkip(reason); }

at::ScalarType scalar_type(const std::string& d) {
  if (d == "fp32") return at::kFloat;
  if (d == "bf16") return at::kBFloat16;
  if (d == "fp16") return at::kHalf;
  throw std::invalid_argument(ax::str("conformance: unknown dtype '", d, "'"));
}

std::string check_close(const std::string& what, const at::Tensor& got, const at::Tensor& want, double tol) {
  if (!got.defined()) fail(ax::str(what, ": backend returned an undefined tensor"));
  if (got.sizes() != want.sizes())
    fail(ax::str(what, ": shape ", got.sizes(), ", reference has ", want.sizes()));
  if (got.scalar_type() != want.scalar_type())
    fail(ax::str(what, ": dtype ", dtype_name(got.scalar_type()), ", reference has ", dtype_name(want.scalar_type())));
  double err = rel_error(got, want);
  if (std::isnan(err)) fail(ax::str(what, ": output holds NaN or Inf (reference is finite)"));
  if (std::isinf(err)) fail(ax::str(what, ": the reference is exactly zero, the output is not"));
  if (err > tol) fail(ax::str(what, ": norm-relative error ", sci(err), " > tolerance ", sci(tol)));
  return ax::str(what, " err=", sci(err), " tol=", sci(tol));
}

std::string check_bitwise(const std::string& what, const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type())
    fail(ax::str(what, ": second run has shape/dtype ", b.sizes(), "/", dtype_name(b.scalar_type()), ", first ", a.sizes(),
             "/", dtype_name(a.scalar_type())));
  // Compare the bytes, not the values: NaN != NaN and -0 == +0 would hide differences.
  at::Tensor ab = detail::bytes_of(a), bb = detail::bytes_of(b);
  if (!at::equal(ab, bb)) {
    long differing = (a.detach().to(at::kCPU, at::kDouble) != b.detach().to(at::kCPU, at::kDouble)).sum().item<long>();
    fail(ax::str(what, ": two identical calls differ bitwise (", differing, " of ", a.numel(), " elements)"));
  }
  return ax::str(what, " bitwise equal");
}

at::Tensor non_contiguous(const at::Tensor& t) {
  if (t.dim() == 0) return t;
  auto sizes = t.sizes().vec();
  sizes.back() *= 2;
  at::Tensor buf = at::empty(sizes, t.options());
  if (at::isFloatingType(t.scalar_type())) buf.fill_(std::nan(""));
  else buf.fill_(0x5A);
  at::Tensor view = buf.slice(-1, 0, sizes.back(), 2);
  view.copy_(t);
  return view;
}

at::Generator case_generator(unsigned seed, const std::string& name) {
  // FNV-1a over the case name: the same case draws the same data whatever else runs.
  std::uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return at::make_generator<at::CPUGeneratorImpl>(h);
}

std::string kv(const std::vector<std::pair<std::string, long>>& items) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : items) parts.push_back(ax::str(k, "=", v));
  return join(parts, ",");
}

at::Tensor output(const Tensors& outputs, const std::string& name) {
  for (const auto& [n, t] : outputs)
    if (n == name) return t;
  return {};
}

}  // namespace ax::conformance

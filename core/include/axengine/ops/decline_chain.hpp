// A run-time fallback chain over the backends of one op (docs/ops/attention.md "Declining",
// docs/ops/moe.mlp.md "Run-time decline"): forward and backward go to the first backend whose decline(args)
// is nullopt. decline() is a pure function of the
// arguments (shapes, dtypes, formats, flags — never tensor values), so backward reaches the backend
// forward did. Each distinct hand-over is logged once ("<op>: <a> declined a call (<why>); <b> serves
// it"); when every backend declines, the call fails naming every reason.
//
// Op is an op interface with forward(Args) -> Result, backward(Args, BackwardArgs) -> Grads, a virtual
// decline(Args) and an Args::check_values flag (the chain validates once; the chosen backend re-checks
// shapes only).
#pragma once
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"

namespace ax::ops {

// Named is the op's {name, backend} pair (NamedAttention, NamedMoeMlp).
template <class Op, class Named, class Args, class Result, class BackwardArgs, class Grads>
class DeclineChain final : public Op {
 public:
  explicit DeclineChain(std::vector<Named> backends) : bs_(std::move(backends)) {
    if (bs_.empty()) throw UsageError(str(Op::kOp, ": a fallback chain needs at least one backend"));
  }

  std::optional<std::string> decline(const Args& a) const override {
    std::vector<std::string> why;
    for (const auto& b : bs_) {
      auto r = b.backend->decline(a);
      if (!r) return std::nullopt;
      why.push_back(b.name + ": " + *r);
    }
    return join(why, "; ");
  }

 protected:
  Result run_forward(const Args& a) override { return pick(a).forward(unchecked(a)); }
  Grads run_backward(const Args& a, const BackwardArgs& b) override { return pick(a).backward(unchecked(a), b); }

 private:
  static Args unchecked(Args a) {
    a.check_values = false;
    return a;
  }

  Op& pick(const Args& a) {
    std::vector<std::string> why;
    for (const auto& b : bs_) {
      auto r = b.backend->decline(a);
      if (!r) {
        if (!why.empty()) {
          const std::string msg = str(Op::kOp, ": ", join(why, "; "), "; ", b.name, " serves it");
          std::lock_guard<std::mutex> lock(mu_);
          if (logged_.insert(msg).second) log::info(msg);  // once per distinct fallback
        }
        return *b.backend;
      }
      why.push_back(str(b.name, " declined a call (", *r, ")"));
    }
    throw UsageError(str(Op::kOp, ": every backend declined this call: ", join(why, "; ")));
  }

  std::vector<Named> bs_;
  std::mutex mu_;
  std::set<std::string> logged_;
};

}  // namespace ax::ops

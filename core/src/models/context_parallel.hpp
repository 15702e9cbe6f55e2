// Context parallelism ([distributed] context_parallel = N, docs/distributed.md "Context parallelism"): the ranks
// of one CP group train the same micro-batch, each holding 1/N of every packed row's tokens through the decoder
// layers (embeddings, projections, norms, MLP / MoE, LM head and loss), so activations shrink N-fold. The row is
// cut in 2N chunks and rank r holds chunks r and 2N-1-r (the zig-zag split: under the causal mask every rank then
// has the same attention work). Attention runs as a ring (models/ring_attention.hpp): K/V blocks travel from
// rank to rank, each rank attends its own queries only. The trainer implements the collectives over a c10d sub
// group (train/dist_context.cpp); a model sees only this.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ax::models {

class ContextComm {
 public:
  virtual ~ContextComm() = default;
  virtual int64_t rank() const = 0;  // position in the CP group: rows' chunks rank and 2·size-1-rank
  virtual int64_t size() const = 0;
  // Every rank's `in` (one shape on all ranks) concatenated along dim 0 in rank order.
  virtual at::Tensor all_gather(const at::Tensor& in) = 0;
  // Sum over the group, in place.
  virtual void all_reduce_sum(at::Tensor& t) = 0;
  // One step of the ring: `in` (contiguous, one shape on all ranks) goes to rank + 1, and what rank - 1 sent
  // (mod size) comes back.
  virtual at::Tensor ring_pass(const at::Tensor& in) = 0;
  // The same step started: the returned function waits for it and gives what rank - 1 sent, so a ring can
  // compute on the block it holds while the next one travels. `in` must not change before the wait. By default
  // the blocking ring_pass (no overlap).
  virtual std::function<at::Tensor()> ring_pass_start(const at::Tensor& in) {
    at::Tensor got = ring_pass(in);
    return [got] { return got; };
  }
};

// One forward's split: `rows` packed rows of `seq` tokens, flattened [rows·seq, ...] as the decoder holds them.
struct ContextSplit {
  ContextComm* comm = nullptr;
  int64_t rows = 0, seq = 0;
  // The whole batch's sample boundaries (cu_seqlens over rows·seq tokens) on the host, made once per step
  // (DecoderModel::forward, from the batch's host copy): the ring's block calls and the Gated DeltaNet chunks are
  // cut by it, so no layer reads the device's cu_seqlens back (a device sync per layer).
  std::shared_ptr<const std::vector<int64_t>> cu;
  // `cu`, checked to run from 0 to rows·seq; RuntimeError naming `who` when it is missing or does not.
  const std::vector<int64_t>& boundaries(const char* who) const;
  int64_t block() const;  // tokens of a row on each rank: seq / size
  int64_t chunk() const;  // tokens of a zig-zag chunk: seq / (2·size)
  // The row chunk (0 .. 2·size-1) that rank `r` holds as its j-th (0, 1): r, then 2·size-1-r.
  int64_t chunk_of(int64_t r, int64_t j) const;
  // This rank's tokens of a whole-batch tensor [rows·seq, ...]: [rows·block, ...], row by row, each row's two
  // chunks in order.
  at::Tensor local(const at::Tensor& full) const;
  // The inverse, across the group and differentiable: every rank's local rows [rows·block, ...] into the
  // whole batch [rows·seq, ...]; backward sums the whole-batch gradient over the group and keeps this rank's rows.
  at::Tensor gather(const at::Tensor& local) const;
};

// ContextSplit::cu from a CPU tensor (cu_seqlens' host copy); RuntimeError for a device one (reading it is the
// sync the table avoids).
std::shared_ptr<const std::vector<int64_t>> host_boundaries(const at::Tensor& cu_seqlens_host);

// The loss of a CP forward: its value is the sum over the group of `local` (each rank's share of the micro-batch's
// loss), its gradient that of `local` alone (the trainer's gradient reduction adds the shares up).
at::Tensor context_parallel_loss(ContextComm& comm, const at::Tensor& local);

}  // namespace ax::models

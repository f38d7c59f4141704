// Data parallelism over MPI: the process group of an mpirun job with its collectives over CPU
// tensors, and DataParallel, which keeps one model's replicas in step (bucketed gradient
// all-reduce overlapping backward, loss-scale agreement, ZeRO-1 sharded optimizer state). Built
// only where MPI is found (CMake's MIXPREC_MPI; MIXPREC_WITH_MPI is then defined for users of the
// library). Design and cluster use: docs/distributed.md.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixprec/grad_scaler.h"
#include "mixprec/nn.h"
#include "mixprec/optim.h"
#include "mixprec/tensor.h"

namespace mixprec::dist {

enum class ReduceOp { sum, avg, max };
// How reduced values travel: f32, or bf16 (half the bytes; each pairwise sum is computed in f32 by
// a custom MPI reduction and rounded to bf16, so the error is one bf16 rounding per hop).
enum class WireDType { f32, bf16 };
const char* wire_dtype_name(WireDType w);  // "f32", "bf16"

// The ranks of this job. A process started by mpirun (or srun, mpiexec: OMPI_COMM_WORLD_SIZE,
// PMI_SIZE or PMIX_RANK in the environment) initialises MPI on the first call of world(); any other
// process is a group of size 1 whose collectives change nothing, so the single-process path needs
// no MPI at all. Collectives take contiguous CPU tensors of the same shape and dtype on every rank
// and must be called in the same order by every rank (MPI's rule).
//
// Failure: no call waits forever. Every wait polls with a deadline (timeout_s(), from
// MIXPREC_DIST_TIMEOUT_S, default 300 s); past it, or on an MPI error, the rank prints one line
// ("mixprec: rank R of N: ...") and aborts the whole job (MPI_Abort: mpirun ends every rank). An
// exception that escapes main (std::terminate) does the same; a rank that dies is noticed by mpirun,
// which kills the others. A program that catches its own error and exits should call abort_job.
class ProcessGroup {
 public:
  static ProcessGroup& world();
  ~ProcessGroup();  // finalizes MPI if world() initialised it
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_distributed() const { return size_ > 1; }

  // In place on every rank: t := op over the ranks' t. f32 with any op and wire; f64 and i64 with
  // a f32 wire only (sent as themselves); avg divides the sum by size() (i64: truncates).
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::sum, WireDType wire = WireDType::f32);
  void broadcast(Tensor& t, int root = 0);  // t := root's t
  // Every rank's t stacked along a new first dimension: [size(), t.shape...], rank order.
  Tensor all_gather(const Tensor& t);
  void barrier();

  double timeout_s() const { return timeout_s_; }
  void set_timeout_s(double seconds);  // > 0
  // Prints "mixprec: rank R of N: why; aborting the job" and ends every rank (exit status 1).
  [[noreturn]] void abort_job(const std::string& why) const;

 private:
  ProcessGroup();
  int rank_ = 0;
  int size_ = 1;
  bool owns_mpi_ = false;  // world() called MPI_Init: the destructor finalizes
  double timeout_s_ = 300.0;
};

struct DataParallelOptions {
  WireDType reduce_dtype = WireDType::f32;
  // Gradients are reduced in buckets of about this many wire bytes (a parameter larger than it is a
  // bucket of its own), filled in the order backward produces them (parameters in reverse).
  // Smaller: more overlap with backward, more per-message latency. 1 MiB: DDP's first bucket.
  int64_t bucket_bytes = int64_t(1) << 20;
  // Launch each bucket's all-reduce from backward as soon as it is full (DDP). false: launch every
  // bucket after backward (to measure what the overlap hides).
  bool overlap = true;
  // ZeRO stage: 0 (every rank holds the whole optimizer state) or 1 (each rank holds the state of
  // 1/size of the parameters' elements, updates that part, and the parameters are all-gathered).
  int zero = 0;
  // After every step, rank 0's buffers (BatchNorm running statistics) are sent to every rank, so
  // eval and checkpoints agree (DDP's broadcast_buffers). Batch statistics stay per rank.
  bool broadcast_buffers = true;
};

// Counters over a DataParallel's life (for the overlap measurement, bench/dp_bench.cpp).
struct DataParallelStats {
  int64_t steps = 0;
  int64_t buckets_in_backward = 0;  // buckets launched from a backward hook
  int64_t buckets_after = 0;        // buckets launched by sync_gradients (not overlapped)
  double wait_s = 0;                // time sync_gradients spent waiting for all-reduces (exposed)
  double pack_s = 0;                // packing gradients into buckets and unpacking the averages
  double gather_s = 0;              // ZeRO-1's parameter all-gather
  int64_t wire_bytes = 0;           // bytes this rank put into gradient all-reduces
};

// One model replica per rank, kept identical: the constructor sends rank 0's parameters and buffers
// to every rank; each backward pass starts the all-reduce of each full bucket of gradients; step()
// waits for them, sets every gradient to the average over the ranks (sum / size), and updates. Use:
//   dist::DataParallel dp(model, opt);       // after building both, before the first forward
//   loss = loss_fn(model(x_shard), y_shard); // each rank its own disjoint part of the global batch
//   scaler.scale(loss).backward();           // buckets leave while backward goes on
//   dp.sync_gradients();                     // optional: to clip (norms are then global) or inspect
//   dp.step(scaler);                         // or dp.step() without a scaler; then scaler.update()
// With a GradScaler, every rank's inf/NaN flag is reduced with MAX (attach), so all ranks skip the
// same steps and keep the same scale. One reducing backward per step (micro-batches: set_grad_sync);
// a second one before the step is refused. Gradients of parameters no backward reached are reduced as zeros.
// Read the gradients after sync_gradients(), not between backward and it: a bucket that holds one
// f32 gradient is all-reduced in that gradient's own bytes (no packing copy), in flight until then.
class DataParallel {
 public:
  DataParallel(nn::Module& model, optim::Optimizer& opt, DataParallelOptions o = {},
               ProcessGroup& pg = ProcessGroup::world());
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Waits for every bucket (launching those backward did not fill), then writes the averages into
  // the gradients: identical on every rank, so a gradient norm taken now is the global one. Idempotent
  // until the next backward.
  void sync_gradients();
  void step();                         // sync_gradients, the optimizer's step (ZeRO-1: shard + gather)
  void step(amp::GradScaler& scaler);  // the same through scaler.step (after attach(scaler))
  // Makes scaler reduce its inf/NaN flags across the ranks with MAX (before it steps or skips).
  void attach(amp::GradScaler& scaler);
  // DDP's no_sync, for micro-batches: while off, backward passes only accumulate each rank's
  // gradients; turn it on before the last micro-batch's backward, which reduces the sums.
  void set_grad_sync(bool on);

  // The optimizer that steps: opt, or with ZeRO-1 this rank's shard optimizer (its state_dict is this
  // rank's shard only). ZeRO-1 copies the shard's gradients from the model's at step(), so clipping
  // the model's gradients between sync_gradients() and step() applies; scaler.unscale_ of the shard
  // optimizer does not (the step would unscale again): with a GradScaler, do not unscale_ under ZeRO-1.
  optim::Optimizer& optimizer();
  // The whole optimizer's state dict, as the unsharded optimizer would give it (what a checkpoint
  // holds, so it loads on any number of ranks): with ZeRO-1 the shards are gathered (a collective:
  // every rank calls it; each gets the whole). To resume with ZeRO-1, load it into the optimizer
  // before making the DataParallel: the constructor hands each rank its slice.
  StateDict optimizer_state_dict();
  const DataParallelStats& stats() const;
  ProcessGroup& group() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mixprec::dist

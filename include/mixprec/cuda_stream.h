// What runs on a GPU's stream, seen from the host: CUDA graphs, and timing with CUDA events.
//
// cuda::Graph: the work one thread queues on a GPU between capture_begin() and capture_end(), kept
// as a graph and run again by replay() with one launch (PyTorch's torch.cuda.CUDAGraph).
//
//   cuda::Graph g;
//   step();             // warm-up, eager: algorithm searches and the first allocations happen here
//   g.capture_begin();  // cuda:0's stream of this thread; nothing runs until a replay
//   step();
//   g.capture_end();
//   for (...) g.replay();
//
// What a replay does is what the capture queued, with the same memory: inputs change by copying new
// values into the tensors the captured step read, never by making new tensors. The step may not wait
// for the GPU (`.item()`, a host copy, a synchronize): capture_end() then throws, naming the first
// failed call, so a capture is also a test that a step never stops the GPU. Memory allocated during
// the capture comes from a pool of the graph's own (core/caching_allocator.h), so eager work after
// the capture never receives the blocks a replay writes; it goes back when the Graph is destroyed.
// A build without CUDA, or a machine without a GPU, throws mixprec::Error at capture_begin().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace mixprec::cuda {

class Graph {
 public:
  Graph();
  ~Graph();  // waits for its replays, then frees the graph and its pool's free memory
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void capture_begin(int device = 0);
  // Throws mixprec::Error when the capture failed (a call that waits for the GPU, say); the Graph
  // is then empty and may capture again.
  void capture_end();
  void replay();  // queued on the device's stream of this thread; returns at once
  bool captured() const;

  // The graph's nodes by kind: every kernel (cuBLASLt's and cuDNN's included), copy and memset one
  // eager run of the captured work launches.
  struct Nodes {
    int64_t kernels = 0, memcpys = 0, memsets = 0, other = 0;
    int64_t total() const { return kernels + memcpys + memsets + other; }
  };
  Nodes nodes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Calls fn() n times, each between two CUDA events on GPU `device`'s stream of this thread, waits
// once at the end, and returns the milliseconds of GPU time between each call's events: the time of
// the work each call queued, with no wait between calls (the way the PyTorch peer times steps).
// Throws mixprec::Error without a GPU.
std::vector<double> time_each(int device, int64_t n, const std::function<void()>& fn);

}  // namespace mixprec::cuda

// cuDNN's graph (backend) API for the convolution (cuda/conv.cpp): the graph a pass needs, its
// engines' execution plans built, filtered and cached per problem, and the fastest of them run
// (cudnn.benchmark's rule), with the spares that need less workspace. One handle per GPU, on
// current_stream; workspace from our allocator. docs/design.md (CUDA kernels: conv2d).
#pragma once
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "mixprec/dtype.h"

namespace mixprec::kernels::cuda::conv_plans {

cudnnDataType_t cudnn_type(DType t);  // throws for a dtype cuDNN's convolution does not take
uint32_t alignment(const void* p);    // the largest of 16, 8, 4, 2 bytes p is aligned to, or 1

enum class Pass { forward, backward_data, backward_filter };
// A graph to build: the pass, the geometry, the dtypes of the real tensors and whether the bias
// and ReLU are fused into it.
struct GraphKey {
  int device;
  Pass pass;
  int64_t n, c, h, w, oc, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups;
  int x_type, w_type, y_type, bias_type;  // bias_type -1: no bias in the graph
  bool relu, tf32;
  bool nhwc;           // channels-last: x, y and the weight (KRSC) NHWC-dense, the tensor cores' layout
  bool deterministic;  // use_deterministic_algorithms: deterministic engines only, the heuristics' first, untimed
  uint32_t align_x, align_w, align_y, align_b;
  auto tie() const {
    return std::tie(device, pass, n, c, h, w, oc, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups, x_type, w_type,
                    y_type, bias_type, relu, tf32, nhwc, deterministic, align_x, align_w, align_y, align_b);
  }
  bool operator<(const GraphKey& o) const { return tie() < o.tie(); }
};
// A graph's plans: the candidates timed on its first run, then the one kept.
struct Plan;
struct Candidates {
  std::mutex mu;                             // run_best: one thread times them
  std::vector<std::shared_ptr<Plan>> plans;  // in the heuristics' order; one once timed
  bool timed = false;
  bool deterministic = false;  // never timed: the first plan that runs is kept
  GraphKey key{};              // what the spares are built from
  // The engines past the timed ones (the rest of the heuristics' list and the fallback list),
  // least workspace first, built the first time no plan's workspace fits (run_a_spare).
  bool spares_built = false;
  std::vector<std::shared_ptr<Plan>> spares;
};

// The cached candidates of `k` (built on first use); no plan when cuDNN has no engine for it.
std::shared_ptr<Candidates> plans_for(const GraphKey& k);
// Runs the fastest of `c`'s plans on these pointers (in the graph's order: x, w, y, then the
// bias), timing them on the first run; OutOfMemory when no engine's workspace fits.
void run_best(Candidates& c, int index, const std::vector<void*>& ptrs);

}  // namespace mixprec::kernels::cuda::conv_plans

// DataParallel: rank 0's weights sent to every replica, gradients all-reduced in buckets launched
// from backward hooks (in bucket order on every rank, as MPI requires), averaged, then one
// optimizer step: the whole optimizer, or (ZeRO-1) this rank's shard of the flat parameter
// elements followed by an all-gather of the updated parameters.
#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>

#include "dist/comm.h"
#include "mixprec/autograd.h"
#include "mixprec/convert.h"
#include "mixprec/error.h"

namespace mixprec::dist {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Bucket {
  std::vector<size_t> params;    // indices into the optimizer's parameters
  std::vector<int64_t> offsets;  // each one's first element in `wire`
  int64_t numel = 0;
  Tensor wire;  // f32 or bf16 [numel]: packed gradients, then their sum
  // A bucket of one parameter whose gradient is a contiguous f32 CPU tensor, on an f32 wire: the
  // all-reduce runs in the gradient's own bytes (no packing copy), `wire` unused. Set per launch.
  Tensor direct;
  MPI_Request req = MPI_REQUEST_NULL;
  size_t ready = 0;  // parameters whose gradient this backward has delivered
};

// ZeRO-1: the part [start, start + numel) of parameter `param`'s elements this rank updates, held
// by `shard` (a leaf of its own, what the shard optimizer steps).
struct Piece {
  size_t param;
  int64_t start, numel;
  Tensor shard;
};

// The per-parameter state an optimizer's state dict may hold, in Optimizer::state_dict's order.
constexpr const char* kStateNames[] = {"master", "exp_avg", "exp_avg_sq", "momentum_buffer"};

}  // namespace

struct DataParallel::Impl {
  nn::Module& model;
  optim::Optimizer& opt;
  DataParallelOptions o;
  ProcessGroup& pg;
  std::vector<Tensor> params;  // opt.params()
  std::vector<size_t> bucket_of;
  std::vector<char> delivered;  // per parameter: its gradient arrived in this backward
  std::vector<Bucket> buckets;
  size_t next_launch = 0;  // buckets launch in index order on every rank
  std::vector<uint64_t> hooks;
  bool synced = false;    // sync_gradients has run since the last backward
  bool grad_sync = true;  // set_grad_sync
  DataParallelStats stats;
  // ZeRO-1
  std::vector<Piece> pieces;
  std::unique_ptr<optim::Optimizer> shard_opt;
  std::vector<int64_t> flat_offset;  // per parameter: its first element in the flat order
  std::vector<int> counts, displs;   // per rank: its elements of the flat order

  Impl(nn::Module& m, optim::Optimizer& op, DataParallelOptions opts, ProcessGroup& g)
      : model(m), opt(op), o(opts), pg(g), params(op.params()) {}

  void on_grad(size_t i);
  void launch(Bucket& b, bool from_backward);
  void pack(Bucket& b);  // the gradients into b.wire, in the wire's dtype
  void progress();
  void fill_shard_grads();
  void all_gather_params();
  void make_buckets();
  void make_shard();
  void sync();
  void average(Bucket& b);  // the landed sum into each parameter's gradient, divided by the world size
  void step(const std::function<void(optim::Optimizer&)>& update);
  StateDict slice_state(const StateDict& whole) const;
  StateDict consolidate();
  StateDict opt_groups_state() const;
};

void DataParallel::Impl::make_buckets() {
  const int64_t wire_size = o.reduce_dtype == WireDType::bf16 ? 2 : 4;
  bucket_of.assign(params.size(), 0);
  delivered.assign(params.size(), 0);
  // Reverse order: backward produces the last layers' gradients first.
  for (size_t k = params.size(); k-- > 0;) {
    const int64_t n = params[k].numel();
    if (buckets.empty() || (buckets.back().numel > 0 && (buckets.back().numel + n) * wire_size > o.bucket_bytes))
      buckets.emplace_back();
    Bucket& b = buckets.back();
    MIXPREC_CHECK(b.numel + n < (int64_t(1) << 31), "DataParallel: a bucket of ", b.numel + n,
                  " elements; one MPI message holds fewer than 2^31 (lower bucket_bytes)");
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += n;
    bucket_of[k] = buckets.size() - 1;
  }
  MemoryScope scope(MemCategory::gradients);  // DDP counts its buckets as gradient memory too
  for (Bucket& b : buckets)
    b.wire = Tensor::empty({b.numel}, o.reduce_dtype == WireDType::bf16 ? DType::bf16 : DType::f32);
}

void DataParallel::Impl::on_grad(size_t i) {
  synced = false;
  if (!grad_sync) return;  // a micro-batch: the gradient only accumulates here
  MIXPREC_CHECK(!delivered[i], "DataParallel: parameter ", i,
                " received a second gradient before step(): one backward per step (gradient accumulation "
                "over several backward passes: DataParallel::set_grad_sync(false) before all but the last)");
  delivered[i] = 1;
  Bucket& b = buckets[bucket_of[i]];
  ++b.ready;
  if (!o.overlap || pg.size() == 1) return;
  while (next_launch < buckets.size() && buckets[next_launch].ready == buckets[next_launch].params.size())
    launch(buckets[next_launch++], /*from_backward=*/true);
  progress();
}

void DataParallel::Impl::launch(Bucket& b, bool from_backward) {
  const auto t0 = Clock::now();
  const DType wire_t = b.wire.dtype();
  b.direct = Tensor();
  if (b.params.size() == 1 && wire_t == DType::f32) {
    const Tensor g = params[b.params[0]].grad();
    if (g.defined() && g.dtype() == DType::f32 && g.device().is_cpu() && g.is_contiguous()) b.direct = g;
  }
  if (!b.direct.defined()) pack(b);
  stats.pack_s += seconds_since(t0);
  const bool bf16 = wire_t == DType::bf16;
  void* buf = b.direct.defined() ? b.direct.data_ptr() : b.wire.data_ptr();
  detail::check(MPI_Iallreduce(MPI_IN_PLACE, buf, int(b.numel), bf16 ? MPI_UINT16_T : MPI_FLOAT,
                               bf16 ? detail::bf16_sum_op() : MPI_SUM, detail::comm(), &b.req),
                "DataParallel gradient all-reduce");
  stats.wire_bytes += b.numel * int64_t(dtype_size(wire_t));
  (from_backward ? stats.buckets_in_backward : stats.buckets_after) += 1;
}

void DataParallel::Impl::pack(Bucket& b) {
  const DType wire_t = b.wire.dtype();
  char* dst = static_cast<char*>(b.wire.data_ptr());
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& p = params[b.params[j]];
    char* at = dst + b.offsets[j] * int64_t(dtype_size(wire_t));
    Tensor g = p.grad();
    if (!g.defined()) {  // no backward reached it: it contributes zeros (and gets the average)
      std::fill_n(at, p.numel() * int64_t(dtype_size(wire_t)), char(0));
      continue;
    }
    MIXPREC_CHECK(g.device().is_cpu(), "DataParallel: gradients must be on the CPU (parameter ", b.params[j], ")");
    if (!g.is_contiguous()) g = g.clone();
    convert(g.data_ptr(), g.dtype(), at, wire_t, size_t(g.numel()));
  }
}

void DataParallel::Impl::progress() {
  // Open MPI moves a non-blocking collective on only inside MPI calls: a test per hook keeps the
  // launched buckets going while backward computes.
  std::vector<MPI_Request> reqs;
  for (size_t k = 0; k < next_launch; ++k)
    if (buckets[k].req != MPI_REQUEST_NULL) reqs.push_back(buckets[k].req);
  if (reqs.empty()) return;
  detail::test_all(reqs, "DataParallel gradient all-reduce");
  size_t r = 0;
  for (size_t k = 0; k < next_launch; ++k)
    if (buckets[k].req != MPI_REQUEST_NULL) buckets[k].req = reqs[r++];
}

void DataParallel::Impl::fill_shard_grads() {
  MemoryScope scope(MemCategory::gradients);
  for (Piece& pc : pieces) {
    Tensor g = params[pc.param].grad();
    if (!g.defined()) {
      pc.shard.set_grad(Tensor());
      continue;
    }
    Tensor sg = Tensor::empty({pc.numel}, g.dtype());
    const Tensor flat = g.contiguous();
    convert(static_cast<const char*>(flat.data_ptr()) + pc.start * int64_t(dtype_size(g.dtype())), g.dtype(),
            sg.data_ptr(), g.dtype(), size_t(pc.numel));
    pc.shard.set_grad(sg);
  }
}

void DataParallel::Impl::make_shard() {
  int64_t n = 0;
  for (const Tensor& p : params) {
    MIXPREC_CHECK(p.dtype() != DType::f64, "DataParallel: ZeRO-1 gathers parameters in f32; an f64 parameter");
    flat_offset.push_back(n);
    n += p.numel();
  }
  MIXPREC_CHECK(n >= pg.size() && n < (int64_t(1) << 31), "DataParallel: ZeRO-1 over ", n, " parameter elements and ",
                pg.size(), " ranks (needs at least one element per rank, fewer than 2^31)");
  for (int r = 0; r < pg.size(); ++r) {
    const int64_t lo = n * r / pg.size(), hi = n * (r + 1) / pg.size();
    displs.push_back(int(lo));
    counts.push_back(int(hi - lo));
  }
  const int64_t lo = displs[size_t(pg.rank())], hi = lo + counts[size_t(pg.rank())];
  // The shard's groups mirror opt's: each piece goes to its parameter's group, with that group's settings.
  std::vector<optim::ParamGroup> groups(opt.param_groups().size());
  for (size_t g = 0; g < groups.size(); ++g) groups[g].options = {opt.lr(g), opt.weight_decay(g)};
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t a = std::max(lo, flat_offset[i]), b = std::min(hi, flat_offset[i] + params[i].numel());
    if (a >= b) continue;
    Piece pc{i, a - flat_offset[i], b - a, {}};
    {
      // A copy of the slice: the optimizer wants leaves of their own. Counted as parameters (they are
      // 1/size of them), so the optimizer-state bytes are the shard's moments and masters alone.
      MemoryScope scope(MemCategory::parameters);
      const Tensor p = params[i].detach().contiguous();
      pc.shard = Tensor::empty({pc.numel}, p.dtype());
      convert(static_cast<const char*>(p.data_ptr()) + pc.start * int64_t(dtype_size(p.dtype())), p.dtype(),
              pc.shard.data_ptr(), p.dtype(), size_t(pc.numel));
      pc.shard.set_requires_grad(true);
    }
    groups[opt.group_of(i)].params.push_back(pc.shard);
    pieces.push_back(std::move(pc));
  }
  const StateDict whole = opt.state_dict();  // what opt holds (a loaded checkpoint's), before it goes
  opt.hand_over_to_shard();
  shard_opt = opt.make_like(std::move(groups));
  shard_opt->load_state_dict(slice_state(whole));
}

// The shard optimizer's state dict cut from the whole optimizer's (same step and group settings;
// each piece's state is its slice of its parameter's).
StateDict DataParallel::Impl::slice_state(const StateDict& whole) const {
  StateDict out;
  for (const auto& [key, t] : whole)
    if (key.rfind("state.", 0) != 0 && key.find(".params") == std::string::npos) out.emplace_back(key, t);
  for (size_t g = 0; g < shard_opt->param_groups().size(); ++g) {
    const std::vector<size_t>& ps = shard_opt->param_groups()[g].params;
    out.emplace_back("param_groups." + std::to_string(g) + ".params",
                     Tensor::from_vector(std::vector<int64_t>(ps.begin(), ps.end()), {int64_t(ps.size())}));
  }
  for (size_t j = 0; j < pieces.size(); ++j) {
    const Piece& pc = pieces[j];
    for (const char* name : kStateNames)
      if (const Tensor* t = find_state(whole, "state." + std::to_string(pc.param) + "." + name))
        out.emplace_back("state." + std::to_string(j) + "." + name,
                         t->reshape({-1}).slice(0, pc.start, pc.start + pc.numel).contiguous());
  }
  return out;
}

StateDict DataParallel::Impl::consolidate() {
  if (o.zero == 0) return opt.state_dict();
  const StateDict shard = shard_opt->state_dict();
  // Which kinds of state any rank holds (a rank's pieces may all be f32 parameters: no masters).
  Tensor present = Tensor::zeros({int64_t(std::size(kStateNames))});
  for (size_t j = 0; j < pieces.size(); ++j)
    for (size_t k = 0; k < std::size(kStateNames); ++k)
      if (find_state(shard, "state." + std::to_string(j) + "." + kStateNames[k])) present.data<float>()[k] = 1;
  pg.all_reduce(present, ReduceOp::max);
  StateDict out;
  out.emplace_back("step", *find_state(shard, "step"));
  for (const auto& [key, t] : opt_groups_state()) out.emplace_back(key, t);
  const int64_t n = displs.back() + counts.back();
  std::vector<Tensor> gathered(std::size(kStateNames));
  for (size_t k = 0; k < std::size(kStateNames); ++k) {
    if (present.data<float>()[k] == 0) continue;
    MemoryScope scope(MemCategory::optimizer_state);
    Tensor buf = Tensor::zeros({n});
    for (size_t j = 0; j < pieces.size(); ++j)
      if (const Tensor* t = find_state(shard, "state." + std::to_string(j) + "." + kStateNames[k]))
        std::copy_n(t->contiguous().data<float>(), pieces[j].numel,
                    buf.data<float>() + flat_offset[pieces[j].param] + pieces[j].start);
    if (pg.size() > 1) {
      MPI_Request req = MPI_REQUEST_NULL;
      detail::check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data<float>(), counts.data(), displs.data(),
                                    MPI_FLOAT, detail::comm(), &req),
                    "DataParallel ZeRO-1 state gather");
      detail::wait(req, "DataParallel ZeRO-1 state gather");
    }
    gathered[k] = buf;
  }
  for (size_t i = 0; i < params.size(); ++i)
    for (size_t k = 0; k < std::size(kStateNames); ++k) {
      if (!gathered[k].defined()) continue;
      // A master copy belongs to 16-bit parameters only (f32 ones have none: their rows are zeros).
      if (k == 0 && !(is_half(params[i].dtype()) && opt.half_options().master_weights)) continue;
      out.emplace_back(
          "state." + std::to_string(i) + "." + kStateNames[k],
          gathered[k].slice(0, flat_offset[i], flat_offset[i] + params[i].numel()).reshape(params[i].shape()).clone());
    }
  return out;
}

// opt's group entries ("param_groups.<g>.lr", "weight_decay", "params") as its state_dict has them.
StateDict DataParallel::Impl::opt_groups_state() const {
  StateDict out;
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    const optim::ParamGroupState& pgs = opt.param_groups()[g];
    out.emplace_back(prefix + "lr", Tensor::scalar(pgs.lr, DType::f64));
    out.emplace_back(prefix + "weight_decay", Tensor::scalar(pgs.weight_decay, DType::f64));
    out.emplace_back(prefix + "params", Tensor::from_vector(std::vector<int64_t>(pgs.params.begin(), pgs.params.end()),
                                                            {int64_t(pgs.params.size())}));
  }
  return out;
}

void DataParallel::Impl::all_gather_params() {
  const auto t0 = Clock::now();
  const int64_t n = displs.back() + counts.back();
  Tensor buf = [&] {
    MemoryScope scope(MemCategory::workspace);
    return Tensor::empty({n}, DType::f32);
  }();
  auto* f = buf.data<float>();
  for (const Piece& pc : pieces)
    convert(pc.shard.data_ptr(), pc.shard.dtype(), f + flat_offset[pc.param] + pc.start, DType::f32, size_t(pc.numel));
  if (pg.size() > 1) {
    MPI_Request req = MPI_REQUEST_NULL;
    detail::check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, f, counts.data(), displs.data(), MPI_FLOAT,
                                  detail::comm(), &req),
                  "DataParallel ZeRO-1 parameter all-gather");
    detail::wait(req, "DataParallel ZeRO-1 parameter all-gather");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor& p = params[i];
    convert(f + flat_offset[i], DType::f32, p.data_ptr(), p.dtype(), size_t(p.numel()));
    p.bump_version();  // written in place: caches keyed by the version (reordered weights) must see it
  }
  stats.gather_s += seconds_since(t0);
}

DataParallel::DataParallel(nn::Module& model, optim::Optimizer& opt, DataParallelOptions o, ProcessGroup& pg)
    : impl_(std::make_unique<Impl>(model, opt, o, pg)) {
  MIXPREC_CHECK(o.zero == 0 || o.zero == 1, "DataParallel: zero must be 0 or 1 (ZeRO stage), got ", o.zero);
  MIXPREC_CHECK(o.bucket_bytes > 0, "DataParallel: bucket_bytes must be > 0, got ", o.bucket_bytes);
  for (const Tensor& p : impl_->params)
    MIXPREC_CHECK(p.device().is_cpu(), "DataParallel: parameters must be on the CPU (MPI moves host memory)");
  // Rank 0's initial state everywhere: parameters, buffers, and the optimizer's master copies (made
  // from each rank's own initial parameters).
  for (Tensor p : model.parameters()) pg.broadcast(p);
  for (auto& [name, b] : model.named_buffers()) {
    Tensor t = b;
    pg.broadcast(t);
  }
  for (size_t i = 0; i < opt.params().size(); ++i)
    if (Tensor m = opt.master(i); m.defined()) pg.broadcast(m);
  impl_->make_buckets();
  if (o.zero == 1) impl_->make_shard();
  // Also alone (size 1): the hooks tell sync_gradients that a new backward has run.
  for (size_t i = 0; i < impl_->params.size(); ++i)
    impl_->hooks.push_back(autograd::register_post_accumulate_grad_hook(
        impl_->params[i], [impl = impl_.get(), i](const Tensor&) { impl->on_grad(i); }));
}

DataParallel::~DataParallel() {
  for (size_t i = 0; i < impl_->hooks.size(); ++i)
    autograd::remove_post_accumulate_grad_hook(impl_->params[i], impl_->hooks[i]);
  // MPI still writes into a bucket in flight (an exception between backward and step): let it land.
  std::vector<MPI_Request> reqs;
  for (Bucket& b : impl_->buckets)
    if (b.req != MPI_REQUEST_NULL) reqs.push_back(b.req);
  if (!reqs.empty()) detail::wait_all(reqs, "DataParallel gradient all-reduce (at destruction)");
}

void DataParallel::sync_gradients() {
  if (!impl_->synced) impl_->sync();
}

void DataParallel::Impl::sync() {
  if (pg.size() > 1) {
    while (next_launch < buckets.size()) launch(buckets[next_launch++], /*from_backward=*/false);
    // Each bucket is averaged as soon as its all-reduce lands, while the later ones are still on the
    // wire (the last bucket launched, the first layer's, is usually still in flight).
    const auto t0 = Clock::now();
    double averaging_s = 0;
    std::vector<MPI_Request> reqs;
    for (Bucket& b : buckets) reqs.push_back(b.req);
    // The buckets keep what is still in flight (null once done), also when an average throws (an
    // allocation under a memory budget): the destructor waits for those.
    auto hand_back = [&] {
      for (size_t k = 0; k < buckets.size(); ++k) buckets[k].req = reqs[k];
    };
    try {
      detail::wait_each(reqs, "DataParallel gradient all-reduce", [&](size_t k) {
        const auto t1 = Clock::now();
        average(buckets[k]);
        averaging_s += seconds_since(t1);
      });
    } catch (...) {
      hand_back();
      throw;
    }
    hand_back();
    stats.wait_s += seconds_since(t0) - averaging_s;
    stats.pack_s += averaging_s;
  }
  for (Bucket& b : buckets) b.ready = 0;
  next_launch = 0;
  std::fill(delivered.begin(), delivered.end(), 0);
  synced = true;
}

namespace {

// d = s / world, f32, as DDP's average. A power-of-two world multiplies by its reciprocal instead:
// the same correctly rounded quotient, bit for bit, without a division per element.
void divide(const float* s, float* d, int64_t n, int world) {
  if ((world & (world - 1)) == 0) {
    const float inv = 1.0f / float(world);
    for (int64_t e = 0; e < n; ++e) d[e] = s[e] * inv;
  } else {
    const float w = float(world);
    for (int64_t e = 0; e < n; ++e) d[e] = s[e] / w;
  }
}

}  // namespace

void DataParallel::Impl::average(Bucket& b) {
  // sum / size in f32, rounded once into the gradient's dtype. An f32 sum into an f32 gradient is
  // one pass; a bf16 sum is widened first, a 16-bit gradient written through a row of averages.
  // (Scratch through the allocator, as workspace: the memory budget sees it.)
  const float* sum = nullptr;
  Tensor wide;
  if (b.direct.defined()) {
    sum = b.direct.data<float>();  // the sum is in the gradient itself: averaged in place below
  } else if (b.wire.dtype() == DType::f32) {
    sum = b.wire.data<float>();
  } else {
    MemoryScope scope(MemCategory::workspace);
    wide = Tensor::empty({b.numel}, DType::f32);
    convert(b.wire.data_ptr(), b.wire.dtype(), wide.data_ptr(), DType::f32, size_t(b.numel));
    sum = wide.data<float>();
  }
  for (size_t j = 0; j < b.params.size(); ++j) {
    Tensor p = params[b.params[j]];
    Tensor g = p.grad();
    if (!g.defined() || !g.is_contiguous()) {
      MemoryScope scope(MemCategory::gradients);
      Tensor fresh = Tensor::empty(p.shape(), p.dtype());
      p.set_grad(fresh);
      g = fresh;
    }
    const float* s = sum + b.offsets[j];
    const int64_t n = g.numel();
    if (g.dtype() == DType::f32) {
      divide(s, g.data<float>(), n, pg.size());
    } else {
      MemoryScope scope(MemCategory::workspace);
      Tensor row = Tensor::empty({n}, DType::f32);
      divide(s, row.data<float>(), n, pg.size());
      convert(row.data_ptr(), DType::f32, g.data_ptr(), g.dtype(), size_t(n));
    }
    g.bump_version();
  }
  b.direct = Tensor();
}

void DataParallel::step() {
  impl_->step([](optim::Optimizer& o) { o.step(); });
}

void DataParallel::step(amp::GradScaler& scaler) {
  attach(scaler);
  impl_->step([&scaler](optim::Optimizer& o) { scaler.step(o); });
}

void DataParallel::Impl::step(const std::function<void(optim::Optimizer&)>& update) {
  if (!synced) sync();
  if (o.zero == 1) {
    fill_shard_grads();  // now, not at sync: after any clipping of the full gradients
    for (size_t g = 0; g < opt.param_groups().size(); ++g)  // the shard follows opt's lr (the user's schedule)
      if (shard_opt->lr(g) != opt.lr(g)) shard_opt->set_lr(g, opt.lr(g));
    update(*shard_opt);
    all_gather_params();
  } else {
    update(opt);
  }
  if (o.broadcast_buffers && pg.size() > 1)
    for (auto& [name, b] : model.named_buffers()) {
      Tensor t = b;
      pg.broadcast(t);
    }
  ++stats.steps;
}

void DataParallel::attach(amp::GradScaler& scaler) {
  ProcessGroup* pg = &impl_->pg;
  scaler.set_found_inf_reducer([pg](Tensor& found_inf) { pg->all_reduce(found_inf, ReduceOp::max); });
}

void DataParallel::set_grad_sync(bool on) { impl_->grad_sync = on; }

StateDict DataParallel::optimizer_state_dict() { return impl_->consolidate(); }

optim::Optimizer& DataParallel::optimizer() { return impl_->shard_opt ? *impl_->shard_opt : impl_->opt; }
const DataParallelStats& DataParallel::stats() const { return impl_->stats; }
ProcessGroup& DataParallel::group() const { return impl_->pg; }

}  // namespace mixprec::dist

// ProcessGroup: MPI's world as the job sees it (initialised on first use, only under a launcher),
// its collectives over CPU tensors, and the failure rule: every wait has a deadline, and an error,
// a timeout or an escaping exception aborts the whole job with one line instead of a hang.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "dist/comm.h"
#include "mixprec/convert.h"
#include "mixprec/error.h"

namespace mixprec::dist {
namespace {

MPI_Comm g_comm = MPI_COMM_NULL;
MPI_Op g_bf16_sum = MPI_OP_NULL;

// Set by mpirun/mpiexec (Open MPI), PMI launchers (MPICH, srun) and PMIx: a process started without
// one is a job of its own, and never calls MPI at all.
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

[[noreturn]] void on_terminate() {
  std::string why = "std::terminate called";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      why = mixprec::detail::concat("uncaught exception: ", x.what());
    } catch (...) {
      why = "uncaught exception of a non-standard type";
    }
  }
  ProcessGroup::world().abort_job(why);
}

// Open MPI's non-blocking all-reduce (coll/libnbc) takes the binomial tree below 4 ranks or in
// place, whatever the size: every byte is reduced on rank 0 and sent back, so rank 0 adds the whole
// bucket while the other waits. Its ring splits the bucket: each rank reduces 1/p of it and
// passes it on (and the result is reduced once per element, so it is the same bits everywhere).
// 2 ranks, the mlp's 7.5 MB of buckets: 1.0-1.9 ms against 2.7-4.5 ms (docs/distributed.md). Set
// for Open MPI before MPI_Init, unless the user chose an algorithm (the variable set, even empty).
void prefer_ring_allreduce() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) return;
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
}

double env_timeout_s() {
  const char* v = std::getenv("MIXPREC_DIST_TIMEOUT_S");
  if (!v) return 300.0;  // beside NCCL's 10 minutes: long enough for a slow first step, short for a hang
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  MIXPREC_CHECK(end != v && *end == '\0' && s > 0, "MIXPREC_DIST_TIMEOUT_S: expected seconds > 0, got '", v, "'");
  return s;
}

}  // namespace

const char* wire_dtype_name(WireDType w) { return w == WireDType::bf16 ? "bf16" : "f32"; }

ProcessGroup& ProcessGroup::world() {
  static ProcessGroup pg;
  return pg;
}

ProcessGroup::ProcessGroup() : timeout_s_(env_timeout_s()) {
  if (!launched_by_mpi()) return;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    prefer_ring_allreduce();
    // FUNNELED: only the thread that made the group calls MPI (the loader's and OpenMP's threads never do).
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      std::fprintf(stderr, "mixprec: MPI_Init_thread failed under an MPI launcher\n");
      std::exit(1);
    }
    owns_mpi_ = true;
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &g_comm);
  MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(g_comm, &rank_);
  MPI_Comm_size(g_comm, &size_);
  MPI_Op_create(&bf16_sum, /*commute=*/1, &g_bf16_sum);
  std::set_terminate(on_terminate);
}

ProcessGroup::~ProcessGroup() {
  if (g_comm == MPI_COMM_NULL) return;
  MPI_Op_free(&g_bf16_sum);
  MPI_Comm_free(&g_comm);
  if (owns_mpi_) MPI_Finalize();
}

void ProcessGroup::set_timeout_s(double seconds) {
  MIXPREC_CHECK(seconds > 0, "ProcessGroup.set_timeout_s: expected seconds > 0, got ", seconds);
  timeout_s_ = seconds;
}

void ProcessGroup::abort_job(const std::string& why) const {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  std::fprintf(stderr, "mixprec: rank %d of %d (%s, pid %d): %s; aborting the job\n", rank_, size_, host, int(getpid()),
               why.c_str());
  std::fflush(stderr);
  if (g_comm != MPI_COMM_NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

namespace {

void check_tensor(const Tensor& t, const char* call) {
  MIXPREC_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous(), "ProcessGroup.", call,
                ": expected a contiguous CPU tensor");
  MIXPREC_CHECK(t.numel() < (int64_t(1) << 31), "ProcessGroup.", call, ": ", t.numel(),
                " elements; one MPI message holds fewer than 2^31");
}

}  // namespace

void ProcessGroup::all_reduce(Tensor& t, ReduceOp op, WireDType wire) {
  check_tensor(t, "all_reduce");
  const DType dt = t.dtype();
  MIXPREC_CHECK(dt == DType::f32 || ((dt == DType::f64 || dt == DType::i64) && wire == WireDType::f32),
                "ProcessGroup.all_reduce: ", dtype_name(dt), " with a ", wire_dtype_name(wire),
                " wire (f32 takes either; f64 and i64 only an f32 wire, as themselves)");
  MIXPREC_CHECK(wire == WireDType::f32 || op != ReduceOp::max,
                "ProcessGroup.all_reduce: max over a bf16 wire (max is exact: use the f32 wire)");
  if (size_ == 1) return;
  const int n = int(t.numel());
  MPI_Request req = MPI_REQUEST_NULL;
  if (wire == WireDType::bf16) {
    std::vector<uint16_t> buf(static_cast<size_t>(n));
    convert_f32_to_bf16(t.data<float>(), buf.data(), size_t(n));
    detail::check(MPI_Iallreduce(MPI_IN_PLACE, buf.data(), n, MPI_UINT16_T, g_bf16_sum, g_comm, &req),
                  "all_reduce (bf16)");
    detail::wait(req, "all_reduce (bf16)");
    convert_bf16_to_f32(buf.data(), t.data<float>(), size_t(n));
  } else {
    detail::check(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), n, detail::mpi_type(dt),
                                 op == ReduceOp::max ? MPI_MAX : MPI_SUM, g_comm, &req),
                  "all_reduce");
    detail::wait(req, "all_reduce");
  }
  t.bump_version();
  if (op != ReduceOp::avg) return;
  if (dt == DType::f32)
    for (float* p = t.data<float>(); p != t.data<float>() + n; ++p) *p /= float(size_);
  else if (dt == DType::f64)
    for (double* p = t.data<double>(); p != t.data<double>() + n; ++p) *p /= double(size_);
  else
    for (int64_t* p = t.data<int64_t>(); p != t.data<int64_t>() + n; ++p) *p /= size_;
}

void ProcessGroup::broadcast(Tensor& t, int root) {
  check_tensor(t, "broadcast");
  MIXPREC_CHECK(root >= 0 && root < size_, "ProcessGroup.broadcast: root ", root, " is not a rank (size ", size_, ")");
  if (size_ == 1) return;
  MPI_Request req = MPI_REQUEST_NULL;
  detail::check(MPI_Ibcast(t.data_ptr(), int(t.nbytes()), MPI_BYTE, root, g_comm, &req), "broadcast");
  detail::wait(req, "broadcast");
  t.bump_version();
}

Tensor ProcessGroup::all_gather(const Tensor& t) {
  check_tensor(t, "all_gather");
  Shape shape = t.shape();
  shape.insert(shape.begin(), size_);
  Tensor out = Tensor::empty(shape, t.dtype());
  if (size_ == 1) {
    out.copy_(t.reshape(shape));
    return out;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  detail::check(
      MPI_Iallgather(t.data_ptr(), int(t.nbytes()), MPI_BYTE, out.data_ptr(), int(t.nbytes()), MPI_BYTE, g_comm, &req),
      "all_gather");
  detail::wait(req, "all_gather");
  return out;
}

void ProcessGroup::barrier() {
  if (size_ == 1) return;
  MPI_Request req = MPI_REQUEST_NULL;
  detail::check(MPI_Ibarrier(g_comm, &req), "barrier");
  detail::wait(req, "barrier");
}

// ------------------------------------------------------------------------------- internals

namespace detail {

MPI_Comm comm() { return g_comm; }
MPI_Op bf16_sum_op() { return g_bf16_sum; }

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i64:
      return MPI_INT64_T;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;
    default:
      return MPI_BYTE;
  }
}

void check(int rc, std::string_view what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  ProcessGroup::world().abort_job(mixprec::detail::concat("MPI error in ", what, ": ", msg));
}

bool test_all(std::vector<MPI_Request>& reqs, std::string_view what) {
  int done = 0;
  check(MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE), what);
  return done != 0;
}

namespace {

// Aborts the job once a wait that began at `start` has run past the group's timeout.
void check_deadline(std::chrono::steady_clock::time_point start, std::string_view what) {
  const ProcessGroup& pg = ProcessGroup::world();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (waited > pg.timeout_s())
    pg.abort_job(mixprec::detail::concat(what, " waited ", pg.timeout_s(),
                                         " s for the other ranks (one died, hangs, or called a different collective; "
                                         "MIXPREC_DIST_TIMEOUT_S sets the limit)"));
}

}  // namespace

void wait_all(std::vector<MPI_Request>& reqs, std::string_view what) {
  const auto start = std::chrono::steady_clock::now();
  while (!test_all(reqs, what)) check_deadline(start, what);
}

void wait_each(std::vector<MPI_Request>& reqs, std::string_view what, const std::function<void(size_t)>& done) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> indices(reqs.size());
  for (;;) {
    int n = 0;
    check(MPI_Testsome(int(reqs.size()), reqs.data(), &n, indices.data(), MPI_STATUSES_IGNORE), what);
    if (n == MPI_UNDEFINED) return;  // none left active
    for (int k = 0; k < n; ++k) done(size_t(indices[size_t(k)]));
    if (n == 0) check_deadline(start, what);
  }
}

void wait(MPI_Request& req, std::string_view what) {
  std::vector<MPI_Request> one{req};
  wait_all(one, what);
  req = one[0];
}

}  // namespace detail

}  // namespace mixprec::dist

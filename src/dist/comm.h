// The MPI side of dist (internal): the job's communicator, the bf16 sum, and waits with a deadline.
// Only src/dist/ includes mpi.h; the public header hides it.
#pragma once
#include <mpi.h>

#include <functional>
#include <string_view>
#include <vector>

#include "mixprec/dist.h"

namespace mixprec::dist::detail {

MPI_Comm comm();                 // the world's own duplicate of MPI_COMM_WORLD (errors return, never abort silently)
MPI_Op bf16_sum_op();            // sums bf16 pairs in f32, rounds to bf16 (commutative)
MPI_Datatype mpi_type(DType t);  // f32, f64, i64, u8 (as bytes), bf16/f16 (as 16-bit words)
// An MPI call's return code: anything but success aborts the job, naming `what` and MPI's message.
void check(int rc, std::string_view what);
// Polls MPI_Testall until every request is done; past the group's timeout it aborts the job,
// naming `what`. Done requests are MPI_REQUEST_NULL afterwards.
void wait_all(std::vector<MPI_Request>& reqs, std::string_view what);
void wait(MPI_Request& req, std::string_view what);
// The same wait, calling done(i) as each request i completes (in completion order), so that work on
// what has landed overlaps the wait for the rest.
void wait_each(std::vector<MPI_Request>& reqs, std::string_view what, const std::function<void(size_t)>& done);
// One MPI_Testall over the requests (lets a non-blocking collective progress): true when all are done.
bool test_all(std::vector<MPI_Request>& reqs, std::string_view what);

}  // namespace mixprec::dist::detail

// A data-parallel job in which one rank fails at step 3 (tests/dist/failure_test.sh runs it under
// mpirun and checks that the whole job ends within a bound, with a clear message):
//   throw: the last rank throws an exception nobody catches (std::terminate: the job is aborted)
//   kill:  the last rank is killed by SIGKILL (mpirun sees it die and ends the others)
//   hang:  the last rank stops calling MPI (the others' waits pass MIXPREC_DIST_TIMEOUT_S and abort)
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "mixprec/dist.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "mixprec/random.h"

using namespace mixprec;

int main(int argc, char** argv) {
  if (argc != 2 ||
      (std::strcmp(argv[1], "throw") != 0 && std::strcmp(argv[1], "kill") != 0 && std::strcmp(argv[1], "hang") != 0)) {
    std::fprintf(stderr, "usage: %s throw|kill|hang\n", argv[0]);
    return 2;
  }
  dist::ProcessGroup& pg = dist::ProcessGroup::world();
  nn::Sequential model(nn::Linear(32, 16), nn::ReLU(), nn::Linear(16, 4));
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  dist::DataParallel dp(model, opt);
  const bool failing = pg.rank() == pg.size() - 1;
  Generator gen(1);
  for (int step = 0; step < 1000000; ++step) {
    if (failing && step == 3) {
      if (argv[1][0] == 't') throw std::runtime_error("injected failure at step 3");
      if (argv[1][0] == 'k') raise(SIGKILL);
      for (;;) pause();  // hang: never reaches the next collective
    }
    opt.zero_grad();
    Tensor x = Tensor::randn({8, 32}, gen);
    Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3}, {8});
    ops::cross_entropy(model(x), y).backward();
    dp.step();
  }
  return 0;
}

// mixprec command-line entry point: subcommand dispatch and one-line errors.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "commands.h"
#include "mixprec/error.h"

namespace {

const char* kUsage = R"(usage: mixprec <command> [flags]

commands:
  train   train a model on Fashion-MNIST (or --data DIR of idx files), evaluate each epoch
  bench   time training steps on synthetic data, print one JSON object

shared flags (train, bench):
  --model mlp                  model to build (mlp: 784-hidden...-10)
  --hidden 1024,1024           mlp hidden widths
  --precision auto|fp32|amp-bf16
                               auto = amp-bf16 where the CPU has AMX-BF16 or AVX512-BF16, else fp32
  --optimizer adamw|sgd        (adamw: lr 1e-3; sgd: lr 0.05, --momentum 0.9)
  --lr X  --weight-decay X  --momentum X
  --batch-size N (512)  --seed N (0)  --threads N (available cores)

train:   --epochs N (5)  --data DIR  --metrics FILE (JSON lines)  --log-every K (1)  --detect-anomaly
bench:   --steps N (30)  --warmup N (5)
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> rest(argv + 2, argv + argc);
  for (const auto& r : rest)
    if (r == "--help" || r == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  try {
    mixprec::cli::Args args(cmd, rest);
    if (cmd == "train") return mixprec::cli::cmd_train(args);
    if (cmd == "bench") return mixprec::cli::cmd_bench(args);
    std::fprintf(stderr, "mixprec: unknown command '%s' (try `mixprec --help`)\n", cmd.c_str());
    return 2;
  } catch (const mixprec::Error& e) {
    std::fprintf(stderr, "mixprec %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mixprec %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}

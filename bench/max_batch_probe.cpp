// The max-batch engine (apps/mixprec/max_batch.h) from the command line until `mixprec max-batch`
// has its front end: for each precision the largest batch of one image model in a budget, with the
// split at its peak. Not built by default:
//   cmake --build build-cpu --target max_batch_probe
//   build-cpu/max_batch_probe MODEL WIDTHS BUDGET_MIB PRECISION...   (WIDTHS: cnn channels or mlp
//   hidden widths, comma-separated, or - for the model's default), e.g.
//   build-cpu/max_batch_probe cnn 420,1000 1024 fp32 amp-bf16 half-bf16
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "max_batch.h"
#include "mixprec/error.h"
#include "models.h"
#include "session.h"

using namespace mixprec;
using namespace mixprec::cli;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: max_batch_probe MODEL WIDTHS|- BUDGET_MIB PRECISION...\n");
    return 2;
  }
  try {
    SessionOptions base;
    base.model.name = argv[1];
    if (std::string(argv[2]) != "-") {
      std::vector<int64_t> widths;
      std::stringstream ss(argv[2]);
      for (std::string w; std::getline(ss, w, ',');) widths.push_back(std::stoll(w));
      (base.model.name == "mlp" ? base.model.hidden : base.model.channels) = widths;
    }
    const int64_t budget = std::stoll(argv[3]) << 20;
    const Recipe recipe = default_recipe(base.model.name);
    base.lr = recipe.adamw_lr;
    base.weight_decay = recipe.weight_decay;
    base.threads = available_cores();
    int64_t fp32_batch = 0;
    for (int i = 4; i < argc; ++i) {
      SessionOptions opt = base;
      opt.precision = resolve_precision(argv[i]);
      opt.scaler = amp::grad_scaler_options(opt.precision);
      opt.loss_scale = opt.scaler.enabled ? "dynamic" : "none";
      const MaxBatchResult r = find_max_batch(opt, budget, int64_t(1) << 22);
      if (opt.precision.name == "fp32") fp32_batch = r.batch;
      std::printf("%s %s batch %lld ratio %.3f attempts %lld peak %s\n", base.model.name.c_str(), argv[i],
                  (long long)r.batch, fp32_batch > 0 ? double(r.batch) / double(fp32_batch) : 0.0,
                  (long long)r.attempts, r.peak_by_category.dump().c_str());
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "max_batch_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}

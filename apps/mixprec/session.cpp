// Shared flags and the training step of the CLI.
#include "session.h"

#include <omp.h>
#include <sched.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "mixprec/cpu.h"
#include "mixprec/allocator.h"
#include "mixprec/amp.h"
#include "mixprec/error.h"

namespace mixprec::cli {

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

Precision resolve_precision(const std::string& name) {
  Precision p;
  if (name == "auto") {
    const bool amx = cpu::has_amx_bf16(), avx = cpu::has_avx512_bf16();
    // Without AMX or AVX512-BF16, bf16 math is emulated and slower than f32: stay in f32.
    p = resolve_precision(amx || avx ? "amp-bf16" : "fp32");
    p.why = amx ? "the CPU has AMX-BF16" : avx ? "the CPU has AVX512-BF16" : "the CPU has neither AMX-BF16 nor AVX512-BF16";
    return p;
  }
  p.name = name;
  if (name == "amp-bf16") {
    p.autocast = true;
    p.autocast_dtype = DType::bf16;
  } else if (name != "fp32") {
    throw Error(detail::concat("unknown precision '", name, "'"));
  }
  return p;
}

SessionOptions parse_session(Args& a) {
  SessionOptions o;
  o.model.name = a.choice("model", "mlp", model_names());
  o.model.hidden = a.int_list("hidden", o.model.hidden, 1, 1 << 16);
  o.model.channels = a.int_list("channels", o.model.channels, 1, 1 << 14);
  o.precision = resolve_precision(a.choice("precision", "auto", {"auto", "fp32", "amp-bf16"}));
  o.optimizer = a.choice("optimizer", "adamw", {"adamw", "sgd"});
  o.lr = a.real("lr", o.optimizer == "sgd" ? 0.05 : 1e-3, 0.0, 1e3, /*lo_open=*/true);
  o.weight_decay = a.real("weight-decay", 0.0, 0.0, 1.0);
  o.momentum = a.real("momentum", 0.9, 0.0, 0.999999);
  o.batch_size = a.integer("batch-size", 512, 1, 1 << 20);
  o.seed = uint64_t(a.integer("seed", 0, 0, INT64_MAX));
  o.threads = int(a.integer("threads", available_cores(), 1, 1024));
  return o;
}

Session make_session(const SessionOptions& opt) {
  omp_set_num_threads(opt.threads);
  default_generator().manual_seed(opt.seed);
  Session s;
  s.opt = opt;
  s.model = build_model(opt.model);
  if (opt.optimizer == "sgd") {
    optim::SGDOptions so;
    so.lr = opt.lr;
    so.momentum = opt.momentum;
    so.weight_decay = opt.weight_decay;
    s.optimizer = std::make_unique<optim::SGD>(s.model->parameters(), so);
  } else {
    optim::AdamWOptions ao;
    ao.lr = opt.lr;
    ao.weight_decay = opt.weight_decay;
    s.optimizer = std::make_unique<optim::AdamW>(s.model->parameters(), ao);
  }
  return s;
}

double train_step(Session& s, const Tensor& x, const Tensor& y) {
  s.optimizer->zero_grad();
  Tensor loss;
  {
    amp::Autocast ac(s.opt.precision.autocast_dtype, s.opt.precision.autocast);
    loss = ops::cross_entropy((*s.model)(x), y);
  }
  loss.backward();
  s.optimizer->step();
  return loss.item();
}

std::string peak_memory_json() {
  const MemoryStats st = allocator::stats();
  nlohmann::ordered_json j;
  j["total"] = st.peak_total;
  for (size_t i = 0; i < kNumMemCategories; ++i)
    j[std::string(mem_category_name(MemCategory(i)))] = st.at_peak_bytes[i];
  return j.dump();
}

std::string peak_memory_table() {
  const MemoryStats st = allocator::stats();
  std::ostringstream os;
  auto mib = [](int64_t b) { return double(b) / (1024.0 * 1024.0); };
  char line[160];
  std::snprintf(line, sizeof line, "peak memory %.1f MiB:", mib(st.peak_total));
  os << line;
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    if (st.at_peak_bytes[i] == 0) continue;
    std::snprintf(line, sizeof line, " %s %.1f", std::string(mem_category_name(MemCategory(i))).c_str(), mib(st.at_peak_bytes[i]));
    os << line;
  }
  return os.str();
}

}  // namespace mixprec::cli

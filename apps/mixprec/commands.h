// The CLI's subcommands: each declares its flags on its Command (cli.h) and returns its run.
#pragma once
#include <functional>
#include <string>

#include "cli.h"
#include "mixprec/io.h"

namespace mixprec::cli {
std::function<int()> declare_train(Command& c);
std::function<int()> declare_eval(Command& c);
std::function<int()> declare_export(Command& c);
std::function<int()> declare_bench(Command& c);
std::function<int()> declare_devices(Command& c);
std::function<int()> declare_sample(Command& c);
std::function<int()> declare_compare(Command& c);
std::function<int()> declare_plot(Command& c);
std::function<int()> declare_max_batch(Command& c);

// What `eval` of a gpt checkpoint takes beyond eval's image flags (sample.cpp).
struct GptEvalFlags {
  std::string text;  // empty: the run's
  int64_t eval_batches = 50;
};
// `eval` of a gpt checkpoint (f, read from path): the validation loss (sample.cpp).
int eval_gpt(const Command& c, const GptEvalFlags& g, const std::string& device, const std::string& precision,
             bool json, int64_t threads, const io::SafetensorsFile& f, const std::string& path);
// What `mixprec --version` prints.
std::string version_text();
}  // namespace mixprec::cli

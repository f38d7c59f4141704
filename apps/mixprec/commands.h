// The CLI's subcommands.
#pragma once
#include <string>

#include "args.h"
#include "mixprec/io.h"

namespace mixprec::cli {
int cmd_train(Args& a);
int cmd_eval(Args& a);
int cmd_export(Args& a);
int cmd_bench(Args& a);
int cmd_devices(Args& a);
int cmd_sample(Args& a);
// `eval` of a gpt checkpoint (f, read from path): the validation loss (sample.cpp).
int eval_gpt(Args& given, const io::SafetensorsFile& f, const std::string& path);
int cmd_version();
}  // namespace mixprec::cli

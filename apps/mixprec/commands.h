// The CLI's subcommands.
#pragma once
#include "args.h"

namespace mixprec::cli {
int cmd_train(Args& a);
int cmd_eval(Args& a);
int cmd_export(Args& a);
int cmd_bench(Args& a);
int cmd_devices(Args& a);
int cmd_version();
}  // namespace mixprec::cli

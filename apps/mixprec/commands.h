// The CLI's subcommands.
#pragma once
#include "args.h"

namespace mixprec::cli {
int cmd_train(Args& a);
int cmd_bench(Args& a);
}  // namespace mixprec::cli

// Every kernel family's interface, for code that calls many (ops/common.h, the tests). The
// families follow ops.def's family column: <family>.h declares the dispatch functions and the
// ref:: and cpu:: implementations; see ops/ops.def's header for where each part lives.
// Kernels do not record autograd; ops (src/ops) do.
#pragma once
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/binary.h"
#include "kernels/conv.h"
#include "kernels/embedding.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/pool.h"
#include "kernels/random.h"
#include "kernels/reduce.h"
#include "kernels/shape.h"
#include "kernels/softmax.h"
#include "kernels/unary.h"

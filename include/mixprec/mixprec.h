// The whole public API of mixprec in one include.
#pragma once
#include "mixprec/allocator.h"
#include "mixprec/amp.h"
#include "mixprec/autograd.h"
#include "mixprec/convert.h"
#include "mixprec/data.h"
#include "mixprec/dtype.h"
#include "mixprec/error.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "mixprec/tensor.h"

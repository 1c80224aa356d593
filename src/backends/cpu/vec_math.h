// The CPU kernels' vectorisable exp and running maximum: they live in
// brisk/core/fast_math.h (the sampler uses them too) and are named here for
// the kernels' namespace.
#pragma once

#include "brisk/core/fast_math.h"

namespace brisk::cpu {

using core::fast_exp;
using core::fast_exp_clamped;
using core::max_step;

}  // namespace brisk::cpu

// The ops layer's names for the op parameters, which core defines
// (brisk/core/op_params.h) because graph nodes carry them.
#pragma once

#include "brisk/core/op_params.h"

namespace brisk::ops {

using core::NoParams;
using core::ScaleParams;
using core::MatmulParams;
using core::LayerNormParams;
using core::AttentionParams;
using core::EmbeddingBackwardParams;
using core::CrossEntropyParams;
using core::ReduceParams;
using core::ExpandParams;
using core::ReshapeParams;
using core::PermuteParams;
using core::SplitParams;
using core::ConcatParams;
using core::CastParams;
using core::FillParams;
using core::AdamWParams;
using core::PackedLinearParams;
using core::DropoutParams;
using core::OpParams;

}  // namespace brisk::ops

// Mixed precision in a model's graph (torch.autocast's recipe): the helpers
// that put casts around the ops of a low-precision graph. The GPT
// (gpt.cpp, which says why each tensor keeps the dtype it does) and the
// encoder-bodied models build their blocks (transformer_block.h) with them.
// With dt == f32 every helper is the identity, so an fp32 graph is exactly
// what it would be without them.
#pragma once

#include <cassert>

#include "brisk/core/backend.h"
#include "brisk/core/graph.h"
#include "brisk/ops/ops.h"

namespace brisk::models {

struct Lowp {
  core::Graph& g;
  const core::Backend* backend;  // asked which ops have kernels in dt; may be null when dt is f32
  core::DType dt;

  static Lowp fp32(core::Graph& g) { return Lowp{g, nullptr, core::DType::f32}; }

  // v in the compute dtype (a weight at its use, a branch's input), or in f32.
  core::ValueId narrow(core::ValueId v) const { return g.meta(v).dtype == dt ? v : ops::cast(g, v, dt); }
  core::ValueId wide(core::ValueId v) const {
    return g.meta(v).dtype == core::DType::f32 ? v : ops::cast(g, v, core::DType::f32);
  }
  // Whether this backend has the op's forward and backward kernels in dt.
  bool native(core::OpKind fwd, core::OpKind bwd) const {
    if (dt == core::DType::f32) return true;
    assert(backend && "a low-precision Lowp needs the backend it asks about kernels");
    return backend->supports(fwd, dt) && backend->supports(bwd, dt);
  }
  // op(x) in the compute dtype: natively, or in f32 between casts (the same
  // numbers as a widen-compute-narrow kernel).
  template <class Op>
  core::ValueId run(core::ValueId x, core::OpKind fwd, core::OpKind bwd, Op op) const {
    return native(fwd, bwd) ? op(x) : narrow(op(wide(x)));
  }
};

}  // namespace brisk::models

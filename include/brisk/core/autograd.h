// Reverse-mode differentiation on the static graph. backward() walks the
// forward nodes in reverse, asks each op's backward rule for the gradients of
// its inputs (built from other ops, so they are planned, fused and tested like
// everything else) and sums gradients that meet at one value.
//
// Gradients of parameters are *accumulated* into external grad values
// (`grad += g`), so several micro-batches can run the same graph before one
// optimizer step: the caller zeroes the grads after stepping, not the graph.
// A parameter used several times (a tied embedding) gets one accumulate per
// piece, chained (each reads the previous one's result); the last one in
// the graph completes the gradient.
#pragma once

#include "brisk/core/graph.h"

namespace brisk::core {

struct BackwardOptions {
  // The seed dL/dL. Loss scaling (fp16) and micro-batch averaging set it.
  double loss_scale = 1.0;
  // Or: a scalar graph input holding the seed, so it can change every step
  // (accumulation count, dynamic loss scale) without rebuilding the graph.
  ValueId seed = kNoValue;
};

// Appends the backward pass for the scalar `loss`. Afterwards g.grad_of(p) is
// the external grad value of every parameter p that the loss depends on, and
// g.grad_of(x) an output value for every input created with requires_grad.
void backward(Graph& g, ValueId loss, const BackwardOptions& options = {});

// For backward rules: where the gradient of input `x` of `node` may be summed
// in place, or kNoValue. When x is an f32 parameter (or the one-use cast of
// one: mixed precision's narrowed weight) whose gradient nothing else adds
// to before it reaches the parameter, this is the parameter's accumulated
// gradient as it stands: the "grad:<p>" external (made here if absent) or the
// last op that wrote into it in place. A rule that computes the gradient
// straight into it (a beta = 1 product, a scatter-add with an `into`
// input) returns that op's output, which aliases the accumulator, as x's
// gradient (f32 even where x is the bf16 cast); backward() then takes it as
// the accumulated value instead of accumulating it again. This removes one
// gradient-sized buffer and one pass over it per parameter and micro-step.
ValueId grad_sink(Graph& g, const Node& node, ValueId x);

// x if it is an f32 parameter, or the f32 parameter x is a cast of (mixed
// precision's narrowed weight); kNoValue otherwise.
ValueId param_behind(const Graph& g, ValueId x);

}  // namespace brisk::core

// Host-side index geometry that an op's reference kernel and every backend's
// kernels agree on: the (outer, n, inner) view of a tensor around a reduce
// axis, a permutation reduced to the fewest strided output axes, and the
// valid prefix of each sequence of a right-padded batch. One definition, so
// the CPU, CUDA and reference kernels cannot drift apart.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "brisk/core/error.h"
#include "brisk/core/shape.h"
#include "brisk/ops/params.h"

namespace brisk::ops {

// The reduced dim is n; the dims before it multiply to outer, those after it
// to inner. ReduceParams::kAllAxes views the whole tensor as one row of n.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};

inline AxisSplit split_at(const core::Shape& s, int axis) {
  AxisSplit a;
  if (axis == ReduceParams::kAllAxes) {
    a.n = s.numel();
    return a;
  }
  axis = s.normalize_axis(axis);
  for (int i = 0; i < axis; ++i) a.outer *= s[i];
  a.n = s[axis];
  for (int i = axis + 1; i < s.rank(); ++i) a.inner *= s[i];
  return a;
}

// The permutation as output axes (size, input stride in elements), size-1
// axes dropped and runs of input-adjacent axes merged: a (B,T,H,D) ->
// (B,H,T,D) permute becomes 3 axes with a contiguous last one.
struct PermPlan {
  int rank = 0;
  int64_t size[core::kMaxRank] = {};
  int64_t stride[core::kMaxRank] = {};
};

inline PermPlan plan_permute(const core::Shape& xs, const core::Shape& dims) {
  const int r = xs.rank();
  const core::Strides st = core::contiguous_strides(xs);
  PermPlan p;
  int last_axis = -2;  // input axis of the previous kept output axis
  for (int i = 0; i < r; ++i) {
    const int a = int(dims[i] < 0 ? dims[i] + r : dims[i]);
    if (xs[a] == 1) continue;
    // Merge when this axis directly follows the previous one in the input,
    // skipping size-1 axes in between (they do not move anything).
    bool adjacent = p.rank > 0 && a > last_axis;
    for (int b = last_axis + 1; adjacent && b < a; ++b) adjacent = xs[b] == 1;
    if (adjacent) {
      p.size[p.rank - 1] *= xs[a];
      p.stride[p.rank - 1] = st[size_t(a)];
    } else {
      p.size[p.rank] = xs[a];
      p.stride[p.rank] = st[size_t(a)];
      ++p.rank;
    }
    last_axis = a;
  }
  return p;
}

// Right-padded batches (masked_attention, masked_mean): row b of a (B, T, ...)
// tensor is real at positions [0, lengths[b]) and padding after. A length
// outside [1, T] would read past the sequence or average over nothing, and it
// comes from user data (a batcher), so every kernel checks all of them on the
// host before it starts and throws ShapeError naming the op, the row and the value.
inline void check_lengths(std::string_view op, const int32_t* lengths, int64_t B, int64_t T) {
  for (int64_t b = 0; b < B; ++b)
    if (lengths[b] < 1 || lengths[b] > T)
      throw core::ShapeError(std::string(op) + ": lengths[" + std::to_string(b) + "] = " + std::to_string(lengths[b]) +
                             " is outside [1, T = " + std::to_string(T) + "]: batch row " + std::to_string(b) +
                             " needs at least one real position and at most T");
}

}  // namespace brisk::ops

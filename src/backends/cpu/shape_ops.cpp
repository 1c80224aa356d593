// CPU kernels for reshape, permute, split and concat, for every dtype.
//
// These ops only move bytes, so each kernel works on raw bytes (or on an
// unsigned integer of the element's size) and registers for all dtypes.
// permute first simplifies the permutation: size-1 axes are dropped and runs
// of output axes that are also adjacent, in order, in the input are merged.
// What is left is usually low-rank, and when the innermost axis survives the
// permutation (the (B, T, H, D) -> (B, H, T, D) head split) every output row
// is one memcpy; otherwise rows are gathered with a stride.
#include <cstring>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "brisk/ops/layout.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;
using ops::PermPlan;
using ops::plan_permute;

// Byte-block granularity worth a thread for plain copies.
constexpr int64_t kCopyGrain = 1 << 18;

char* bytes(const core::TensorView& t) { return static_cast<char*>(t.data); }

void reshape_any(const KernelCall& c) {
  if (c.out(0).data != c.in(0).data) std::memcpy(c.out(0).data, c.in(0).data, c.in(0).meta.bytes());
}


// Input offset (elements) of the first element of output row `row`, rows
// being all output axes but the last.
int64_t row_offset(const PermPlan& p, int64_t row) {
  int64_t off = 0;
  for (int i = p.rank - 2; i >= 0; --i) {
    off += (row % p.size[i]) * p.stride[i];
    row /= p.size[i];
  }
  return off;
}

template <class E>
void permute_gather(const E* x, E* y, const PermPlan& p, int64_t rows) {
  const int64_t len = p.size[p.rank - 1], step = p.stride[p.rank - 1];
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / len), [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const E* src = x + row_offset(p, row);
      E* dst = y + row * len;
      for (int64_t j = 0; j < len; ++j) dst[j] = src[j * step];
    }
  });
}

void permute_any(const KernelCall& c) {
  const size_t es = core::dtype_size(c.in(0).dtype());
  const PermPlan p = plan_permute(c.in(0).shape(), c.p<ops::PermuteParams>().dims);
  if (p.rank <= 1) {  // the permutation moves nothing: a plain copy
    std::memcpy(c.out(0).data, c.in(0).data, c.in(0).meta.bytes());
    return;
  }
  const int64_t rows = c.out(0).numel() / p.size[p.rank - 1];
  if (p.stride[p.rank - 1] == 1) {
    const size_t row_bytes = size_t(p.size[p.rank - 1]) * es;
    const char* x = bytes(c.in(0));
    char* y = bytes(c.out(0));
    parallel_for(rows, std::max<int64_t>(1, kCopyGrain / int64_t(row_bytes)), [&](int64_t lo, int64_t hi) {
      for (int64_t row = lo; row < hi; ++row)
        std::memcpy(y + size_t(row) * row_bytes, x + size_t(row_offset(p, row)) * es, row_bytes);
    });
    return;
  }
  switch (es) {
    case 1: return permute_gather(c.in(0).as<uint8_t>(), c.out(0).as<uint8_t>(), p, rows);
    case 2: return permute_gather(c.in(0).as<uint16_t>(), c.out(0).as<uint16_t>(), p, rows);
    case 4: return permute_gather(c.in(0).as<uint32_t>(), c.out(0).as<uint32_t>(), p, rows);
    default: return permute_gather(c.in(0).as<uint64_t>(), c.out(0).as<uint64_t>(), p, rows);
  }
}

// split and concat: the whole tensor is `outer` rows; along each row the
// pieces sit one after the other, piece j taking size_j * inner elements.
// kSplit copies the joined tensor into the pieces; otherwise pieces into it.
template <bool kSplit>
void split_concat(const core::TensorView& joined, std::span<const core::TensorView> pieces, int axis_param) {
  const core::Shape& s = joined.shape();
  const int axis = s.normalize_axis(axis_param);
  const size_t es = core::dtype_size(joined.dtype());
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= s[i];
  for (int i = axis + 1; i < s.rank(); ++i) inner *= s[i];
  const size_t joined_row = size_t(s[axis] * inner) * es;
  parallel_for(outer, std::max<int64_t>(1, kCopyGrain / int64_t(std::max<size_t>(1, joined_row))),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t o = lo; o < hi; ++o) {
                   size_t offset = 0;
                   for (const core::TensorView& piece : pieces) {
                     const size_t n = size_t(piece.shape()[axis] * inner) * es;
                     char* j = bytes(joined) + size_t(o) * joined_row + offset;
                     char* q = bytes(piece) + size_t(o) * n;
                     if constexpr (kSplit)
                       std::memcpy(q, j, n);
                     else
                       std::memcpy(j, q, n);
                     offset += n;
                   }
                 }
               });
}

void split_any(const KernelCall& c) { split_concat<true>(c.in(0), c.outputs, c.p<ops::SplitParams>().axis); }
void concat_any(const KernelCall& c) { split_concat<false>(c.out(0), c.inputs, c.p<ops::ConcatParams>().axis); }

}  // namespace

void register_shape_kernels(core::KernelRegistry& r) {
  for (int t = 0; t < core::kNumDTypes; ++t) {
    const auto dt = core::DType(t);
    r.add(core::OpKind::reshape, dt, reshape_any);
    r.add(core::OpKind::permute, dt, permute_any);
    r.add(core::OpKind::split, dt, split_any);
    r.add(core::OpKind::concat, dt, concat_any);
  }
}

}  // namespace brisk::cpu

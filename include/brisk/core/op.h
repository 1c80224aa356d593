// The contract between the engine and an op. Core knows ops only through an
// OpDef: shape/dtype inference, the backward rule, the reference kernel, the
// test cases. The ops layer fills the table at start-up (ops::register_ops(),
// called by every graph-building helper), so core links to nothing above it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "brisk/core/tensor.h"
#include "brisk/core/op_params.h"

namespace brisk::core {

enum class OpKind : uint16_t {
#define BRISK_OP(name) name,
#include "brisk/core/op_list.inc"
#undef BRISK_OP
};

inline constexpr int kNumOps = 0
#define BRISK_OP(name) +1
#include "brisk/core/op_list.inc"
#undef BRISK_OP
    ;

std::string_view op_name(OpKind k);

class Graph;
struct Node;
using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

struct ExecContext;

// Everything a kernel sees. Inputs and outputs are contiguous; outputs that
// alias an input (views, in-place ops) point at the same bytes.
struct KernelCall {
  const OpParams* params = nullptr;
  std::span<const TensorView> inputs;
  std::span<const TensorView> outputs;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  const ExecContext* ctx = nullptr;

  template <class P> const P& p() const { return std::get<P>(*params); }
  const TensorView& in(int i) const { return inputs[size_t(i)]; }
  const TensorView& out(int i) const { return outputs[size_t(i)]; }
};

using KernelFn = void (*)(const KernelCall&);

// How the op harness should fill an input.
struct InputSpec {
  TensorMeta meta;
  double lo = -1.0, hi = 1.0;  // uniform range; integer inputs draw integers in [lo, hi)
  bool differentiable = true;  // include in the finite-difference check
  // Exact contents instead of a uniform draw (index tables whose entries must
  // be consistent with each other, e.g. kv_attention's block table).
  std::vector<double> values;
};

struct TestCase {
  std::string label;
  std::vector<InputSpec> inputs;
  OpParams params;
  double grad_tolerance = 0.0;  // 0: the harness default
  // 0: by each output's dtype. A case whose f32 results come from 16-bit
  // operands rounded on the way (a bf16 kernel's f32 loss or accumulator)
  // states the precision its kernels promise instead.
  double forward_tolerance = 0.0;
};

// Gradient of each input, kNoValue where the input gets none.
using BackwardFn = std::vector<ValueId> (*)(Graph& g, const Node& node, std::span<const ValueId> out_grads);

struct OpDef {
  OpKind kind{};
  std::string_view name;
  // Output metas from input metas; throws ShapeError/DTypeError naming the op.
  std::vector<TensorMeta> (*infer)(std::span<const TensorMeta> inputs, const OpParams& params) = nullptr;
  // nullptr: the op is not differentiable (backward ops, fill, optimizer steps).
  BackwardFn backward = nullptr;
  // Scalar reference kernel: plain loops, double accumulation. The test oracle.
  KernelFn reference = nullptr;
  std::vector<TestCase> (*test_cases)() = nullptr;
  // Scratch bytes the op needs while it runs (0 for most).
  size_t (*workspace_bytes)(std::span<const TensorMeta> inputs, const OpParams& params) = nullptr;
  // For each output: the input whose memory it reuses (views, in-place ops), or -1.
  std::vector<int> output_aliases;
  // Multi-tensor ops (adamw over every parameter) take their inputs in groups
  // of this many and produce output_aliases.size() outputs per group, aliased
  // within the group. 0: output_aliases lists every output.
  int alias_group_inputs = 0;
  // The input output `o` of a node with `n_inputs` inputs reuses, or -1 (both
  // forms above). An alias of an optional trailing input the node was not
  // given (classifier_train's gradient accumulator) is no alias.
  int alias_of(size_t o, size_t n_inputs) const {
    int a = o < output_aliases.size() ? output_aliases[o] : -1;
    if (alias_group_inputs > 0 && !output_aliases.empty()) {
      const size_t per = output_aliases.size();
      a = output_aliases[o % per];
      if (a >= 0) a += int(o / per) * alias_group_inputs;
    }
    return a >= 0 && size_t(a) < n_inputs ? a : -1;
  }
  // Which input's dtype selects the kernel; -1 means output 0's dtype.
  int kernel_dtype_input = 0;
  // Outputs that backward rules may read but that the forward result does not
  // need (saved statistics): counted separately in memory reports.
  int num_saved_outputs = 0;
};

// The table the ops layer fills. op_def throws BackendError if `k` was never
// registered (brisk_ops not linked or register_ops() not called).
void set_op_def(const OpDef& def);
const OpDef& op_def(OpKind k);
bool op_registered(OpKind k);

}  // namespace brisk::core

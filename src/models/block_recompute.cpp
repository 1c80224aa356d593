// train.recompute's policy for transformer_block models; see block_recompute.h.
#include "brisk/models/block_recompute.h"

#include <optional>

#include "brisk/core/error.h"
#include "brisk/ops/ops.h"

namespace brisk::models {

using core::Graph;
using core::ValueId;

void validate_recompute(const std::string& level) {
  if (level != "none" && level != "selective" && level != "full")
    throw core::ConfigError("train.recompute: unknown value '" + level + "' (allowed: none, selective, full)");
}

namespace {

std::optional<core::RecomputeRecipe> selective_recipe(const Graph& g, const core::Node& n) {
  using core::OpKind;
  switch (n.op) {
    case OpKind::gelu:
    case OpKind::layernorm:
      return core::clone_recipe(n);
    case OpKind::linear_gelu: {  // y = gelu(h) from the saved h, not the gemm again
      core::RecomputeRecipe r;
      r.outputs = {0};
      r.reads = {n.outputs[1]};
      r.emit = [](Graph& dst, const std::vector<ValueId>& in) { return std::vector<ValueId>{ops::gelu(dst, in[0])}; };
      return r;
    }
    case OpKind::add_layernorm: {  // y, mean, rstd = layernorm(s) from the saved sum s
      core::RecomputeRecipe r;
      r.outputs = {1, 2, 3};
      r.reads = {n.outputs[0], n.inputs[2], n.inputs[3]};
      r.emit = [params = std::get<ops::LayerNormParams>(n.params)](Graph& dst, const std::vector<ValueId>& in) {
        const ops::LayerNormOut o = ops::layernorm(dst, in[0], in[1], in[2], params.eps, params.narrow_to);
        return std::vector<ValueId>{o.y, o.mean, o.rstd};
      };
      return r;
    }
    case OpKind::cast: {  // mixed precision: the narrowed copy of a recomputed output
      const int p = g.value(n.inputs[0]).producer;
      if (p >= 0 && selective_recipe(g, g.nodes()[size_t(p)])) return core::clone_recipe(n);
      return std::nullopt;
    }
    default:
      return std::nullopt;
  }
}

}  // namespace

core::RecomputeResult recompute_blocks(const Graph& g, const std::string& level, const std::vector<std::string>& stacks,
                                       int64_t n_layer) {
  validate_recompute(level);
  core::RecomputePolicy policy;
  if (level != "none") policy.selective = selective_recipe;
  if (level == "full")
    for (const std::string& stack : stacks) {
      std::vector<size_t> cut;  // the node producing each block boundary
      for (int64_t l = 0; l <= n_layer; ++l) {
        const ValueId v = g.find(stack + std::to_string(l));
        if (v == core::kNoValue || g.value(v).producer < 0)
          throw core::Error("train.recompute = full: the graph has no block boundary '" + stack + std::to_string(l) +
                            "' made by a node");
        cut.push_back(size_t(g.value(v).producer));
      }
      for (size_t k = 0; k + 1 < cut.size(); ++k)
        if (cut[k] < cut[k + 1]) policy.segments.emplace_back(cut[k] + 1, cut[k + 1] + 1);
    }
  return core::recompute(g, policy);
}

void remap_values(const core::RecomputeResult& r, std::initializer_list<ValueId*> ids) {
  for (ValueId* v : ids)
    if (*v != core::kNoValue) *v = r.map[size_t(*v)];
}

}  // namespace brisk::models

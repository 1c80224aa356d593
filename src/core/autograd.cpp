// Reverse-mode autograd over the static graph (see autograd.h).
#include "brisk/core/autograd.h"

#include "brisk/core/error.h"

namespace brisk::core {

void backward(Graph& g, ValueId loss, const BackwardOptions& options) {
  const TensorMeta loss_meta = g.meta(loss);
  if (loss_meta.shape.numel() != 1 || !dtype_is_float(loss_meta.dtype))
    throw ShapeError("backward: the loss must be a single float value, got " + loss_meta.str());
  if (g.backward_start() < g.nodes().size())
    throw Error("backward: this graph already has a backward pass");

  const size_t forward_nodes = g.nodes().size();
  g.set_backward_start(forward_nodes);
  std::vector<ValueId> grad(g.num_values(), kNoValue);

  if (options.seed != kNoValue) {
    if (!(g.meta(options.seed) == loss_meta))
      throw ShapeError("backward: the seed " + g.meta(options.seed).str() + " must match the loss " + loss_meta.str());
    grad[size_t(loss)] = options.seed;
  } else {
    grad[size_t(loss)] =
        g.add_node1(OpKind::fill, {}, FillParams{loss_meta.shape, loss_meta.dtype, options.loss_scale});
  }

  auto add_grad = [&](ValueId v, ValueId dv) {
    if (grad.size() < g.num_values()) grad.resize(g.num_values(), kNoValue);
    ValueId& slot = grad[size_t(v)];
    slot = slot == kNoValue ? dv : g.add_node1(OpKind::add, {slot, dv});
  };

  auto backward_node = [&](size_t i) {
    const Node node = g.nodes()[i];  // a copy: the rule below appends nodes
    const OpDef& def = op_def(node.op);
    if (!def.backward) return;
    bool any_input_needs = false;
    for (ValueId v : node.inputs) any_input_needs = any_input_needs || g.value(v).requires_grad;
    if (!any_input_needs) return;

    std::vector<ValueId> out_grads;
    bool any_out_grad = false;
    for (ValueId v : node.outputs) {
      const ValueId dv = size_t(v) < grad.size() ? grad[size_t(v)] : kNoValue;
      out_grads.push_back(dv);
      any_out_grad = any_out_grad || dv != kNoValue;
    }
    if (!any_out_grad) return;

    const std::vector<ValueId> in_grads = def.backward(g, node, out_grads);
    if (in_grads.size() != node.inputs.size())
      throw Error("backward rule of '" + std::string(def.name) + "' returned " + std::to_string(in_grads.size()) +
                  " gradients for " + std::to_string(node.inputs.size()) + " inputs");
    for (size_t j = 0; j < in_grads.size(); ++j) {
      const ValueId x = node.inputs[j];
      if (in_grads[j] == kNoValue || !g.value(x).requires_grad) continue;
      if (g.meta(in_grads[j]).shape != g.shape(x))
        throw ShapeError("backward rule of '" + std::string(def.name) + "' gave a gradient of shape " +
                         g.meta(in_grads[j]).str() + " for input " + std::to_string(j) + " of shape " +
                         g.meta(x).str());
      add_grad(x, in_grads[j]);
    }
  };

  // A parameter's gradient is complete once the backward of its first use
  // (in forward order) has run: its accumulate goes right there, not after
  // the whole backward. The planner then frees each partial gradient
  // sooner, and data parallelism can send a finished gradient while the
  // rest of backward runs (dist/data_parallel.h).
  std::vector<std::vector<ValueId>> params_first_used_at(forward_nodes);
  {
    std::vector<bool> seen(g.num_values(), false);
    for (size_t i = 0; i < forward_nodes; ++i)
      for (ValueId v : g.nodes()[i].inputs)
        if (g.value(v).role == ValueRole::param && !seen[size_t(v)]) {
          seen[size_t(v)] = true;
          params_first_used_at[i].push_back(v);
        }
  }
  auto accumulate_param = [&](ValueId p) {
    const ValueId dv = size_t(p) < grad.size() ? grad[size_t(p)] : kNoValue;
    if (dv == kNoValue) return;
    const Value& val = g.value(p);
    const ValueId ext = g.external("grad:" + val.name, val.meta.shape, val.meta.dtype, ValueRole::grad);
    g.mark_output(g.add_node1(OpKind::accumulate, {ext, dv}));
    g.set_grad_of(p, ext);
  };

  for (size_t i = forward_nodes; i-- > 0;) {
    backward_node(i);
    for (ValueId p : params_first_used_at[i]) accumulate_param(p);
  }

  // Inputs created with requires_grad: expose their gradients.
  const size_t n_values = g.num_values();
  for (size_t v = 0; v < n_values && v < grad.size(); ++v) {
    const Value& val = g.value(ValueId(v));
    const ValueId dv = grad[v];
    if (dv == kNoValue) continue;
    if (val.role == ValueRole::input && val.requires_grad) {
      g.mark_output(dv);
      g.set_grad_of(ValueId(v), dv);
    }
  }
}

}  // namespace brisk::core

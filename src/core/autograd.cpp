// Reverse-mode autograd over the static graph (see autograd.h).
#include "brisk/core/autograd.h"

#include <algorithm>

#include "brisk/core/error.h"

namespace brisk::core {
namespace {

// Parameter p's accumulated gradient as it stands: the "grad:<p>" external
// followed through every node that wrote into it in place (an accumulate, or
// an op given it as an accumulator input), or kNoValue while nothing has
// made the external. The chain of a tied parameter's pieces is read off the
// graph this way, so backward() and grad_sink() always agree on its end.
ValueId accumulator_of(const Graph& g, ValueId p) {
  ValueId head = g.find(grad_name(g.value(p).name));
  if (head == kNoValue) return kNoValue;
  for (const Node& n : g.nodes())
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      const int a = op_def(n.op).alias_of(o, n.inputs.size());
      if (a >= 0 && n.inputs[size_t(a)] == head) head = n.outputs[o];
    }
  return head;
}

}  // namespace

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

  // A parameter's gradient is complete once the backward of its first use
  // (in forward order) has run: its accumulate goes right there, not after
  // the whole backward. The planner then frees each partial gradient
  // sooner, and data parallelism can send a finished gradient while the
  // rest of backward runs (dist/data_parallel.h).
  std::vector<std::vector<ValueId>> params_first_used_at(forward_nodes);
  std::vector<int> first_use(g.num_values(), -1);
  for (size_t i = 0; i < forward_nodes; ++i)
    for (ValueId v : g.nodes()[i].inputs)
      if (g.value(v).role == ValueRole::param && first_use[size_t(v)] < 0) {
        first_use[size_t(v)] = int(i);
        params_first_used_at[i].push_back(v);
      }

  // A parameter used more than once (a tied embedding and LM head) gets one
  // gradient piece per use. Each piece that arrives before the backward of
  // the first use is accumulated into the external grad at once, in a chain
  // of accumulates (each reads the previous one's result, so they stay in
  // order): summing the pieces with `add` instead would keep every piece and
  // their sum alive together until the last one is made, three (V, C)
  // buffers at once for a tied head. The last accumulate of the chain is
  // the one that completes the gradient.
  //
  // An op may already have summed its piece into the gradient in place: a
  // forward op given the "grad:<w>" external (ops::classifier_train, by its
  // fusion pass), or a backward rule given the accumulator by grad_sink()
  // (a Linear's dW product, an embedding's scatter-add). Its output aliases
  // the chain, so it is the chain's end already: nothing is accumulated.
  auto accumulate_into_grad = [&](ValueId p, ValueId dv) {
    const std::string name = grad_name(g.value(p).name);  // copies: external() may grow the value table
    const TensorMeta meta = g.meta(p);
    ValueId chain = accumulator_of(g, p);
    if (chain == kNoValue) chain = g.external(name, meta.shape, meta.dtype, ValueRole::grad);
    g.set_grad_of(p, g.at(name));
    if (chain != dv) chain = g.add_node1(OpKind::accumulate, {chain, dv});
    g.mark_output(chain);
  };
  auto accumulate_param = [&](ValueId p) {
    const ValueId dv = size_t(p) < grad.size() ? grad[size_t(p)] : kNoValue;
    if (dv != kNoValue) accumulate_into_grad(p, dv);
  };

  auto add_grad = [&](size_t node, ValueId v, ValueId dv) {
    // A piece is accumulated at once when an earlier use remains (the piece
    // is final) or when it was already summed into the gradient in place.
    const bool earlier_use = first_use[size_t(v)] >= 0 && size_t(first_use[size_t(v)]) < node;
    if (g.value(v).role == ValueRole::param && (earlier_use || accumulator_of(g, v) == dv)) {
      accumulate_into_grad(v, dv);
      return;
    }
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
      add_grad(i, x, in_grads[j]);
    }
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

ValueId param_behind(const Graph& g, ValueId x) {
  ValueId p = x;
  if (g.value(x).role != ValueRole::param) {
    const int c = g.value(x).producer;
    if (c < 0 || g.nodes()[size_t(c)].op != OpKind::cast) return kNoValue;
    p = g.nodes()[size_t(c)].inputs[0];
  }
  return g.value(p).role == ValueRole::param && g.meta(p).dtype == DType::f32 ? p : kNoValue;
}

ValueId grad_sink(Graph& g, const Node& node, ValueId x) {
  if (node.outputs.empty() || std::count(node.inputs.begin(), node.inputs.end(), x) != 1) return kNoValue;
  const int at = g.value(node.outputs[0]).producer;  // node's index
  const ValueId p = param_behind(g, x);
  if (p == kNoValue || !g.value(p).requires_grad) return kNoValue;
  // Nodes (from, at) must not read p: their pieces would reach the accumulator in between.
  const int from = x == p ? at : g.value(x).producer;
  for (size_t i = 0; i < g.backward_start(); ++i) {  // forward readers: what gradient pieces come from
    const Node& r = g.nodes()[i];
    const bool reads_x = x != p && std::count(r.inputs.begin(), r.inputs.end(), x) > 0;
    const bool reads_p = int(i) > from && int(i) < at && std::count(r.inputs.begin(), r.inputs.end(), p) > 0;
    if ((reads_x && int(i) != at) || reads_p) return kNoValue;
  }
  const ValueId head = accumulator_of(g, p);
  if (head != kNoValue) return head;
  const Shape shape = g.shape(p);  // a copy: external() grows the value table
  return g.external(grad_name(g.value(p).name), shape, DType::f32, ValueRole::grad);
}

}  // namespace brisk::core

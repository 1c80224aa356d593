// A static graph for one set of input shapes. Building a model's forward pass
// appends nodes (op, inputs, typed params) and values whose shapes are
// inferred on the spot, so a shape error surfaces where the model code made
// it. backward() (autograd.h) appends the gradient nodes to the same graph;
// the planner and executor then treat forward and backward alike.
//
// Values have a role. Parameters, their gradients and optimizer state are
// "external": they live in a ParameterStore across steps and are bound to the
// executor, never placed in the planned arena. Everything else (inputs,
// activations, gradients of activations) is planned.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "brisk/core/op.h"

namespace brisk::core {

enum class ValueRole : uint8_t {
  input,       // written by the caller (token ids, targets); planned, kept for the whole step
  activation,  // produced by a node; planned in the arena
  param,       // external: a trainable parameter
  grad,        // external: the accumulated gradient of a parameter
  state,       // external: anything else that persists (optimizer moments)
};

inline bool role_is_external(ValueRole r) {
  return r == ValueRole::param || r == ValueRole::grad || r == ValueRole::state;
}

// The name of parameter `param`'s accumulated gradient (a ValueRole::grad
// external): what core::backward accumulates into and Executor::bind binds
// to the store's gradient.
inline std::string grad_name(const std::string& param) { return "grad:" + param; }

struct Value {
  TensorMeta meta;
  ValueRole role = ValueRole::activation;
  std::string name;
  int producer = -1;  // node index, -1 for inputs and externals
  bool requires_grad = false;
  bool is_output = false;  // kept alive until the end of the step
};

struct Node {
  OpKind op{};
  OpParams params;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  bool is_backward = false;  // appended by autograd
};

class Graph {
 public:
  ValueId input(const std::string& name, const Shape& shape, DType dtype, bool requires_grad = false);
  ValueId param(const std::string& name, const Shape& shape, DType dtype = DType::f32);
  ValueId external(const std::string& name, const Shape& shape, DType dtype, ValueRole role);

  // Infers output metas through the op's definition and appends the node.
  std::vector<ValueId> add_node(OpKind op, std::vector<ValueId> inputs, OpParams params = {});
  ValueId add_node1(OpKind op, std::vector<ValueId> inputs, OpParams params = {}) {
    return add_node(op, std::move(inputs), std::move(params))[0];
  }
  void mark_output(ValueId v) { values_.at(size_t(v)).is_output = true; }

  const Value& value(ValueId v) const { return values_.at(size_t(v)); }
  Value& value(ValueId v) { return values_.at(size_t(v)); }
  const TensorMeta& meta(ValueId v) const { return value(v).meta; }
  const Shape& shape(ValueId v) const { return value(v).meta.shape; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  size_t num_values() const { return values_.size(); }

  // Named values (inputs, params, outputs a caller asked to name).
  ValueId find(const std::string& name) const;  // kNoValue if absent
  ValueId at(const std::string& name) const;    // throws Error naming it
  void set_name(ValueId v, const std::string& name);

  // Filled by backward(): the gradient value of a parameter or input.
  ValueId grad_of(ValueId v) const;  // kNoValue if it has none
  void set_grad_of(ValueId v, ValueId grad) { grad_of_[v] = grad; }
  std::vector<ValueId> params() const;

  // Index of the first backward node (nodes().size() if none).
  size_t backward_start() const { return backward_start_ < nodes_.size() ? backward_start_ : nodes_.size(); }
  void set_backward_start(size_t i) { backward_start_ = i; }

  std::string str() const;  // one line per node, for debugging

 private:
  ValueId new_value(Value v);
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::unordered_map<std::string, ValueId> names_;
  std::unordered_map<ValueId, ValueId> grad_of_;
  size_t backward_start_ = SIZE_MAX;
};

}  // namespace brisk::core

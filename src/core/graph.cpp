// Graph construction: values, nodes, names. Shape inference runs as each node
// is added, so errors point at the model line that caused them.
#include "brisk/core/graph.h"

#include "brisk/core/error.h"

namespace brisk::core {

ValueId Graph::new_value(Value v) {
  const ValueId id = ValueId(values_.size());
  if (!v.name.empty()) {
    if (names_.count(v.name)) throw Error("graph: the name '" + v.name + "' is used twice");
    names_[v.name] = id;
  }
  values_.push_back(std::move(v));
  return id;
}

ValueId Graph::input(const std::string& name, const Shape& shape, DType dtype, bool requires_grad) {
  Value v;
  v.meta = {shape, dtype};
  v.role = ValueRole::input;
  v.name = name;
  v.requires_grad = requires_grad;
  return new_value(std::move(v));
}

ValueId Graph::param(const std::string& name, const Shape& shape, DType dtype) {
  Value v;
  v.meta = {shape, dtype};
  v.role = ValueRole::param;
  v.name = name;
  v.requires_grad = true;
  return new_value(std::move(v));
}

ValueId Graph::external(const std::string& name, const Shape& shape, DType dtype, ValueRole role) {
  if (!role_is_external(role)) throw Error("graph: external value '" + name + "' needs an external role");
  Value v;
  v.meta = {shape, dtype};
  v.role = role;
  v.name = name;
  return new_value(std::move(v));
}

std::vector<ValueId> Graph::add_node(OpKind op, std::vector<ValueId> inputs, OpParams params) {
  const OpDef& def = op_def(op);
  std::vector<TensorMeta> in_metas;
  in_metas.reserve(inputs.size());
  bool requires_grad = false;
  for (ValueId v : inputs) {
    if (v < 0 || size_t(v) >= values_.size())
      throw Error("graph: op '" + std::string(def.name) + "' got an invalid input value id " + std::to_string(v));
    in_metas.push_back(values_[size_t(v)].meta);
    requires_grad = requires_grad || values_[size_t(v)].requires_grad;
  }
  std::vector<TensorMeta> out_metas = def.infer(in_metas, params);

  Node n;
  n.op = op;
  n.params = std::move(params);
  n.inputs = std::move(inputs);
  const int node_index = int(nodes_.size());
  for (const TensorMeta& m : out_metas) {
    Value v;
    v.meta = m;
    v.role = ValueRole::activation;
    v.producer = node_index;
    v.requires_grad = requires_grad && def.backward != nullptr;
    n.outputs.push_back(new_value(std::move(v)));
  }
  n.is_backward = backward_start_ != SIZE_MAX;
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs;
}

ValueId Graph::find(const std::string& name) const {
  auto it = names_.find(name);
  return it == names_.end() ? kNoValue : it->second;
}

ValueId Graph::at(const std::string& name) const {
  const ValueId v = find(name);
  if (v == kNoValue) throw Error("graph: no value named '" + name + "'");
  return v;
}

void Graph::set_name(ValueId v, const std::string& name) {
  if (names_.count(name)) throw Error("graph: the name '" + name + "' is used twice");
  names_[name] = v;
  value(v).name = name;
}

ValueId Graph::grad_of(ValueId v) const {
  auto it = grad_of_.find(v);
  return it == grad_of_.end() ? kNoValue : it->second;
}

std::vector<ValueId> Graph::params() const {
  std::vector<ValueId> p;
  for (size_t i = 0; i < values_.size(); ++i)
    if (values_[i].role == ValueRole::param) p.push_back(ValueId(i));
  return p;
}

std::string Graph::str() const {
  std::string s;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    s += std::to_string(i) + (n.is_backward ? " [bwd] " : " ") + std::string(op_name(n.op)) + "(";
    for (size_t j = 0; j < n.inputs.size(); ++j)
      s += (j ? ", " : "") + std::string("%") + std::to_string(n.inputs[j]);
    s += ") -> ";
    for (size_t j = 0; j < n.outputs.size(); ++j)
      s += (j ? ", " : "") + std::string("%") + std::to_string(n.outputs[j]) + ":" + meta(n.outputs[j]).str();
    s += "\n";
  }
  return s;
}

}  // namespace brisk::core

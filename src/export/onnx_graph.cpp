// OnnxGraph (onnx_graph.h): node and initializer helpers over onnx::GraphProto.
#include "onnx_graph.h"

#include <bit>
#include <stdexcept>

namespace brisk::exporter {

static_assert(std::endian::native == std::endian::little, "ONNX raw_data is little-endian");

onnx::AttributeProto attr_int(const std::string& name, int64_t value) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(value);
  return a;
}

onnx::AttributeProto attr_ints(const std::string& name, const std::vector<int64_t>& values) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a.add_ints(v);
  return a;
}

onnx::AttributeProto attr_float(const std::string& name, float value) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::FLOAT);
  a.set_f(value);
  return a;
}

void declare(onnx::ValueInfoProto* v, const std::string& name, int32_t elem_type, const std::vector<Dim>& dims,
             const std::string& doc) {
  v->set_name(name);
  v->set_doc_string(doc);
  onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem_type);
  for (const Dim& d : dims) {
    onnx::TensorShapeProto_Dimension* out = t->mutable_shape()->add_dim();
    if (d.symbol.empty()) out->set_dim_value(d.value);
    else out->set_dim_param(d.symbol);
  }
}

void OnnxGraph::claim(const std::string& name) {
  // The exporter's own wiring, not user input: a clash is a bug in it.
  if (!names_.insert(name).second) throw std::logic_error("onnx export: value name '" + name + "' used twice");
}

std::string OnnxGraph::op(const std::string& op_type, const std::vector<std::string>& inputs,
                          const std::string& name, std::initializer_list<onnx::AttributeProto> attrs) {
  return op_multi(op_type, inputs, name, {name}, attrs).front();
}

std::vector<std::string> OnnxGraph::op_multi(const std::string& op_type, const std::vector<std::string>& inputs,
                                             const std::string& name, const std::vector<std::string>& outputs,
                                             std::initializer_list<onnx::AttributeProto> attrs) {
  onnx::NodeProto* n = g_.add_node();
  n->set_name(name);
  n->set_op_type(op_type);
  for (const std::string& in : inputs) n->add_input(in);
  for (const std::string& out : outputs) {
    claim(out);
    n->add_output(out);
  }
  for (const onnx::AttributeProto& a : attrs) *n->add_attribute() = a;
  return outputs;
}

onnx::TensorProto* OnnxGraph::initializer(const std::string& name, const std::vector<int64_t>& dims, int32_t dtype) {
  claim(name);
  onnx::TensorProto* t = g_.add_initializer();
  t->set_name(name);
  t->set_data_type(dtype);
  for (int64_t d : dims) t->add_dims(d);
  return t;
}

std::string OnnxGraph::f32(const std::string& name, const std::vector<int64_t>& dims, const float* data) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  initializer(name, dims, onnx::TensorProto::FLOAT)
      ->set_raw_data(reinterpret_cast<const char*>(data), size_t(n) * sizeof(float));
  return name;
}

std::string OnnxGraph::f32_scalar(const std::string& name, float value) { return f32(name, {}, &value); }

std::string OnnxGraph::i64(const std::string& name, const std::vector<int64_t>& values) {
  initializer(name, {int64_t(values.size())}, onnx::TensorProto::INT64)
      ->set_raw_data(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
  return name;
}

std::string OnnxGraph::boolean(const std::string& name, const std::vector<int64_t>& dims,
                               const std::vector<uint8_t>& values) {
  // ONNX stores a bool tensor's raw_data as one byte (0 or 1) per element.
  initializer(name, dims, onnx::TensorProto::BOOL)
      ->set_raw_data(reinterpret_cast<const char*>(values.data()), values.size());
  return name;
}

}  // namespace brisk::exporter

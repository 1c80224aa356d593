// A thin layer over the generated onnx::GraphProto (onnx.pb.h, made by protoc
// from ONNX's onnx.proto at build time): nodes whose single output carries the
// node's name, float32 initializers from host memory, and the small int64,
// float and bool constants a graph needs for shapes and masks. Names are
// checked to be unique, so a typo in the exporter cannot silently wire one
// value to two producers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "onnx.pb.h"

namespace brisk::exporter {

onnx::AttributeProto attr_int(const std::string& name, int64_t value);
onnx::AttributeProto attr_ints(const std::string& name, const std::vector<int64_t>& values);
onnx::AttributeProto attr_float(const std::string& name, float value);

// What a model's graph holds, once built.
struct GraphStats {
  int64_t nodes = 0;
  int64_t initializers = 0;
  int64_t parameters = 0;  // weight elements from the model (constants not counted)
};

// A tensor dimension of a graph input or output: a size, or a symbol.
struct Dim {
  int64_t value = 0;
  std::string symbol;
};

// Names and types a graph input or output (`v`), with a line for its readers.
void declare(onnx::ValueInfoProto* v, const std::string& name, int32_t elem_type, const std::vector<Dim>& dims,
             const std::string& doc);

class OnnxGraph {
 public:
  explicit OnnxGraph(onnx::GraphProto& graph) : g_(graph) {}

  // A node with one output, named `name` (the node gets the same name).
  std::string op(const std::string& op_type, const std::vector<std::string>& inputs, const std::string& name,
                 std::initializer_list<onnx::AttributeProto> attrs = {});
  // A node with `outputs.size()` outputs (Split); returns their names.
  std::vector<std::string> op_multi(const std::string& op_type, const std::vector<std::string>& inputs,
                                    const std::string& name, const std::vector<std::string>& outputs,
                                    std::initializer_list<onnx::AttributeProto> attrs = {});

  // Initializers. `data` is row-major host memory of prod(dims) elements,
  // stored as little-endian raw_data (brisk builds only for little-endian hosts).
  std::string f32(const std::string& name, const std::vector<int64_t>& dims, const float* data);
  std::string f32_scalar(const std::string& name, float value);
  std::string i64(const std::string& name, const std::vector<int64_t>& values);  // 1-D
  std::string boolean(const std::string& name, const std::vector<int64_t>& dims, const std::vector<uint8_t>& values);

  int64_t nodes() const { return g_.node_size(); }
  int64_t initializers() const { return g_.initializer_size(); }

 private:
  void claim(const std::string& name);
  onnx::TensorProto* initializer(const std::string& name, const std::vector<int64_t>& dims, int32_t dtype);

  onnx::GraphProto& g_;
  std::set<std::string> names_;
};

}  // namespace brisk::exporter

// Parameters, their gradients and optimizer state: the memory that outlives a
// step and sits outside the planned arena. A store is filled from a graph's
// param values (or a checkpoint) and bound to any executor built from a graph
// with the same parameter names, so train and eval graphs share weights.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "brisk/core/graph.h"

namespace brisk::core {

class Backend;

class ParameterStore {
 public:
  // Where the tensors live: host memory (nullptr, the default) or a device
  // backend's memory (set before the first adopt()). Host code never touches
  // device bytes directly: it goes through download()/upload().
  void set_backend(Backend* backend) { backend_ = backend; }
  bool on_device() const;
  struct Entry {
    Tensor value;
    Tensor grad;
    std::vector<Tensor> state;  // optimizer moments, created by the optimizer
  };

  // Creates (zero-filled) entries for every param of `g` that is missing and
  // checks the shapes of those that exist.
  void adopt(const Graph& g);
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  Entry& at(const std::string& name);
  const Entry& at(const std::string& name) const;
  const std::map<std::string, Entry>& entries() const { return entries_; }
  std::map<std::string, Entry>& entries() { return entries_; }

  void zero_grads();
  // A host copy of one of the store's tensors (the tensor itself when the
  // store is on the host), and a copy of host bytes into one.
  Tensor download(const Tensor& t) const;
  void upload(const Tensor& dst, const Tensor& host_src) const;
  // A new zero-filled tensor where the store's tensors live (optimizer state).
  Tensor make_zeros(const Shape& shape, DType dtype) const;
  size_t param_bytes() const;
  size_t grad_bytes() const;
  size_t state_bytes() const;
  int64_t num_params() const;

 private:
  std::map<std::string, Entry> entries_;
  Backend* backend_ = nullptr;
};

}  // namespace brisk::core

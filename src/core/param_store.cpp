// Parameter storage outside the arena (param_store.h).
#include "brisk/core/param_store.h"

#include <cstring>

#include "brisk/core/backend.h"
#include "brisk/core/error.h"

namespace brisk::core {

void ParameterStore::adopt(const Graph& g) {
  for (ValueId v : g.params()) {
    const Value& val = g.value(v);
    auto it = entries_.find(val.name);
    if (it != entries_.end()) {
      if (!(it->second.value.meta() == val.meta))
        throw ShapeError("parameter '" + val.name + "' is " + it->second.value.meta().str() + " in the store but " +
                         val.meta.str() + " in the graph");
      continue;
    }
    Entry e;
    e.value = make_zeros(val.meta.shape, val.meta.dtype);
    e.grad = make_zeros(val.meta.shape, val.meta.dtype);
    entries_.emplace(val.name, std::move(e));
  }
}

ParameterStore::Entry& ParameterStore::at(const std::string& name) {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw Error("parameter store: no parameter named '" + name + "'");
  return it->second;
}

const ParameterStore::Entry& ParameterStore::at(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw Error("parameter store: no parameter named '" + name + "'");
  return it->second;
}

bool ParameterStore::on_device() const { return backend_ && !backend_->device().is_host(); }

void ParameterStore::zero_grads() {
  for (auto& [name, e] : entries_) {
    if (on_device()) backend_->zero(e.grad.data(), e.grad.bytes());
    else std::memset(e.grad.data(), 0, e.grad.bytes());
  }
}

Tensor ParameterStore::make_zeros(const Shape& shape, DType dtype) const {
  if (!on_device()) return Tensor::zeros(shape, dtype);
  Tensor t = Tensor::empty(shape, dtype, backend_->allocator(), backend_->device());
  backend_->zero(t.data(), t.bytes());
  return t;
}

Tensor ParameterStore::download(const Tensor& t) const {
  if (!on_device()) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  backend_->copy_to_host(h.data(), t.data(), t.bytes());
  return h;
}

void ParameterStore::upload(const Tensor& dst, const Tensor& host_src) const {
  if (!(dst.meta() == host_src.meta()))
    throw ShapeError("parameter store: uploading " + host_src.meta().str() + " into " + dst.meta().str());
  if (!on_device()) {
    Tensor d = dst;
    d.copy_from(host_src);
    return;
  }
  backend_->copy_to_device(dst.data(), host_src.data(), dst.bytes());
}

size_t ParameterStore::param_bytes() const {
  size_t n = 0;
  for (const auto& [name, e] : entries_) n += e.value.bytes();
  return n;
}
size_t ParameterStore::grad_bytes() const {
  size_t n = 0;
  for (const auto& [name, e] : entries_) n += e.grad.bytes();
  return n;
}
size_t ParameterStore::state_bytes() const {
  size_t n = 0;
  for (const auto& [name, e] : entries_)
    for (const Tensor& s : e.state) n += s.bytes();
  return n;
}
int64_t ParameterStore::num_params() const {
  int64_t n = 0;
  for (const auto& [name, e] : entries_) n += e.value.numel();
  return n;
}

}  // namespace brisk::core

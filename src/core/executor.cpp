// Executor: everything that allocates happens in the constructor (executor.h).
#include "brisk/core/executor.h"

#include <chrono>

#include "brisk/core/error.h"
#include "brisk/core/param_store.h"

namespace brisk::core {

Executor::Executor(const Graph& g, Backend& backend, SharedArena* shared)
    : graph_(g), backend_(backend), plan_(plan_memory(g)), shared_(shared) {
  ctx_ = backend_.context();
  const size_t nv = g.num_values();
  if (shared_) arena_ = shared_->attach(this, plan_.report.arena);
  else if (plan_.report.arena > 0) arena_ = backend_.allocator().allocate(plan_.report.arena);
  value_data_.assign(nv, nullptr);
  value_slots_.resize(nv);
  bound_.assign(nv, false);
  for (size_t v = 0; v < nv; ++v)
    if (!plan_.is_external(ValueId(v))) value_data_[v] = static_cast<char*>(arena_) + plan_.offset[v];

  const auto& nodes = g.nodes();
  steps_.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    Step s{};
    s.fn = backend_.kernel_for(n.op, kernel_dtype(g, n));
    s.params = &n.params;
    s.op = n.op;
    s.in_begin = uint32_t(views_.size());
    s.in_count = uint32_t(n.inputs.size());
    for (ValueId v : n.inputs) {
      value_slots_[size_t(plan_.root[size_t(v)])].push_back(uint32_t(views_.size()));
      views_.push_back({value_data_[size_t(v)], g.meta(v)});
      view_value_.push_back(v);
    }
    s.out_begin = uint32_t(views_.size());
    s.out_count = uint32_t(n.outputs.size());
    for (ValueId v : n.outputs) {
      value_slots_[size_t(plan_.root[size_t(v)])].push_back(uint32_t(views_.size()));
      views_.push_back({value_data_[size_t(v)], g.meta(v)});
      view_value_.push_back(v);
    }
    if (plan_.workspace_size[i] > 0) {
      s.workspace = static_cast<char*>(arena_) + plan_.workspace_offset[i];
      s.workspace_bytes = plan_.workspace_size[i];
    }
    steps_.push_back(s);
  }
}

Executor::~Executor() {
  drop_graph();
  if (shared_) shared_->detach(this);
  else if (arena_) backend_.allocator().deallocate(arena_, plan_.report.arena);
}

void Executor::rebase_arena(void* base) {
  arena_ = base;
  for (size_t v = 0; v < value_data_.size(); ++v)
    if (!plan_.is_external(ValueId(v))) value_data_[v] = static_cast<char*>(arena_) + plan_.offset[v];
  for (size_t i = 0; i < views_.size(); ++i) views_[i].data = value_data_[size_t(view_value_[i])];
  for (size_t i = 0; i < steps_.size(); ++i)
    if (plan_.workspace_size[i] > 0) steps_[i].workspace = static_cast<char*>(arena_) + plan_.workspace_offset[i];
  drop_graph();
}

SharedArena::~SharedArena() {
  if (base_) allocator_.deallocate(base_, bytes_);
}

void* SharedArena::attach(Executor* e, size_t bytes) {
  if (bytes > bytes_) {
    void* grown = allocator_.allocate(bytes);
    for (Executor* u : users_) u->rebase_arena(grown);
    if (base_) allocator_.deallocate(base_, bytes_);
    base_ = grown;
    bytes_ = bytes;
  }
  users_.push_back(e);
  return base_;
}

void SharedArena::detach(Executor* e) { std::erase(users_, e); }

void Executor::bind(ValueId v, void* data) {
  const ValueId r = plan_.root.at(size_t(v));
  if (!plan_.is_external(r))
    throw Error("executor: value '" + graph_.value(v).name + "' is planned in the arena and cannot be bound");
  for (size_t u = 0; u < value_data_.size(); ++u)
    if (plan_.root[u] == r) value_data_[u] = data;
  for (uint32_t slot : value_slots_[size_t(r)]) views_[slot].data = data;
  bound_[size_t(r)] = true;
  drop_graph();  // the recording holds the old addresses
}

void Executor::set_graph_capture(bool on) {
  graph_capture_ = on;
  if (!on) drop_graph();
}

void Executor::drop_graph() {
  if (step_graph_) backend_.graph_destroy(step_graph_);
  step_graph_ = nullptr;
  runs_ = 0;
}

void Executor::bind(const ParameterStore& store) {
  for (size_t v = 0; v < graph_.num_values(); ++v) {
    const Value& val = graph_.value(ValueId(v));
    if (val.role == ValueRole::param) {
      bind(ValueId(v), store.at(val.name).value.data());
    } else if (val.role == ValueRole::grad && val.name.rfind("grad:", 0) == 0) {
      bind(ValueId(v), store.at(val.name.substr(5)).grad.data());
    }
  }
}

void Executor::set_node_hooks(const std::vector<size_t>& nodes, std::function<void(size_t)> hook) {
  hook_index_.assign(steps_.size(), -1);
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (nodes[k] >= steps_.size())
      throw Error("executor: node hook after node " + std::to_string(nodes[k]) + " of " + std::to_string(steps_.size()));
    hook_index_[nodes[k]] = int32_t(k);
  }
  hook_ = std::move(hook);
}

void Executor::arm_node_hooks(bool on) {
  if (on && !hook_) throw Error("executor: arm_node_hooks without set_node_hooks");
  hooks_armed_ = on;
}

void Executor::run() {
  for (size_t v = 0; v < bound_.size(); ++v)
    if (plan_.root[v] == ValueId(v) && plan_.is_external(ValueId(v)) && !bound_[v] && !value_slots_[v].empty())
      throw Error("executor: external value '" + graph_.value(ValueId(v)).name + "' was never bound");
  const bool use_graph = graph_capture_ && !profiling_ && !trace_ && !hooks_armed_ && backend_.supports_graphs();
  if (use_graph && step_graph_) {
    backend_.graph_launch(step_graph_);
    return;
  }
  if (use_graph && runs_ >= 1) {
    backend_.capture_begin();
    try {
      run_steps();
    } catch (...) {
      try {  // end the capture before reporting the kernel's error
        backend_.graph_destroy(backend_.capture_end());
      } catch (...) {
      }
      throw;
    }
    step_graph_ = backend_.capture_end();
    backend_.graph_launch(step_graph_);
    return;
  }
  run_steps();
  ++runs_;
}

void Executor::run_steps() {
  const bool hooks = hooks_armed_;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    KernelCall call;
    call.params = s.params;
    call.inputs = std::span<const TensorView>(views_.data() + s.in_begin, s.in_count);
    call.outputs = std::span<const TensorView>(views_.data() + s.out_begin, s.out_count);
    call.workspace = s.workspace;
    call.workspace_bytes = s.workspace_bytes;
    call.ctx = &ctx_;
    if (!profiling_ && !trace_) {
      s.fn(call);
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      s.fn(call);
      backend_.synchronize();
      const auto t1 = std::chrono::steady_clock::now();
      if (profiling_) {
        OpTime& t = op_times_[size_t(s.op)];
        t.seconds += std::chrono::duration<double>(t1 - t0).count();
        ++t.calls;
      }
      if (trace_)
        trace_->push_back({uint32_t(i), s.op, std::chrono::duration<double>(t0.time_since_epoch()).count(),
                           std::chrono::duration<double>(t1.time_since_epoch()).count()});
    }
    if (hooks && hook_index_[i] >= 0) hook_(size_t(hook_index_[i]));
  }
}

void* Executor::data(ValueId v) const { return value_data_.at(size_t(v)); }

TensorView Executor::view(ValueId v) const { return {data(v), graph_.meta(v)}; }

void Executor::check_write(ValueId v, size_t bytes) const {
  if (bytes != graph_.meta(v).bytes())
    throw Error("executor: writing " + std::to_string(bytes) + " bytes into value '" + graph_.value(v).name +
                "' of " + graph_.meta(v).str());
}

void Executor::write(ValueId v, const void* host, size_t bytes) {
  check_write(v, bytes);
  backend_.copy_to_device(data(v), host, bytes);
}

void Executor::write_async(ValueId v, const void* host, size_t bytes) {
  check_write(v, bytes);
  backend_.copy_to_device_async(data(v), host, bytes);
}

void Executor::read(ValueId v, void* host, size_t bytes) const {
  if (bytes != graph_.meta(v).bytes())
    throw Error("executor: reading " + std::to_string(bytes) + " bytes from value of " + graph_.meta(v).str());
  backend_.copy_to_host(host, data(v), bytes);
}

double Executor::read_scalar(ValueId v) const {
  alignas(8) unsigned char buf[8] = {};
  const DType t = graph_.meta(v).dtype;
  backend_.copy_to_host(buf, data(v), dtype_size(t));
  return load_as_double(buf, t, 0);
}

}  // namespace brisk::core

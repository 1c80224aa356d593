// Runs a planned graph on a backend. Construction does all the work that
// allocates: the arena, the kernel lookups, the argument lists. run() then
// only walks nodes and calls kernels, so a training step allocates nothing in
// the steady state and the same sequence can be captured as a CUDA graph.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "brisk/core/backend.h"
#include "brisk/core/planner.h"

namespace brisk::core {

class ParameterStore;
class SharedArena;

class Executor {
 public:
  // With `shared`, the arena is a SharedArena's (see below) instead of one
  // of its own.
  Executor(const Graph& g, Backend& backend, SharedArena* shared = nullptr);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Externals (params, grads, state) must be bound before run().
  void bind(ValueId v, void* data);
  void bind(const ParameterStore& store);
  void run();

  // The planned buffer of a value (inputs to fill, outputs to read).
  void* data(ValueId v) const;
  TensorView view(ValueId v) const;
  // Host copies, through the backend (device-agnostic).
  void write(ValueId v, const void* host, size_t bytes);
  // Backend::copy_to_device_async: ordered before the next run(), not waited for.
  void write_async(ValueId v, const void* host, size_t bytes);
  void read(ValueId v, void* host, size_t bytes) const;
  double read_scalar(ValueId v) const;

  const Graph& graph() const { return graph_; }
  const MemoryPlan& plan() const { return plan_; }
  Backend& backend() { return backend_; }
  void set_num_threads(int n) { ctx_.num_threads = n; }
  // Whole-step graphs: on a backend that supports them (CUDA), the first
  // run() executes the kernels one by one (warming every per-shape cache),
  // the second records them as one graph and every later run() replays it
  // with a single launch. Binding new memory drops the recording. On by
  // default; profiling runs kernel by kernel.
  void set_graph_capture(bool on);
  bool graph_captured() const { return step_graph_ != nullptr; }
  // Per-op wall time, summed over runs while profiling is on (the per-op
  // breakdown of `brisk bench` and of the trainer's --profile).
  void set_profiling(bool on) { profiling_ = on; }
  struct OpTime {
    double seconds = 0;
    int64_t calls = 0;
  };
  using OpTimes = std::array<OpTime, kNumOps>;
  const OpTimes& op_times() const { return op_times_; }
  void reset_op_times() { op_times_ = {}; }
  // A timeline of kernels (the trainer's --trace): while a sink is set, run()
  // goes kernel by kernel like profiling (synchronizing after each, never a
  // recorded graph) and appends one span per kernel: the node's index in
  // graph().nodes(), its op, and start and end in seconds on steady_clock
  // (monitor::now_seconds()'s clock). nullptr stops recording.
  struct KernelSpan {
    uint32_t node;
    OpKind op;
    double start_s, end_s;
  };
  void set_trace(std::vector<KernelSpan>* sink) { trace_ = sink; }

  // Host code between kernels: hook(k) runs right after node nodes[k] (data
  // parallelism starts a gradient bucket's all-reduce there while backward
  // goes on). Hooks run only while armed; an armed step is never recorded
  // as a CUDA graph (the hook is host code), an unarmed one may be.
  void set_node_hooks(const std::vector<size_t>& nodes, std::function<void(size_t)> hook);
  void arm_node_hooks(bool on);

  // The planned arena itself (tests look at which bytes kernels touched).
  void* arena_data() const { return arena_; }
  size_t arena_bytes() const { return plan_.report.arena; }

 private:
  friend class SharedArena;
  // Moves every arena-planned value and workspace to `base` (a SharedArena
  // that grew); the recorded step graph, holding the old addresses, is dropped.
  void rebase_arena(void* base);
  std::vector<ValueId> view_value_;  // per slot of views_: the value it shows
  struct Step {
    KernelFn fn;
    const OpParams* params;
    OpKind op;
    uint32_t in_begin, in_count, out_begin, out_count;
    void* workspace;
    size_t workspace_bytes;
  };
  const Graph& graph_;
  Backend& backend_;
  MemoryPlan plan_;
  SharedArena* shared_ = nullptr;  // after plan_: the constructor initialises them in this order
  void* arena_ = nullptr;
  ExecContext ctx_;
  std::vector<Step> steps_;
  std::vector<TensorView> views_;  // inputs/outputs of all steps, flattened
  std::vector<void*> value_data_;  // per value
  // For each value: the slots in views_ that point at it (patched by bind()).
  std::vector<std::vector<uint32_t>> value_slots_;
  std::vector<bool> bound_;
  void run_steps();
  void check_write(ValueId v, size_t bytes) const;  // throws naming the value
  void drop_graph();
  bool profiling_ = false;
  std::vector<KernelSpan>* trace_ = nullptr;
  bool graph_capture_ = true;
  int64_t runs_ = 0;
  void* step_graph_ = nullptr;  // the backend's recorded step, or null
  OpTimes op_times_{};
  std::vector<int32_t> hook_index_;  // per step: the hook's k, or -1
  std::function<void(size_t)> hook_;
  bool hooks_armed_ = false;
};

// One arena for several executors of which only one runs at a time (a
// model's programs of one kind, one per batch width): it is as large as the
// largest of their plans, not their sum. Nothing in it survives from one
// executor's run to another's, so every input must be written again before
// an executor runs after another (or has been attached). Attaching a plan
// larger than the arena grows it and moves every attached executor there.
// Destroy the executors first.
class SharedArena {
 public:
  explicit SharedArena(Allocator& allocator) : allocator_(allocator) {}
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  void* attach(Executor* e, size_t bytes);
  void detach(Executor* e);
  size_t bytes() const { return bytes_; }

 private:
  Allocator& allocator_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<Executor*> users_;
};

// sum += times, op by op (a model whose programs differ by shape sums them).
inline void add_op_times(Executor::OpTimes& sum, const Executor::OpTimes& times) {
  for (size_t op = 0; op < sum.size(); ++op) {
    sum[op].seconds += times[op].seconds;
    sum[op].calls += times[op].calls;
  }
}

}  // namespace brisk::core

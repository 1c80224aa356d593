// Data parallelism over several processes (docs/distributed.md).
//
// Every rank holds the whole model and runs the same step on its slice of
// the global batch. Gradients live in one flat buffer, grouped into buckets
// (dist.bucket_mb) in the order backward finishes them; the train
// executor's hook hands a bucket to the communication thread the moment its
// last gradient is written, so its all-reduce runs while backward goes on.
// The backward seed carries 1 / world_size, so the summed gradients are
// already the average: no pass over them afterwards.
//
// ZeRO-1 (dist.zero = 1): buckets are reduce-scattered instead; rank r owns
// chunk r of every bucket, keeps AdamW moments for that chunk only, updates
// its part of the weights, and the weights are all-gathered bucket by bucket.
// Optimizer state per rank shrinks by the world size.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "brisk/core/backend.h"
#include "brisk/core/communicator.h"
#include "brisk/core/executor.h"
#include "brisk/core/param_store.h"
#include "brisk/dist/comm_thread.h"
#include "brisk/dist/dist_config.h"
#include "brisk/optim/optimizer.h"

namespace brisk::dist {

// The flat layout: parameters in the order backward completes their
// gradients, each at a 64-byte aligned offset, cut into buckets whose
// lengths are multiples of world_size * 16 floats (equal, aligned chunks).
struct FlatLayout {
  struct Param {
    std::string name;
    int64_t offset = 0, numel = 0;
    int bucket = 0;
  };
  struct Bucket {
    int64_t offset = 0, numel = 0;  // numel: padded, a multiple of world * 16
    std::vector<int> params;        // indices into params
  };
  std::vector<Param> params;
  std::vector<Bucket> buckets;
  int64_t total = 0;
  // `order`: parameter names, first-finished gradient first, with sizes.
  static FlatLayout make(const std::vector<std::pair<std::string, int64_t>>& order, int64_t bucket_floats, int world);
  // The layout the trainer uses for `params` and the train graph's gradient
  // order (parameters without a gradient last), buckets of bucket_mb MiB.
  static FlatLayout for_graph(const core::ParameterStore& params, const core::Graph& train_graph, double bucket_mb,
                              int world);
  // The pieces of the parameters inside chunk `rank` of every bucket.
  std::vector<optim::AdamW::Piece> shard_pieces(int rank, int world) const;
};

// Parameter names in the order `train_graph`'s backward completes their
// gradients (the order of its accumulate nodes).
std::vector<std::string> gradient_order(const core::Graph& train_graph);

class DataParallel {
 public:
  // `params` must not be bound to any executor yet: its values and grads are
  // moved into the flat buffers (values copied), in the order `train_graph`
  // finishes them.
  DataParallel(core::Communicator& comm, const DistConfig& config, core::ParameterStore& params,
               core::Backend& backend, const core::Graph& train_graph);
  ~DataParallel();

  int rank() const { return comm_.rank(); }
  int world() const { return comm_.size(); }
  const DistConfig& config() const { return config_; }
  const FlatLayout& layout() const { return layout_; }
  CommThread& comm_thread() { return *thread_; }

  // The train executor (built from the same graph): its accumulate nodes
  // start the buckets.
  void attach(core::Executor& train_exec);
  // Before each micro-step: only the last one of a step communicates.
  void arm(bool last_micro_step);
  // After the last micro-step's backward: waits for every bucket.
  void finish_gradients(int64_t step);
  // Rank 0's weights to every rank (after initialisation or a resume).
  void broadcast_weights();
  // ZeRO-1: the optimizer updates this rank's chunks only.
  void shard_optimizer(optim::AdamW& adamw);
  // ZeRO-1, after the update: every rank gets every updated weight.
  void gather_weights();
  // ZeRO-1, for a checkpoint: the AdamW moments gathered a slab at a time
  // (collective: every rank calls it), so no rank ever holds the whole
  // state, only a slab of every rank's chunk: of each moment, a gradient
  // bucket's worth (dist.bucket_mb) and at most kMomentSlabFloats values in
  // all. On the rank that writes, `place` receives every
  // run of values: the parameter, the moment (0 exp_avg, 1 exp_avg_sq),
  // its first element and the values (host memory); the others pass nullptr.
  using MomentPlace =
      std::function<void(const std::string& param, int moment, int64_t first, const float* values, int64_t count)>;
  static constexpr int64_t kMomentSlabFloats = int64_t(1) << 21;
  void stream_moments(const optim::AdamW& adamw, const MomentPlace* place);
  // Values of each moment that one all-gather of stream_moments holds (all ranks' slabs together).
  static int64_t moment_gather_floats(const DistConfig& config);

  // Host reductions through the communication thread.
  double sum(double v);
  double max(double v);
  void sum(double* v, size_t n);

  // This step's communication: seconds the collectives took and seconds the
  // trainer waited for them (the rest ran hidden behind backward).
  double comm_seconds() const { return thread_->busy_seconds(); }
  double exposed_seconds() const { return thread_->waited_seconds(); }
  void reset_times() { thread_->reset_times(); }
  // Bytes one rank sends and receives per step for the gradients (ring algorithms).
  double wire_bytes_per_step() const;

 private:
  void bucket_ready(int b);
  void after_node(size_t k);

  core::Communicator& comm_;
  const DistConfig config_;
  core::ParameterStore& params_;
  core::Backend& backend_;
  FlatLayout layout_;
  core::Tensor flat_values_, flat_grads_;
  std::unique_ptr<CommThread> thread_;
  // Per hooked node: the parameters whose gradient it completes.
  std::vector<std::vector<int>> node_params_;
  std::vector<int> bucket_left_;  // gradients still to come per bucket, this step
  bool armed_ = false;
  bool sharded_ = false;
 public:
  bool sharded() const { return sharded_; }
 private:
  core::Executor* exec_ = nullptr;
};

}  // namespace brisk::dist

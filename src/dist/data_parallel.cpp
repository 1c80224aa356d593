// Data parallelism: flat gradient buckets, the backward hook, ZeRO-1
// (data_parallel.h).
#include "brisk/dist/data_parallel.h"

#include <algorithm>
#include <exception>
#include <map>

#include "brisk/core/error.h"

namespace brisk::dist {

namespace {

constexpr int64_t kAlign = 16;  // floats: 64 bytes, a cache line and an AVX-512 register

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

void copy(core::Backend& backend, const core::Tensor& src, const core::Tensor& dst) {
  const core::TensorView in = src.as_view(), out = dst.as_view();
  core::run_op(backend, core::OpKind::copy, std::span<const core::TensorView>(&in, 1),
               std::span<const core::TensorView>(&out, 1));
}

// Each parameter gradient's completing accumulate: (node index, parameter
// name), in node order. A parameter used more than once (a tied embedding)
// gets a chain of writes into its "grad:" external, each reading the
// previous one's result (core::backward): accumulates, and a forward op that
// sums its piece in place (ops::classifier_train's dw_into); the chain's last
// node finishes the gradient, and only it may release the parameter's bucket.
std::vector<std::pair<size_t, std::string>> completing_accumulates(const core::Graph& g) {
  std::map<std::string, size_t> last;
  std::vector<std::string> name_of(g.num_values());  // in-place outputs: the grad they write
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const core::Node& n = g.nodes()[i];
    const core::OpDef& def = core::op_def(n.op);
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      const int a = def.alias_of(o, n.inputs.size());
      if (a < 0) continue;
      const core::ValueId dst = n.inputs[size_t(a)];
      const std::string& ext = name_of[size_t(dst)].empty() ? g.value(dst).name : name_of[size_t(dst)];
      if (ext.rfind("grad:", 0) != 0) continue;
      name_of[size_t(n.outputs[o])] = ext;
      last[ext.substr(5)] = i;
    }
  }
  std::vector<std::pair<size_t, std::string>> out;
  for (const auto& [name, i] : last) out.emplace_back(i, name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

FlatLayout FlatLayout::make(const std::vector<std::pair<std::string, int64_t>>& order, int64_t bucket_floats,
                            int world) {
  FlatLayout l;
  const int64_t chunk_align = kAlign * std::max(1, world);
  int64_t at = 0;
  Bucket open;
  open.offset = 0;
  auto close = [&] {
    if (open.params.empty()) return;
    open.numel = round_up(at - open.offset, chunk_align);
    at = open.offset + open.numel;
    l.buckets.push_back(open);
    open = Bucket{};
    open.offset = at;
  };
  for (const auto& [name, numel] : order) {
    Param p{name, at, numel, int(l.buckets.size())};
    open.params.push_back(int(l.params.size()));
    l.params.push_back(p);
    at = round_up(at + numel, kAlign);
    if (at - open.offset >= bucket_floats) close();
  }
  close();
  l.total = at;
  return l;
}

FlatLayout FlatLayout::for_graph(const core::ParameterStore& params, const core::Graph& train_graph, double bucket_mb,
                                 int world) {
  std::vector<std::pair<std::string, int64_t>> order;
  std::map<std::string, bool> placed;
  for (const std::string& name : gradient_order(train_graph)) {
    if (placed[name]) continue;
    placed[name] = true;
    order.emplace_back(name, params.at(name).value.numel());
  }
  for (const auto& [name, e] : params.entries())  // parameters without a gradient go last
    if (!placed[name]) order.emplace_back(name, e.value.numel());
  return make(order, std::max<int64_t>(kAlign, int64_t(bucket_mb * 1024 * 1024 / 4)), world);
}

std::vector<optim::AdamW::Piece> FlatLayout::shard_pieces(int rank, int world) const {
  std::vector<optim::AdamW::Piece> pieces;
  for (const Bucket& b : buckets) {
    const int64_t chunk = b.numel / world, lo = b.offset + chunk * rank, hi = lo + chunk;
    for (int pi : b.params) {
      const Param& p = params[size_t(pi)];
      const int64_t from = std::max(lo, p.offset), to = std::min(hi, p.offset + p.numel);
      if (from < to) pieces.push_back({p.name, from - p.offset, to - from});
    }
  }
  return pieces;
}

std::vector<std::string> gradient_order(const core::Graph& g) {
  std::vector<std::string> names;
  for (auto& [node, name] : completing_accumulates(g)) names.push_back(std::move(name));
  return names;
}

DataParallel::DataParallel(core::Communicator& comm, const DistConfig& config, core::ParameterStore& params,
                           core::Backend& backend, const core::Graph& train_graph)
    : comm_(comm), config_(config), params_(params), backend_(backend) {
  if (config_.zero != 0 && config_.zero != 1)
    throw core::ConfigError("dist.zero must be 0 or 1, got " + std::to_string(config_.zero));
  layout_ = FlatLayout::for_graph(params_, train_graph, config_.bucket_mb, world());

  flat_values_ = params_.make_zeros(core::Shape{layout_.total}, core::DType::f32);
  flat_grads_ = params_.make_zeros(core::Shape{layout_.total}, core::DType::f32);
  for (const FlatLayout::Param& p : layout_.params) {
    core::ParameterStore::Entry& e = params_.at(p.name);
    if (e.value.dtype() != core::DType::f32)
      throw core::Error("data parallel: parameter '" + p.name + "' is " + e.value.meta().str() + ", not f32");
    const core::Tensor value = flat_values_.slice(p.offset, e.value.shape());
    copy(backend_, e.value, value);
    e.value = value;
    e.grad = flat_grads_.slice(p.offset, e.value.shape());
  }
  thread_ = std::make_unique<CommThread>(rank(), config_.timeout_s);
}

DataParallel::~DataParallel() = default;

void DataParallel::attach(core::Executor& exec) {
  std::map<std::string, int> index;
  for (size_t i = 0; i < layout_.params.size(); ++i) index[layout_.params[i].name] = int(i);
  std::vector<size_t> nodes;
  node_params_.clear();
  const core::Graph& g = exec.graph();
  for (const auto& [i, name] : completing_accumulates(g)) {
    auto it = index.find(name);
    if (it == index.end())
      throw core::Error("data parallel: the train graph has a gradient for unknown 'grad:" + name + "'");
    // One node may complete several gradients (linear_param_grad: a
    // Linear's weight and bias); completing_accumulates lists them in node order.
    if (!nodes.empty() && nodes.back() == i) {
      node_params_.back().push_back(it->second);
      continue;
    }
    nodes.push_back(i);
    node_params_.push_back({it->second});
  }
  bucket_left_.assign(layout_.buckets.size(), 0);
  exec.set_node_hooks(nodes, [this](size_t k) { after_node(k); });
  exec_ = &exec;
}

void DataParallel::arm(bool last_micro_step) {
  armed_ = last_micro_step;
  if (armed_)
    for (size_t b = 0; b < layout_.buckets.size(); ++b) bucket_left_[b] = int(layout_.buckets[b].params.size());
  exec_->arm_node_hooks(armed_);
}

void DataParallel::after_node(size_t k) {
  for (int p : node_params_[k]) {
    const int b = layout_.params[size_t(p)].bucket;
    if (--bucket_left_[size_t(b)] == 0) bucket_ready(b);
  }
}

void DataParallel::bucket_ready(int b) {
  // Kernels on a GPU are queued, not done: the gradients must have landed
  // before another thread hands them to the communicator.
  if (!backend_.device().is_host()) backend_.synchronize();
  const FlatLayout::Bucket& bucket = layout_.buckets[size_t(b)];
  float* data = flat_grads_.data_as<float>() + bucket.offset;
  const size_t n = size_t(bucket.numel);
  if (config_.zero == 0)
    thread_->submit([this, data, n] { comm_.allreduce_sum(data, n); }, "the all-reduce of a gradient bucket");
  else
    thread_->submit([this, data, n] { comm_.reduce_scatter_sum(data, n / size_t(world())); },
                    "the reduce-scatter of a gradient bucket");
}

void DataParallel::finish_gradients(int64_t step) {
  thread_->set_step(step);
  thread_->wait();
  for (size_t b = 0; b < bucket_left_.size(); ++b)
    if (armed_ && bucket_left_[b] != 0)
      throw core::Error("data parallel: gradient bucket " + std::to_string(b) + " still waits for " +
                        std::to_string(bucket_left_[b]) + " gradients after backward");
  armed_ = false;
  exec_->arm_node_hooks(false);
}

void DataParallel::shard_optimizer(optim::AdamW& adamw) {
  if (config_.zero != 1) return;
  adamw.shard(layout_.shard_pieces(rank(), world()), [this](double x) { return sum(x); });
  sharded_ = true;
}

void DataParallel::gather_weights() {
  if (!sharded_) return;
  if (!backend_.device().is_host()) backend_.synchronize();
  for (const FlatLayout::Bucket& b : layout_.buckets) {
    float* data = flat_values_.data_as<float>() + b.offset;
    const size_t chunk = size_t(b.numel / world());
    thread_->submit([this, data, chunk] { comm_.allgather(data, chunk); }, "the all-gather of updated weights");
  }
  thread_->wait();
}

int64_t DataParallel::moment_gather_floats(const DistConfig& config) {
  return std::min(kMomentSlabFloats, int64_t(config.bucket_mb * 1024 * 1024 / 4));
}

void DataParallel::stream_moments(const optim::AdamW& adamw, const MomentPlace* place) {
  if (!sharded_) throw core::Error("data parallel: stream_moments needs the ZeRO-1 optimizer (dist.zero = 1)");
  const int64_t W = world(), me = rank();
  // Where this rank's pieces lie: flat position and position in its shard, in flat order.
  struct Run {
    int64_t flat, shard, count;
  };
  std::map<std::string, int64_t> param_offset;
  for (const FlatLayout::Param& p : layout_.params) param_offset[p.name] = p.offset;
  std::vector<Run> runs;
  int64_t at = 0;
  for (const optim::AdamW::Piece& piece : layout_.shard_pieces(rank(), world())) {
    runs.push_back({param_offset[piece.name] + piece.offset, at, piece.count});
    at += piece.count;
  }
  // Slabs of each rank's chunk: W of them make one all-gather of at most a
  // gradient bucket (dist.bucket_mb) and at most kMomentSlabFloats.
  int64_t widest = 0;
  for (const FlatLayout::Bucket& b : layout_.buckets) widest = std::max(widest, b.numel / W);
  const int64_t slab = std::min(widest, std::max<int64_t>(16, moment_gather_floats(config_) / W / 16 * 16));
  const core::Tensor moments[2] = {adamw.shard_exp_avg(), adamw.shard_exp_avg_sq()};
  core::Tensor bufs[2] = {params_.make_zeros(core::Shape{W * slab}, core::DType::f32),
                          params_.make_zeros(core::Shape{W * slab}, core::DType::f32)};
  const bool host = backend_.device().is_host();
  std::exception_ptr failed;
  size_t run = 0;  // the first run not wholly before the current slab
  for (const FlatLayout::Bucket& b : layout_.buckets) {
    const int64_t chunk = b.numel / W;
    for (int64_t s0 = 0; s0 < chunk; s0 += slab) {
      const int64_t len = std::min(slab, chunk - s0);
      const int64_t lo = b.offset + me * chunk + s0, hi = lo + len;  // this rank's slab, flat
      while (run < runs.size() && runs[run].flat + runs[run].count <= lo) ++run;
      for (size_t i = run; i < runs.size() && runs[i].flat < hi; ++i) {
        const int64_t from = std::max(lo, runs[i].flat), to = std::min(hi, runs[i].flat + runs[i].count);
        for (int k = 0; k < 2; ++k)
          copy(backend_, moments[k].slice(runs[i].shard + (from - runs[i].flat), {to - from}),
               bufs[k].slice(me * len + (from - lo), {to - from}));
      }
      if (!host) backend_.synchronize();
      for (int k = 0; k < 2; ++k) {
        float* data = bufs[k].data_as<float>();
        thread_->submit([this, data, len] { comm_.allgather(data, size_t(len)); }, "the all-gather of AdamW moments");
      }
      thread_->wait();
      if (!place || failed) continue;
      // Block q of the slab is chunk q's [s0, s0 + len) of this bucket: hand
      // out the parameters' runs in it (alignment gaps and padding hold none).
      for (int k = 0; k < 2; ++k) {
        const core::Tensor got = host ? bufs[k] : params_.download(bufs[k].slice(0, {W * len}));
        const float* values = got.data_as<float>();
        try {
          for (int64_t q = 0; q < W; ++q) {
            const int64_t block = b.offset + q * chunk + s0;
            for (int pi : b.params) {
              const FlatLayout::Param& p = layout_.params[size_t(pi)];
              const int64_t from = std::max(block, p.offset), to = std::min(block + len, p.offset + p.numel);
              if (from < to) (*place)(p.name, k, from - p.offset, values + q * len + (from - block), to - from);
            }
          }
        } catch (...) {
          // The writer failed (a full disk, say): this rank still takes its
          // part in every remaining all-gather, so the others finish the
          // same collectives, and the error surfaces after the last one.
          failed = std::current_exception();
          break;
        }
      }
    }
  }
  if (failed) std::rethrow_exception(failed);
}

void DataParallel::broadcast_weights() {
  if (!backend_.device().is_host()) return;  // device weights: every rank initialised or loaded the same ones
  float* data = flat_values_.data_as<float>();
  const size_t bytes = size_t(layout_.total) * sizeof(float);
  thread_->run([this, data, bytes] { comm_.broadcast_host(data, bytes, 0); }, "the broadcast of rank 0's weights");
}

double DataParallel::sum(double v) {
  sum(&v, 1);
  return v;
}

void DataParallel::sum(double* v, size_t n) {
  thread_->run([this, v, n] { comm_.allreduce_host(v, n, core::Communicator::Reduce::sum); }, "a sum over ranks");
}

double DataParallel::max(double v) {
  thread_->run([this, &v] { comm_.allreduce_host(&v, 1, core::Communicator::Reduce::max); }, "a max over ranks");
  return v;
}

double DataParallel::wire_bytes_per_step() const {
  const double w = world();
  return 2.0 * (w - 1) / w * double(layout_.total) * sizeof(float);
}

}  // namespace brisk::dist

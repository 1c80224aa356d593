// Proves that a training step in the steady state allocates no buffers: this
// binary replaces the global allocation functions (operator new/delete and the
// C malloc family) with counting versions, builds and runs a GPT-block
// training step twice to warm up, then counts allocations over further steps.
// The same count covers a whole optimizer step as `brisk train` runs it
// (train::Trainer: loader hand-off from worker threads, gradient
// accumulation, grad-norm and AdamW, the progress line, the metrics row).
//
// With OpenBLAS products the count is exactly zero. oneDNN's matmul (the
// fp32 path on AVX-512 machines, bf16-native) builds a few small bookkeeping
// objects per call inside the library (its argument map and memory handles),
// which no public API avoids, and its jit gemm (the small per-head attention
// products) mallocs its packing buffers per call (74 KiB here). There the
// test bounds them instead: no allocation over 256 KiB, so no activation,
// arena, scratchpad or primitive is ever made in the steady state.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>

#include "brisk/core/executor.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/data/shards.h"
#include "brisk/models/encoder.h"
#include "brisk/train/trainer.h"
#include "test_corpus.h"
#include "test_models.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
std::atomic<size_t> g_largest{0};
inline void note(size_t n = 0) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  size_t cur = g_largest.load(std::memory_order_relaxed);
  while (n > cur && !g_largest.compare_exchange_weak(cur, n, std::memory_order_relaxed)) {
  }
}
}  // namespace

extern "C" {
void* malloc(size_t n) { note(n); return __libc_malloc(n); }
void* calloc(size_t a, size_t b) { note(a * b); return __libc_calloc(a, b); }
void* realloc(void* p, size_t n) { note(n); return __libc_realloc(p, n); }
void free(void* p) { __libc_free(p); }
void* aligned_alloc(size_t align, size_t n) { note(n); return __libc_memalign(align, n); }
void* memalign(size_t align, size_t n) { note(n); return __libc_memalign(align, n); }
int posix_memalign(void** out, size_t align, size_t n) {
  note(n);
  *out = __libc_memalign(align, n);
  return *out ? 0 : ENOMEM;
}
}

void* operator new(size_t n) {
  note(n);
  if (void* p = __libc_malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, std::align_val_t a) {
  note(n);
  if (void* p = __libc_memalign(size_t(a), n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { __libc_free(p); }
void operator delete[](void* p) noexcept { __libc_free(p); }
void operator delete(void* p, size_t) noexcept { __libc_free(p); }
void operator delete[](void* p, size_t) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { __libc_free(p); }

using namespace brisk;

TEST(NoAllocation, CountingWorks) {
  g_allocations = 0;
  g_counting = true;
  void* volatile p = std::malloc(32);
  int* volatile q = new int(3);
  g_counting = false;
  std::free(p);
  delete q;
  EXPECT_EQ(g_allocations.load(), 2);
}

struct SteadyState {
  long allocations;
  size_t largest;
  bool loss_finite;
};

// Builds a GPT block's training step on a fresh backend, warms it up, then
// counts what five further steps allocate.
SteadyState steady_state_allocations() {
  core::Graph g;
  testing_models::BlockConfig c;
  c.batch = 4; c.seq = 32; c.vocab = 128; c.embd = 64; c.heads = 4;
  auto b = testing_models::build_gpt_block(g, c);
  core::backward(g, b.loss);
  core::ParameterStore store;
  store.adopt(g);
  testing_models::init_params(store, 3);
  cpu::CpuBackend backend(2);
  core::Executor ex(g, backend);
  ex.bind(store);
  auto ids = core::Tensor::uniform({c.batch, c.seq}, core::DType::i32, 1, 0.f, float(c.vocab));
  auto pos = core::Tensor::empty({c.seq}, core::DType::i32);
  for (int t = 0; t < c.seq; ++t) pos.data_as<int32_t>()[t] = t;
  ex.write(b.x, ids.data(), ids.bytes());
  ex.write(b.targets, ids.data(), ids.bytes());
  ex.write(g.at("pos"), pos.data(), pos.bytes());
  for (int warm = 0; warm < 2; ++warm) ex.run();  // thread pools, BLAS buffers, primitives start here

  g_allocations = 0;
  g_largest = 0;
  g_counting = true;
  for (int step = 0; step < 5; ++step) {
    store.zero_grads();
    ex.run();
  }
  g_counting = false;
  return {g_allocations.load(), g_largest.load(), std::isfinite(ex.read_scalar(b.loss))};
}

// Sets an environment override of cpu_features.h for one scope.
struct GemmOverride {
  explicit GemmOverride(const char* value) {
    setenv("BRISK_GEMM", value, 1);
    cpu::reload_cpu_features();
  }
  ~GemmOverride() {
    unsetenv("BRISK_GEMM");
    cpu::reload_cpu_features();
  }
};

TEST(NoAllocation, SteadyStateTrainingStepAllocatesNothingWithOpenBlas) {
  GemmOverride path("openblas");
  const SteadyState s = steady_state_allocations();
  EXPECT_EQ(s.allocations, 0) << "the executor allocated in the steady state";
  EXPECT_TRUE(s.loss_finite);
}

TEST(NoAllocation, SteadyStateTrainingStepAllocatesNoBuffersWithOneDnn) {
  GemmOverride path("onednn");
  const SteadyState s = steady_state_allocations();
  std::printf("oneDNN path: %ld small allocations over 5 steps, largest %zu bytes\n", s.allocations, s.largest);
  EXPECT_LE(s.largest, size_t(256) << 10) << "a large buffer was allocated in the steady state";
  EXPECT_TRUE(s.loss_finite);
}

// The encoder's train programs of two batch widths, alternating as length
// bucketing makes them, in their shared arena: switching widths rewrites
// the inputs written once (positions, loss scale) without allocating.
TEST(NoAllocation, EncoderAlternatingBatchWidthsAllocatesNothingWithOpenBlas) {
  GemmOverride path("openblas");
  models::EncoderConfig c;
  c.vocab_size = 97, c.n_layer = 1, c.n_embd = 32, c.n_head = 2, c.max_len = 64;
  cpu::CpuBackend backend(2);
  models::Encoder enc(c, backend);
  enc.init_weights(5);
  const int64_t B = 3;
  std::vector<int32_t> ids(size_t(B * 64)), labels = {0, 1, 1};
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + 11) % 97);
  const int32_t narrow[] = {32, 7, 20}, wide[] = {64, 33, 50};
  auto step = [&](bool w) { return enc.train_micro_step(ids.data(), w ? wide : narrow, labels.data(), B, w ? 64 : 32); };
  for (int warm = 0; warm < 2; ++warm) step(false), step(true);
  g_allocations = 0;
  g_largest = 0;
  g_counting = true;
  double loss = 0;
  for (int s = 0; s < 6; ++s) loss += step(s % 2 == 1);
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0) << "alternating widths allocated " << g_allocations.load() << " times (largest " << g_largest.load() << " bytes)";
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_EQ(enc.cached_programs(), 2u);
}

// ---- a whole training step, through the trainer --------------------------------------

// Three optimizer steps to warm up (thread pools, BLAS buffers, the loader's
// slots, the metrics file), then counts what five further steps allocate.
SteadyState trainer_steady_state(const std::string& precision) {
  const std::filesystem::path root = testing_util::corpus_dir("no_alloc");
  static int runs = 0;  // a fresh run directory per call
  const std::string run = (root / ("run_" + precision + std::to_string(++runs))).string();
  const train::TrainConfig cfg = train::load_train_config(
      "", {"model.vocab_size=256", "model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.block_size=32",
           "train.batch=4", "train.seq=32", "train.grad_accum=2", "train.steps=50", "train.log_every=1",
           "train.eval_every=0", "train.threads=2", "train.loader_workers=2", "train.precision=" + precision,
           "train.precision_fallback=false", "checkpoint.every=0", "data.dir=" + (root / "data").string(),
           "checkpoint.dir=" + run});
  cpu::CpuBackend backend(2);
  // Plain log lines on stderr every step: the logging path is counted too.
  train::Trainer trainer(cfg, backend, {.progress = false});
  for (int warm = 0; warm < 3; ++warm) trainer.step();
  g_allocations = 0;
  g_largest = 0;
  g_counting = true;
  for (int step = 0; step < 5; ++step) trainer.step();
  g_counting = false;
  const train::TrainResult r = trainer.finish();
  bool finite = true;
  for (double l : r.losses) finite = finite && std::isfinite(l);
  std::ifstream metrics(std::filesystem::path(run) / "metrics.jsonl");
  int rows = 0;
  for (std::string line; std::getline(metrics, line);) rows += !line.empty();
  EXPECT_EQ(rows, 8) << "every step writes its metrics row";
  return {g_allocations.load(), g_largest.load(), finite && r.losses.size() == 8};
}

// fp16 adds the loss scaler (its state is saved every step) and the casts
// between the fp32 master weights and the fp16 graph.
TEST(NoAllocation, WholeTrainerStepAllocatesNothingWithOpenBlas) {
  GemmOverride path("openblas");
  for (const char* precision : {"fp32", "fp16"}) {
    SCOPED_TRACE(precision);
    const SteadyState s = trainer_steady_state(precision);
    EXPECT_EQ(s.allocations, 0) << "an optimizer step of the trainer allocated in the steady state (largest "
                                << s.largest << " bytes)";
    EXPECT_TRUE(s.loss_finite);
  }
}

// oneDNN's matmul makes a few small bookkeeping objects per call (see the
// top of this file): bounded by size, as for the block.
TEST(NoAllocation, WholeTrainerStepAllocatesNoBuffersWithOneDnn) {
  GemmOverride path("onednn");
  const SteadyState s = trainer_steady_state("fp32");
  std::printf("oneDNN path: %ld small allocations over 5 trainer steps, largest %zu bytes\n", s.allocations,
              s.largest);
  EXPECT_LE(s.largest, size_t(256) << 10) << "a large buffer was allocated in the steady state";
  EXPECT_TRUE(s.loss_finite);
}

// CPU matrix products (gemm.h): oneDNN matmul primitives cached per shape, or
// OpenBLAS sgemm driven from our own OpenMP team.
#include "gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <dnnl.hpp>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/cpu/cpu_features.h"

namespace brisk::cpu {

namespace {

using dnnl::memory;

memory::data_type dnnl_type(core::DType t) {
  switch (t) {
    case core::DType::f32: return memory::data_type::f32;
    case core::DType::bf16: return memory::data_type::bf16;
    default: throw core::DTypeError("gemm: no oneDNN type for " + std::string(core::dtype_name(t)));
  }
}

// Everything that makes two products need different primitives.
using Key = std::array<int64_t, 12>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t v : k) h = (h ^ uint64_t(v)) * 1099511628211ull;
    return size_t(h);
  }
};

Key key_of(const Gemm& g, bool nested) {
  uint32_t alpha_bits;
  std::memcpy(&alpha_bits, &g.alpha, 4);
  return {g.m, g.n, g.k, g.lda, g.ldb, g.ldc, int64_t(g.ta) | int64_t(g.tb) << 1 | int64_t(nested) << 2,
          int64_t(g.ab_type), int64_t(g.c_type), g.bias ? int64_t(g.bias_type) : -1, int64_t(alpha_bits),
          g.beta != 0.f};
}

// ---- OpenBLAS (fp32) --------------------------------------------------------------

// Below this many multiply-adds a gemm is not worth splitting (and OpenBLAS
// does not thread it either: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD).
constexpr int64_t kSplitGemm = int64_t(1) << 18;

inline CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }

void sgemm_serial(const Gemm& g, int64_t m, int64_t n, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, tr(g.ta), tr(g.tb), blasint(m), blasint(n), blasint(g.k), g.alpha, a, blasint(g.lda), b,
              blasint(g.ldb), g.beta, c, blasint(g.ldc));
}

// We split C across our own OpenMP team and call OpenBLAS from inside the
// parallel region, where its OpenMP build runs single-threaded. Called from
// outside a region it would start its own threading, which costs a heap
// allocation per call (so a training step would allocate). C is split along
// its longer side; a small product runs on one thread of the team.
void sgemm_openblas(const Gemm& product) {
  Gemm g = product;
  const auto* a = static_cast<const float*>(g.a);
  const auto* b = static_cast<const float*>(g.b);
  auto* c = static_cast<float*>(g.c);
  if (g.bias) {  // bias rows under a beta = 1 product: one write pass, no read-modify pass after
    const auto* bias = static_cast<const float*>(g.bias);
    for (int64_t r = 0; r < g.m; ++r) std::copy(bias, bias + g.n, c + r * g.ldc);
    g.beta = 1.f;
  }
  const int threads = omp_in_parallel() || g.m * g.n * g.k < kSplitGemm ? 1 : omp_get_max_threads();
  if (threads <= 1) {
    sgemm_serial(g, g.m, g.n, a, b, c);
    return;
  }
  const bool split_rows = g.m >= g.n;
  const int64_t len = split_rows ? g.m : g.n;
  const int64_t quantum = split_rows ? 4 : 16;  // keep slices aligned to the micro-kernel
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = (len * t / nt) / quantum * quantum;
    const int64_t hi = t == nt - 1 ? len : (len * (t + 1) / nt) / quantum * quantum;
    if (hi > lo) {
      if (split_rows)
        sgemm_serial(g, hi - lo, g.n, g.ta ? a + lo : a + lo * g.lda, b, c + lo * g.ldc);
      else
        sgemm_serial(g, g.m, hi - lo, a, g.tb ? b + lo * g.ldb : b + lo, c + lo);
    }
  }
}

}  // namespace

// ---- oneDNN ------------------------------------------------------------------------

class GemmCache {
 public:
  GemmCache() : engine_(dnnl::engine::kind::cpu, 0), id_(next_id_++) {}

  struct Entry {
    dnnl::matmul prim;
    memory::desc a, b, c, bias, scratch;
  };

  const Entry& get(const Gemm& g, bool nested) {
    const Key key = key_of(g, nested);
    {
      std::shared_lock lock(mutex_);
      if (auto it = map_.find(key); it != map_.end()) return it->second;
    }
    Entry e = create(g);
    std::unique_lock lock(mutex_);
    ++created_;
    return map_.try_emplace(key, std::move(e)).first->second;  // node-based: references stay valid
  }

  dnnl::engine& engine() { return engine_; }
  // Unique per cache for the process's life: a new cache can be allocated at
  // a freed one's address, so the address cannot say whose stream a thread holds.
  uint64_t id() const { return id_; }
  int64_t created() const { return created_; }

 private:
  Entry create(const Gemm& g) {
    const memory::data_type ab = dnnl_type(g.ab_type), ct = dnnl_type(g.c_type);
    Entry e;
    // Transposes are strides: a logical (m, k) A stored (k, m) has strides (1, lda).
    e.a = memory::desc({g.m, g.k}, ab, g.ta ? memory::dims{1, g.lda} : memory::dims{g.lda, 1});
    e.b = memory::desc({g.k, g.n}, ab, g.tb ? memory::dims{1, g.ldb} : memory::dims{g.ldb, 1});
    e.c = memory::desc({g.m, g.n}, ct, memory::dims{g.ldc, 1});
    if (g.bias) e.bias = memory::desc({1, g.n}, dnnl_type(g.bias_type), memory::dims{g.n, 1});
    dnnl::primitive_attr attr;
    // Our scratchpad, one per calling thread: the library's own is shared by
    // all primitives (Debian builds oneDNN without DNNL_ENABLE_CONCURRENT_EXEC),
    // so two threads running products at once corrupted each other's results.
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (g.alpha != 1.f) attr.set_output_scales(0, {g.alpha});
    if (g.beta != 0.f) {
      dnnl::post_ops po;
      po.append_sum(g.beta);
      attr.set_post_ops(po);
    }
    const dnnl::matmul::desc d = g.bias ? dnnl::matmul::desc(e.a, e.b, e.bias, e.c) : dnnl::matmul::desc(e.a, e.b, e.c);
    const dnnl::matmul::primitive_desc pd(d, attr, engine_);
    e.scratch = pd.scratchpad_desc();
    e.prim = dnnl::matmul(pd);
    return e;
  }

  dnnl::engine engine_;
  std::shared_mutex mutex_;
  std::unordered_map<Key, Entry, KeyHash> map_;
  int64_t created_ = 0;
  uint64_t id_;
  static inline std::atomic<uint64_t> next_id_{1};
};

namespace {

GemmCache& process_cache() {
  static GemmCache* c = new GemmCache();  // lives for the process (kernels may run at exit)
  return *c;
}

void gemm_onednn(GemmCache& cache, const Gemm& g) {
  // Inside a parallel region oneDNN runs the product on the calling thread;
  // its kernels are chosen for the thread count at creation, so nested and
  // top-level calls of one shape get primitives of their own.
  const bool nested = omp_in_parallel();
  const GemmCache::Entry& e = cache.get(g, nested);
  thread_local dnnl::stream stream;
  thread_local uint64_t stream_cache = 0;  // GemmCache::id() the stream was made for
  if (stream_cache != cache.id()) {
    stream = dnnl::stream(cache.engine());
    stream_cache = cache.id();
  }
  thread_local std::vector<char> scratch_buf;  // grows to the largest need, then stays
  if (scratch_buf.size() < e.scratch.get_size()) scratch_buf.resize(e.scratch.get_size());
  dnnl::engine& eng = cache.engine();
  memory a(e.a, eng, const_cast<void*>(g.a)), b(e.b, eng, const_cast<void*>(g.b)), c(e.c, eng, g.c);
  memory scratch(e.scratch, eng, scratch_buf.data());
  if (g.bias) {
    memory bias(e.bias, eng, const_cast<void*>(g.bias));
    e.prim.execute(stream, {{DNNL_ARG_SRC, a},
                            {DNNL_ARG_WEIGHTS, b},
                            {DNNL_ARG_BIAS, bias},
                            {DNNL_ARG_DST, c},
                            {DNNL_ARG_SCRATCHPAD, scratch}});
  } else {
    e.prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, scratch}});
  }
}

}  // namespace

std::unique_ptr<GemmCache, void (*)(GemmCache*)> make_gemm_cache() {
  return {new GemmCache(), [](GemmCache* c) { delete c; }};
}

GemmCache& gemm_cache_of(const core::ExecContext* ctx) {
  return ctx && ctx->blas_handle ? *static_cast<GemmCache*>(ctx->blas_handle) : process_cache();
}

void sgemm(GemmCache& cache, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  Gemm g;
  g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k;
  g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc, g.beta = beta;
  gemm(cache, g);
}

bool gemm_bf16_native() { return cpu_features().bf16 == Bf16Path::native; }

int64_t gemm_primitives_created(const GemmCache& cache) { return cache.created(); }

void gemm(GemmCache& cache, const Gemm& g) {
  if (g.m <= 0 || g.n <= 0) return;
  if (g.beta != 0.f && g.beta != 1.f) throw core::Error("gemm: beta must be 0 or 1");
  if (g.k == 0) {  // no products: C = bias or C or 0
    for (int64_t r = 0; r < g.m; ++r)
      for (int64_t j = 0; j < g.n; ++j) {
        float v = g.beta != 0.f ? (g.c_type == core::DType::f32 ? static_cast<float*>(g.c)[r * g.ldc + j]
                                                                : core::bf16_to_f32(static_cast<uint16_t*>(g.c)[r * g.ldc + j]))
                                : 0.f;
        if (g.bias)
          v += g.bias_type == core::DType::f32 ? static_cast<const float*>(g.bias)[j]
                                               : core::bf16_to_f32(static_cast<const uint16_t*>(g.bias)[j]);
        if (g.c_type == core::DType::f32) static_cast<float*>(g.c)[r * g.ldc + j] = v;
        else static_cast<uint16_t*>(g.c)[r * g.ldc + j] = core::f32_to_bf16(v);
      }
    return;
  }
  const bool all_f32 = g.ab_type == core::DType::f32 && g.c_type == core::DType::f32 &&
                       (!g.bias || g.bias_type == core::DType::f32);
  if (all_f32 && cpu_features().f32_gemm == F32Gemm::openblas) {
    if (g.bias && g.beta != 0.f) throw core::Error("gemm: bias with beta = 1 is not supported");
    sgemm_openblas(g);
    return;
  }
  if (g.ab_type == core::DType::bf16 && !gemm_bf16_native())
    throw core::Error("gemm: bf16 operands need the bf16-native path (" + cpu_features().bf16_reason + ")");
  gemm_onednn(cache, g);
}

}  // namespace brisk::cpu

// cuBLASLt products with cached plans (see gemm.h for the contract).
//
// Row-major vs column-major: cuBLASLt is column-major and our tensors are
// row-major. A row-major (M, N) matrix is the same bytes as a column-major
// (N, M) one, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the
// operands swap places and every transpose flag keeps its meaning. The bias
// then runs along cuBLASLt's rows, i.e. our columns, as wanted.
//
// The plan cache: a plan (matmul descriptor, three layouts, the heuristic's
// first algorithm, or "none" when the heuristic found nothing) is keyed by
// everything the heuristic sees: dtype, transposes, shape, batch strides,
// epilogue, the workspace size, and the alignments of A, B, C, bias and aux
// (the heuristic reads the bias/aux pointers only for their alignment). The
// pointers themselves are per call: the bias and aux pointers are descriptor
// attributes, so they are set on the cached descriptor under the state's
// mutex right before the launch; cublasLtMatmul reads the descriptor when it
// is called (and a graph capture records the values of that moment), so the
// next call may change them. A "none" plan is cached too, so a refused
// epilogue costs one heuristic query per shape, not one per call.
//
// The cache is bounded: beyond kMaxPlans (many distinct shapes, e.g. serving
// with ever-changing sequence lengths) it is emptied and refilled, which is
// safe because no launched work refers to a descriptor.
#include "gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>

#include "cuda_util.cuh"

namespace brisk::cuda {

namespace {

using core::DType;

constexpr size_t kMaxPlans = 4096;
constexpr int kTuneCandidates = 8;  // heuristic results timed under BRISK_CUDA_GEMM_TUNE=1
constexpr int kTuneReps = 5;

struct GemmKey {
  DType dtype = DType::f32;
  bool c_f32 = false;
  bool trans_a = false, trans_b = false;
  Epilogue epilogue = Epilogue::none;
  int64_t M = 0, N = 0, K = 0, batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0, align_aux = 0;
  uint64_t workspace = 0;
  bool operator==(const GemmKey&) const = default;
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull + (h >> 29); };
    mix(uint64_t(k.dtype) | uint64_t(k.trans_a) << 8 | uint64_t(k.trans_b) << 9 | uint64_t(k.c_f32) << 10 |
        uint64_t(k.epilogue) << 16);
    for (int64_t v : {k.M, k.N, k.K, k.batch, k.stride_a, k.stride_b, k.stride_c}) mix(uint64_t(v));
    mix(uint64_t(k.align_a) | uint64_t(k.align_b) << 16 | uint64_t(k.align_c) << 32 | uint64_t(k.align_bias) << 48);
    mix(uint64_t(k.align_aux) | k.workspace << 16);
    return size_t(h);
  }
};

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  // The heuristic's other candidates, best first (algo is the first), for
  // the timing pass of BRISK_CUDA_GEMM_TUNE=1; emptied once it has run.
  cublasLtMatmulAlgo_t candidates[kTuneCandidates]{};
  int n_candidates = 0;
  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct Preference {
  cublasLtMatmulPreference_t d = nullptr;
  ~Preference() {
    if (d) cublasLtMatmulPreferenceDestroy(d);
  }
};

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: break;
  }
  throw core::BackendError("cuda: gemm: no cuBLASLt type for dtype " + std::string(core::dtype_name(t)));
}

std::string gemm_str(const GemmArgs& g) {
  return std::string(core::dtype_name(g.dtype)) + " M=" + std::to_string(g.M) + " N=" + std::to_string(g.N) +
         " K=" + std::to_string(g.K) + " batch=" + std::to_string(g.batch) + (g.trans_a ? " trans_a" : "") +
         (g.trans_b ? " trans_b" : "") + " epilogue=" + std::to_string(int(g.epilogue)) +
         (g.c_f32 ? " c_f32" : "") + (g.beta != 0.f ? " beta=" + std::to_string(g.beta) : std::string());
}

// C's (and D's) dtype.
DType c_type(const GemmArgs& g) { return g.c_f32 ? DType::f32 : g.dtype; }

bool has_bias(Epilogue e) { return e == Epilogue::bias || e == Epilogue::gelu_aux_bias || e == Epilogue::bias_grad; }
bool has_aux(Epilogue e) { return e == Epilogue::gelu_aux || e == Epilogue::gelu_aux_bias || e == Epilogue::dgelu; }

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::bias_grad: return CUBLASLT_EPILOGUE_BGRADB;  // reduces cuBLASLt's B, our A
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

template <class T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v, const char* what) {
  check_cublas(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)), what);
}

template <class T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v, const char* what) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)), what);
}

// Column-major layout of a stored (rows, cols) matrix with leading dimension ld.
cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_cublas(cublasLtMatrixLayoutCreate(&l, type, uint64_t(rows), uint64_t(cols), ld), "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    cublasStatus_t s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count));
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride));
    if (s != CUBLAS_STATUS_SUCCESS) {
      cublasLtMatrixLayoutDestroy(l);
      check_cublas(s, "cublasLtMatrixLayoutSetAttribute(batch)");
    }
  }
  return l;
}

GemmKey key_of(const GemmArgs& g, uint64_t workspace) {
  const int64_t es = int64_t(core::dtype_size(g.dtype)), ces = int64_t(core::dtype_size(c_type(g)));
  const bool batched = g.batch > 1;
  GemmKey k;
  k.dtype = g.dtype;
  k.c_f32 = g.c_f32;
  k.trans_a = g.trans_a;
  k.trans_b = g.trans_b;
  k.epilogue = g.epilogue;
  k.M = g.M;
  k.N = g.N;
  k.K = g.K;
  k.batch = g.batch;
  k.stride_a = batched ? g.stride_a : 0;
  k.stride_b = batched ? g.stride_b : 0;
  k.stride_c = batched ? g.stride_c : 0;
  k.align_a = alignment_of(g.A, k.stride_a * es);
  k.align_b = alignment_of(g.B, k.stride_b * es);
  k.align_c = alignment_of(g.C, k.stride_c * ces);
  k.align_bias = has_bias(g.epilogue) ? alignment_of(g.bias) : 0;
  k.align_aux = has_aux(g.epilogue) ? alignment_of(g.aux) : 0;
  k.workspace = workspace;
  return k;
}

// Builds the descriptors and asks the heuristic; plan->found says whether it
// found an algorithm. Host-only work: safe while the stream is captured.
void build_plan(GemmPlan& plan, const GemmKey& k, const GemmArgs& g, const LtState& st) {
  const cudaDataType_t type = cuda_type(g.dtype);
  const cublasComputeType_t compute =
      g.dtype == DType::f32 && st.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check_cublas(cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  // cuBLASLt's A is our B and its B our A (see the file comment).
  const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, ta, "set TRANSA");
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, tb, "set TRANSB");
  if (g.epilogue != Epilogue::none) {
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(g.epilogue), "set EPILOGUE");
    if (has_bias(g.epilogue)) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias, "set BIAS_POINTER");
    if (has_aux(g.epilogue)) {
      // aux is (M, N) row-major: column-major (N, M) with leading dimension N, like D.
      set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(g.aux),
               "set EPILOGUE_AUX_POINTER");
      set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(g.N), "set EPILOGUE_AUX_LD");
    }
  }

  if (g.trans_b) plan.la = make_layout(type, g.K, g.N, g.K, k.batch, k.stride_b);  // B stored (N, K)
  else plan.la = make_layout(type, g.N, g.K, g.N, k.batch, k.stride_b);            // B stored (K, N)
  if (g.trans_a) plan.lb = make_layout(type, g.M, g.K, g.M, k.batch, k.stride_a);  // A stored (K, M)
  else plan.lb = make_layout(type, g.K, g.M, g.K, k.batch, k.stride_a);            // A stored (M, K)
  plan.lc = make_layout(cuda_type(c_type(g)), g.N, g.M, g.N, k.batch, k.stride_c);

  Preference pref;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref.d), "cublasLtMatmulPreferenceCreate");
  set_pref(pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, k.workspace, "set MAX_WORKSPACE_BYTES");
  set_pref(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_b, "set MIN_ALIGNMENT_A");  // our B
  set_pref(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_a, "set MIN_ALIGNMENT_B");  // our A
  set_pref(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_c, "set MIN_ALIGNMENT_C");
  set_pref(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_c, "set MIN_ALIGNMENT_D");

  cublasLtMatmulHeuristicResult_t results[kTuneCandidates]{};
  int found = 0;
  const int want = st.tune ? kTuneCandidates : 1;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st.handle, plan.desc, plan.la, plan.lb, plan.lc, plan.lc,
                                                           pref.d, want, results, &found);
  if (hs != CUBLAS_STATUS_SUCCESS) return;
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan.candidates[plan.n_candidates++] = results[i].algo;
  plan.found = plan.n_candidates > 0;
  if (plan.found) plan.algo = plan.candidates[0];
  if (plan.n_candidates < 2) plan.n_candidates = 0;
}

// BRISK_CUDA_GEMM_TUNE=1: the first call of a plan outside a graph capture
// times each of the heuristic's candidates on the real operands (one launch
// to warm up, then kTuneReps, on the call's stream) and keeps the fastest.
// The candidates write into a scratch D, so C (which beta = 1 reads and an
// accumulating product must not see added twice) is untouched; a GELU
// epilogue's aux receives the same values the real call writes after.
// The choice depends on timings, so two processes may pick differently and
// round differently: off by default, where every run picks the heuristic's
// first algorithm and repeats bit for bit.
void tune_plan(GemmPlan& plan, const GemmArgs& g, const LtState& st, void* ws, size_t ws_bytes,
               cudaStream_t stream) {
  const size_t ces = core::dtype_size(c_type(g));
  const size_t d_bytes = size_t((g.batch - 1) * (g.batch > 1 ? g.stride_c : 0) + g.M * g.N) * ces;
  void* scratch = nullptr;
  if (cudaMalloc(&scratch, d_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return;  // no room to time: the heuristic's first choice stands
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate(gemm tune)");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate(gemm tune)");
  float best_ms = INFINITY;
  for (int c = 0; c < plan.n_candidates; ++c) {
    const cublasLtMatmulAlgo_t* algo = &plan.candidates[c];
    bool ok = true;
    for (int r = 0; r <= kTuneReps && ok; ++r) {  // r = 0: the warm-up, before the timed span
      if (r == 1) check_cuda(cudaEventRecord(start, stream), "cudaEventRecord(gemm tune)");
      ok = cublasLtMatmul(st.handle, plan.desc, &g.alpha, g.B, plan.la, g.A, plan.lb, &g.beta, g.C, plan.lc, scratch,
                          plan.lc, algo, ws, ws_bytes, stream) == CUBLAS_STATUS_SUCCESS;
    }
    if (!ok) continue;
    check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord(gemm tune)");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize(gemm tune)");
    float ms = 0.f;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime(gemm tune)");
    if (ms < best_ms) {
      best_ms = ms;
      plan.algo = *algo;
    }
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  check_cuda(cudaFree(scratch), "cudaFree(gemm tune scratch)");
  plan.n_candidates = 0;
}

// C = beta * C + bias (broadcast over rows of n_cols); beta == 0 never reads C
// (so stale NaNs do not leak). Covers K = 0 and a refused bias epilogue.
template <class T>
__global__ void scale_add_bias_kernel(T* c, const T* bias, float beta, int64_t n, int64_t n_cols) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = beta == 0.f ? 0.f : beta * widen(c[i]);
    if (bias) v += widen(bias[i % n_cols]);
    c[i] = narrow<T>(v);
  }
}

void scale_add_bias(const GemmArgs& g, float beta, const void* bias, cudaStream_t s) {
  const int64_t n = g.batch * g.M * g.N;
  if (n == 0) return;
  constexpr int kThreads = 256;
  const unsigned blocks = grid_for(n, kThreads);
  switch (c_type(g)) {
    case DType::f32:
      scale_add_bias_kernel<<<blocks, kThreads, 0, s>>>(static_cast<float*>(g.C), static_cast<const float*>(bias),
                                                        beta, n, g.N);
      break;
    case DType::bf16:
      scale_add_bias_kernel<<<blocks, kThreads, 0, s>>>(static_cast<bf16_t*>(g.C),
                                                        static_cast<const bf16_t*>(bias), beta, n, g.N);
      break;
    case DType::f16:
      scale_add_bias_kernel<<<blocks, kThreads, 0, s>>>(static_cast<f16_t*>(g.C), static_cast<const f16_t*>(bias),
                                                        beta, n, g.N);
      break;
    default: throw core::BackendError("cuda: gemm: bad dtype for the bias kernel");
  }
  check_cuda(cudaGetLastError(), "gemm bias/scale kernel launch");
}

}  // namespace

class GemmCache {
 public:
  std::unordered_map<GemmKey, std::unique_ptr<GemmPlan>, GemmKeyHash> plans;
};

LtState::LtState(cublasLtHandle_t h) : handle(h), cache(std::make_unique<GemmCache>()) {
  const char* v = std::getenv("BRISK_CUDA_TF32");
  tf32 = v && std::strcmp(v, "1") == 0;
  const char* t = std::getenv("BRISK_CUDA_GEMM_TUNE");
  tune = t && std::strcmp(t, "1") == 0;
}

LtState::~LtState() = default;

LtState& lt_state_of(const core::ExecContext& ctx) {
  if (!ctx.blas_handle) throw core::BackendError("cuda: gemm: the ExecContext carries no cuBLASLt state");
  return *static_cast<LtState*>(ctx.blas_handle);
}

uint32_t alignment_of(const void* p, int64_t stride_bytes) {
  uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(p)) | 256u;
  if (stride_bytes) bits |= uint64_t(stride_bytes);
  return uint32_t(bits & (~bits + 1));
}

bool lt_matmul(const GemmArgs& g, const core::ExecContext& ctx) {
  LtState& st = lt_state_of(ctx);
  const uint64_t ws = ctx.blas_workspace ? uint64_t(ctx.blas_workspace_bytes) : 0;
  if (has_aux(g.epilogue)) {
    // cuBLASLt's rules for the GELU input matrix: leading dimension a multiple
    // of 8, no batches here (aux batch strides are not set).
    if (g.N % 8 != 0 || g.batch != 1 || !g.aux) return false;
  }
  if (has_bias(g.epilogue) && !g.bias) return false;
  // A bias gradient has D's type (cuBLASLt's rule): f32 here, for an f32 parameter's gradient.
  if (g.epilogue == Epilogue::bias_grad && c_type(g) != DType::f32) return false;
  const GemmKey key = key_of(g, ws);
  std::lock_guard lock(st.mu);
  auto& plans = st.cache->plans;
  auto it = plans.find(key);
  if (it == plans.end()) {
    if (plans.size() >= kMaxPlans) plans.clear();
    auto plan = std::make_unique<GemmPlan>();
    build_plan(*plan, key, g, st);
    ++st.plans_created;
    it = plans.emplace(key, std::move(plan)).first;
  }
  GemmPlan& plan = *it->second;
  if (!plan.found) return false;
  if (has_bias(g.epilogue)) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias, "set BIAS_POINTER");
  if (has_aux(g.epilogue))
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(g.aux),
             "set EPILOGUE_AUX_POINTER");
  if (plan.n_candidates > 0) {
    // Timing needs stream work and a wait: never inside a graph capture (the
    // plan is then tuned at its first call outside one).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(static_cast<cudaStream_t>(ctx.stream), &capture), "cudaStreamIsCapturing");
    if (capture == cudaStreamCaptureStatusNone)
      tune_plan(plan, g, st, ws ? ctx.blas_workspace : nullptr, size_t(ws), static_cast<cudaStream_t>(ctx.stream));
  }
  const cublasStatus_t s =
      cublasLtMatmul(st.handle, plan.desc, &g.alpha, g.B, plan.la, g.A, plan.lb, &g.beta, g.C, plan.lc, g.C, plan.lc,
                     &plan.algo, ws ? ctx.blas_workspace : nullptr, size_t(ws), static_cast<cudaStream_t>(ctx.stream));
  if (s != CUBLAS_STATUS_SUCCESS)
    throw core::BackendError(std::string("cuda: cublasLtMatmul failed for ") + gemm_str(g) + ": " +
                             cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) + ")");
  return true;
}

void run_gemm(const GemmArgs& g, const core::ExecContext& ctx) {
  if (has_aux(g.epilogue) || g.epilogue == Epilogue::bias_grad)
    throw core::BackendError(
        "cuda: run_gemm: the GELU and bias-gradient epilogues go through lt_matmul (the caller owns the fallback)");
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  const size_t es = core::dtype_size(g.dtype), ces = core::dtype_size(c_type(g));
  const void* bias = g.epilogue == Epilogue::bias ? g.bias : nullptr;
  if (g.c_f32 && g.epilogue != Epilogue::none)
    throw core::BackendError("cuda: run_gemm: an f32 C under low-precision operands takes no epilogue");
  if (g.M <= 0 || g.N <= 0 || g.batch <= 0) return;
  if (g.K <= 0) {  // an empty sum: C = beta * C (+ bias)
    if (g.beta == 0.f && !bias)
      check_cuda(cudaMemsetAsync(g.C, 0, size_t(g.batch * g.M * g.N) * ces, stream), "cudaMemsetAsync");
    else if (g.beta != 1.f || bias)
      scale_add_bias(g, g.beta, bias, stream);
    return;
  }
  if (g.batch > 1 && (g.stride_a == 0 || g.stride_b == 0 || bias)) {
    // A shared operand (or a bias, whose batch broadcast we do not rely on):
    // one product per batch. Rare: the models fold shared-weight batches into rows.
    for (int64_t b = 0; b < g.batch; ++b) {
      GemmArgs one = g;
      one.batch = 1;
      one.A = static_cast<const char*>(g.A) + size_t(b * g.stride_a) * es;
      one.B = static_cast<const char*>(g.B) + size_t(b * g.stride_b) * es;
      one.C = static_cast<char*>(g.C) + size_t(b * g.stride_c) * ces;
      run_gemm(one, ctx);
    }
    return;
  }
  GemmArgs plain = g;
  // The bias epilogue wants a 16-byte aligned vector; otherwise, or when no
  // algorithm takes the epilogue for this shape, a second small pass adds it.
  if (bias && alignment_of(bias) >= 16 && lt_matmul(g, ctx)) return;
  plain.epilogue = Epilogue::none;
  plain.bias = nullptr;
  if (!lt_matmul(plain, ctx))
    throw core::BackendError("cuda: cuBLASLt has no algorithm for " + gemm_str(plain));
  if (bias) scale_add_bias(g, 1.f, bias, stream);
}

}  // namespace brisk::cuda

// The op harness. It walks the op registry and, for every test case of every
// op, (1) runs every built backend's kernel against the op's scalar reference
// kernel on the same random inputs, and (2) checks the op's backward rule
// against central finite differences of the reference forward pass. A test
// case's kernel dtype is a promise: a backend that runs and has no kernel for
// it fails the op. Tests are
// registered per op (OpForward.<op>, OpGradient.<op>) so one op can be run
// alone with --gtest_filter; a table of results is printed at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <cstdlib>
#include <random>
#include <set>
#include <string_view>

#include "brisk/core/autograd.h"
#include "brisk/core/backend_loader.h"
#include "brisk/core/executor.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/ops/ops.h"
#include "brisk/ops/reference_backend.h"

using namespace brisk;
using core::DType;
using core::Tensor;
using core::TensorView;

namespace {

double forward_tolerance(DType t) {
  switch (t) {
    case DType::f32: return 2e-5;
    case DType::bf16: return 2e-2;
    case DType::f16: return 4e-3;
    default: return 0.0;  // integers: exact
  }
}

struct Row {
  int cases = 0;
  double max_error = 0.0;
  double tolerance = 0.0;
};
// (op, dtype, backend or "grad") -> results, printed after the run.
std::map<std::tuple<std::string, std::string, std::string>, Row>& results() {
  static std::map<std::tuple<std::string, std::string, std::string>, Row> r;
  return r;
}

std::vector<Tensor> make_inputs(const core::TestCase& tc, uint64_t seed) {
  std::vector<Tensor> xs;
  for (size_t i = 0; i < tc.inputs.size(); ++i) {
    const core::InputSpec& s = tc.inputs[i];
    if (!s.values.empty()) {
      Tensor t = Tensor::empty(s.meta.shape, s.meta.dtype);
      for (size_t e = 0; e < s.values.size(); ++e) core::store_from_double(t.data(), s.meta.dtype, e, s.values[e]);
      xs.push_back(t);
      continue;
    }
    xs.push_back(Tensor::uniform(s.meta.shape, s.meta.dtype, seed * 131 + i, float(s.lo), float(s.hi)));
  }
  return xs;
}

struct Outputs {
  std::vector<Tensor> owned;       // outputs that are not aliases
  std::vector<TensorView> views;   // what the kernel writes
};

// Runs one op on a host backend; aliased outputs write into copies of inputs.
Outputs run_host(core::Backend& backend, const core::OpDef& def, const core::TestCase& tc,
                 const std::vector<Tensor>& inputs) {
  std::vector<Tensor> in_copies;
  std::vector<TensorView> in_views;
  std::vector<core::TensorMeta> in_metas;
  for (const Tensor& t : inputs) {
    in_copies.push_back(t.clone());
    in_views.push_back(in_copies.back().as_view());
    in_metas.push_back(t.meta());
  }
  const std::vector<core::TensorMeta> out_metas = def.infer(in_metas, tc.params);
  Outputs out;
  for (size_t o = 0; o < out_metas.size(); ++o) {
    const int alias = def.alias_of(o, inputs.size());
    if (alias >= 0) {
      out.owned.push_back(in_copies[size_t(alias)]);
    } else {
      Tensor t = Tensor::empty(out_metas[o].shape, out_metas[o].dtype);
      t.fill(12345.0);  // a kernel that forgets to write an element shows up
      out.owned.push_back(t);
    }
    out.views.push_back(out.owned.back().as_view());
  }
  std::vector<unsigned char> ws(def.workspace_bytes ? def.workspace_bytes(in_metas, tc.params) : 0);
  core::run_op(backend, def.kind, in_views, out.views, tc.params, ws.data(), ws.size());
  return out;
}

// max |a - b| / max(max |ref|, tiny): an error relative to the tensor's scale.
double normalized_error(const Tensor& ref, const Tensor& got) {
  double diff = 0.0, scale = 1e-12;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.item(i), g = got.item(i);
    if (std::isnan(r) != std::isnan(g)) return INFINITY;
    if (std::isnan(r)) continue;
    diff = std::max(diff, std::abs(r - g));
    scale = std::max(scale, std::abs(r));
  }
  return diff / std::max(scale, 1e-6);
}

DType case_dtype(const core::OpDef& def, const core::TestCase& tc, const std::vector<core::TensorMeta>& outs) {
  const int i = def.kernel_dtype_input;
  if (i >= 0 && size_t(i) < tc.inputs.size()) return tc.inputs[size_t(i)].meta.dtype;
  return outs[0].dtype;
}

// Why the CUDA backend is not among backends() (empty when it is).
std::string& cuda_unavailable() {
  static std::string why;
  return why;
}

std::vector<std::unique_ptr<core::Backend>>& backends() {
  static std::vector<std::unique_ptr<core::Backend>> b = [] {
    std::vector<std::unique_ptr<core::Backend>> v;
    v.push_back(std::make_unique<cpu::CpuBackend>());
    if (std::getenv("BRISK_OPS_NO_CUDA")) {
      cuda_unavailable() = "BRISK_OPS_NO_CUDA is set";
    } else if (auto cuda = core::load_cuda_backend(&cuda_unavailable())) {
      cuda_unavailable().clear();
      v.push_back(std::move(cuda));
    }
    return v;
  }();
  return b;
}

// Runs one op on a device backend: inputs copied over, outputs pre-filled
// with a marker value (a kernel that forgets an element shows up), results
// copied back into host tensors shaped like run_host's.
Outputs run_device(core::Backend& backend, const core::OpDef& def, const core::TestCase& tc,
                   const std::vector<Tensor>& inputs) {
  std::vector<Tensor> dev_in;
  std::vector<TensorView> in_views;
  std::vector<core::TensorMeta> in_metas;
  for (const Tensor& t : inputs) {
    dev_in.push_back(Tensor::empty(t.shape(), t.dtype(), backend.allocator(), backend.device()));
    backend.copy_to_device(dev_in.back().data(), t.data(), t.bytes());
    in_views.push_back(dev_in.back().as_view());
    in_metas.push_back(t.meta());
  }
  const std::vector<core::TensorMeta> out_metas = def.infer(in_metas, tc.params);
  std::vector<Tensor> dev_out;
  std::vector<TensorView> out_views;
  for (size_t o = 0; o < out_metas.size(); ++o) {
    const int alias = def.alias_of(o, inputs.size());
    if (alias >= 0) {
      dev_out.push_back(dev_in[size_t(alias)]);
    } else {
      Tensor marker = Tensor::empty(out_metas[o].shape, out_metas[o].dtype);
      marker.fill(12345.0);
      dev_out.push_back(Tensor::empty(out_metas[o].shape, out_metas[o].dtype, backend.allocator(), backend.device()));
      backend.copy_to_device(dev_out.back().data(), marker.data(), marker.bytes());
    }
    out_views.push_back(dev_out.back().as_view());
  }
  const size_t ws_bytes = def.workspace_bytes ? def.workspace_bytes(in_metas, tc.params) : 0;
  Tensor ws;
  if (ws_bytes) ws = Tensor::empty(core::Shape{int64_t(ws_bytes)}, DType::u8, backend.allocator(), backend.device());
  core::run_op(backend, def.kind, in_views, out_views, tc.params, ws_bytes ? ws.data() : nullptr, ws_bytes);
  backend.synchronize();
  Outputs out;
  for (const Tensor& d : dev_out) {
    Tensor h = Tensor::empty(d.shape(), d.dtype());
    backend.copy_to_host(h.data(), d.data(), d.bytes());
    out.owned.push_back(h);
    out.views.push_back(h.as_view());
  }
  return out;
}

ops::ReferenceBackend& reference() {
  static ops::ReferenceBackend r;
  return r;
}

// ---- the CPU's two bf16 paths -----------------------------------------------------
// bf16 cases run on the CPU backend twice: on the bf16-native kernels (bf16
// dot products through oneDNN) where this CPU has them, and on the emulated
// ones (widened to f32), which every CPU runs. BRISK_BF16 switches between
// them (cpu_features.h).

// Whether this CPU has the native path, read once with no override set.
const cpu::CpuFeatures& native_features() {
  static const cpu::CpuFeatures f = [] {
    unsetenv("BRISK_BF16");
    cpu::reload_cpu_features();
    return cpu::cpu_features();
  }();
  return f;
}

void use_bf16_path(cpu::Bf16Path p) {
  if (p == cpu::Bf16Path::emulated) setenv("BRISK_BF16", "emulated", 1);
  else unsetenv("BRISK_BF16");
  cpu::reload_cpu_features();
}

// ---- the CPU's int8 dot-product paths ------------------------------------------------
// linear_q8 / linear_q4 run on every int8 path this CPU has
// (cpu::int8_path_available, forced by BRISK_INT8); the others are a visible
// skip in Int8Paths.EveryPathTheCpuHas.

bool is_int8_op(core::OpKind k) {
  return k == core::OpKind::linear_q8 || k == core::OpKind::linear_q4 || k == core::OpKind::linear_q8_packed ||
         k == core::OpKind::linear_q4_packed;
}

std::vector<cpu::Int8Dot> int8_paths() {
  std::vector<cpu::Int8Dot> v;
  for (int p = 0; p <= int(cpu::Int8Dot::scalar); ++p)
    if (cpu::int8_path_available(native_features(), cpu::Int8Dot(p))) v.push_back(cpu::Int8Dot(p));
  return v;
}

void use_int8_path(cpu::Int8Dot p) {
  setenv("BRISK_INT8", cpu::int8_dot_name(p), 1);
  cpu::reload_cpu_features();
}

// ---- the CPU's two fp32 matrix-product engines -----------------------------------------
// gemm.h runs fp32 products on oneDNN (the default on AVX-512 CPUs) or
// OpenBLAS (elsewhere). Both run on every CPU (oneDNN has AVX2 kernels), so
// the f32 cases of the ops whose kernels multiply through gemm.h run on both
// (BRISK_GEMM), whichever one this machine would choose.
bool is_gemm_op(core::OpKind k) {
  using K = core::OpKind;
  return k == K::matmul || k == K::linear || k == K::linear_gelu || k == K::matmul_gelu_backward ||
         k == K::linear_param_grad || k == K::classifier_train || k == K::attention || k == K::attention_backward ||
         k == K::flash_attention || k == K::flash_attention_backward || k == K::masked_flash_attention ||
         k == K::masked_flash_attention_backward;
}

// Back to what the machine runs with no override.
void restore_paths() {
  unsetenv("BRISK_INT8");
  unsetenv("BRISK_FEW_ROWS");
  unsetenv("BRISK_ATTENTION");
  unsetenv("BRISK_GEMM");
  use_bf16_path(native_features().bf16);
}

// Ops with no CUDA kernels yet, by design: the inference engine's
// (src/infer/ runs on the CPU only so far, docs/inference.md), the
// encoder's over right-padded batches (masked_attention.cpp and its
// siblings) and dropout (model.dropout is refused on a GPU). Their cases run on the CPU; CudaOps.Coverage holds every other
// op to having CUDA kernels, and the summary names these as not run there.
const std::set<core::OpKind>& cpu_only_ops() {
  static const std::set<core::OpKind> ops = {
      core::OpKind::linear_q8,
      core::OpKind::linear_q4,
      core::OpKind::linear_packed,
      core::OpKind::linear_q8_packed,
      core::OpKind::linear_q4_packed,
      core::OpKind::kv_attention,
      core::OpKind::masked_attention,
      core::OpKind::masked_attention_backward,
      core::OpKind::masked_flash_attention,
      core::OpKind::masked_flash_attention_backward,
      core::OpKind::masked_mean,
      core::OpKind::masked_mean_backward,
      core::OpKind::dropout};
  return ops;
}
// Cases of ops that have CUDA kernels which those kernels do not take yet:
// attention with probability dropout (AttentionParams::dropout,
// model.attention_dropout is refused on a GPU) and cross-entropy with label
// smoothing or class weights (the encoder classifier's, a CPU model). Run
// on the CPU; a device backend passes them over, and the summary names them.
bool cpu_only_case(core::OpKind kind, const core::TestCase& tc) {
  const auto* p = std::get_if<core::AttentionParams>(&tc.params);
  const auto* ce = std::get_if<core::CrossEntropyParams>(&tc.params);
  const bool class_weights = (kind == core::OpKind::cross_entropy && tc.inputs.size() == 3) ||
                             (kind == core::OpKind::cross_entropy_backward && tc.inputs.size() == 5);
  return (p && p->dropout > 0.f) || (ce && ce->label_smoothing != 0.f) || class_weights;
}
// The names of those whose cases a device backend passed over (the summary lists them).
std::set<std::string>& cpu_only_skipped() {
  static std::set<std::string> names;
  return names;
}

void check_forward(core::OpKind kind) {
  const core::OpDef& def = core::op_def(kind);
  const auto cases = def.test_cases();
  ASSERT_FALSE(cases.empty()) << def.name << " has no test cases";
  uint64_t seed = 1;
  for (const core::TestCase& tc : cases) {
    SCOPED_TRACE(std::string(def.name) + " / " + tc.label);
    const std::vector<Tensor> inputs = make_inputs(tc, seed++);
    std::vector<core::TensorMeta> in_metas;
    for (const Tensor& t : inputs) in_metas.push_back(t.meta());
    const auto out_metas = def.infer(in_metas, tc.params);
    const DType key = case_dtype(def, tc, out_metas);
    const Outputs ref = run_host(reference(), def, tc, inputs);
    for (auto& backend : backends()) {
      // A test case declares its kernel dtype: the op is meant to run in it,
      // so every backend that runs must have that kernel. Skipping the case
      // would leave the (op, dtype) untested there and let a lost kernel
      // registration pass unnoticed.
      // A CPU-only op that has gained a kernel for this dtype runs like any other.
      if (!backend->device().is_host() && cpu_only_ops().count(kind) && !backend->supports(kind, key)) {
        cpu_only_skipped().insert(std::string(def.name));
        continue;
      }
      if (!backend->device().is_host() && cpu_only_case(kind, tc)) {
        cpu_only_skipped().insert(std::string(def.name) + " " + tc.label);
        continue;
      }
      if (!backend->supports(kind, key)) {
        ADD_FAILURE() << backend->name() << " backend has no " << core::dtype_name(key) << " kernel for "
                      << def.name << " (test case '" << tc.label << "' declares it)";
        continue;
      }
      const bool device = !backend->device().is_host();
      // Each CPU path the case can take: (suffix, switch to it); "" = as the machine runs.
      std::vector<std::pair<std::string, std::function<void()>>> paths = {{"", [] {}}};
      if (key == DType::bf16 && backend->name() == "cpu") {
        paths.clear();
        if (native_features().bf16 == cpu::Bf16Path::native)
          paths.push_back({"/bf16-native", [] { use_bf16_path(cpu::Bf16Path::native); }});
        paths.push_back({"/bf16-emulated", [] { use_bf16_path(cpu::Bf16Path::emulated); }});
      }
      if (is_int8_op(kind) && backend->name() == "cpu") {
        paths.clear();
        for (cpu::Int8Dot p : int8_paths()) paths.push_back({std::string("/") + cpu::int8_dot_name(p), [p] { use_int8_path(p); }});
      }
      // f32 Linear over <= 16 rows has an AVX-512 kernel and a portable one;
      // linear_packed and kv_attention an AVX-512 or AVX2 + FMA kernel and a
      // portable one.
      const bool avx2_or_512 = native_features().packed != cpu::CpuFeatures::PackedPath::portable;
      const bool simd_path = kind == core::OpKind::linear_packed || kind == core::OpKind::kv_attention ? avx2_or_512
                             : kind == core::OpKind::linear && native_features().few_rows_avx512;
      if (simd_path && key == DType::f32 && backend->name() == "cpu")
        paths.push_back({"/few-rows-portable", [] {
                           setenv("BRISK_FEW_ROWS", "portable", 1);
                           cpu::reload_cpu_features();
                         }});
      // linear_packed's and kv_attention's AVX2 + FMA kernels, on an AVX-512
      // CPU too (where the machine's own path is the AVX-512 one).
      const bool avx2_too = (kind == core::OpKind::linear_packed || kind == core::OpKind::kv_attention) &&
                            native_features().packed == cpu::CpuFeatures::PackedPath::avx512 &&
                            native_features().avx2_fma;
      if (avx2_too && key == DType::f32 && backend->name() == "cpu")
        paths.push_back({"/few-rows-avx2", [] {
                           setenv("BRISK_FEW_ROWS", "avx2", 1);
                           cpu::reload_cpu_features();
                         }});
      // The attention kernels' f32 products, plain and flash: AVX2 + FMA
      // register tiles where the CPU has them, BLAS calls on every CPU.
      const bool attention_products =
          kind == core::OpKind::attention || kind == core::OpKind::attention_backward ||
          kind == core::OpKind::masked_attention || kind == core::OpKind::masked_attention_backward ||
          kind == core::OpKind::flash_attention || kind == core::OpKind::flash_attention_backward ||
          kind == core::OpKind::masked_flash_attention || kind == core::OpKind::masked_flash_attention_backward;
      if (attention_products && key == DType::f32 && native_features().avx2_fma && backend->name() == "cpu") {
        paths.clear();
        for (const char* p : {"tiles", "blas"})
          paths.push_back({std::string("/attention-") + p, [p] {
                             setenv("BRISK_ATTENTION", p, 1);
                             cpu::reload_cpu_features();
                           }});
      }
      // Every path above once per fp32 engine: the attention kernels' BLAS
      // products are gemm.h's (the register tiles use neither engine, and
      // the plain masked kernels call OpenBLAS themselves).
      if (is_gemm_op(kind) && key == DType::f32 && backend->name() == "cpu") {
        std::vector<std::pair<std::string, std::function<void()>>> both;
        for (const auto& path : paths) {  // not a structured binding: clang 14 cannot capture one
          if (path.first == "/attention-tiles") {
            both.push_back(path);
            continue;
          }
          for (const char* engine : {"openblas", "onednn"})
            both.push_back({path.first + "/gemm-" + engine, [enter = path.second, engine] {
                              enter();
                              setenv("BRISK_GEMM", engine, 1);
                              cpu::reload_cpu_features();
                            }});
        }
        paths = std::move(both);
      }
      for (const auto& [suffix, enter] : paths) {
        if (!suffix.empty()) enter();
        const Outputs got = device ? run_device(*backend, def, tc, inputs) : run_host(*backend, def, tc, inputs);
        if (!suffix.empty()) restore_paths();
        const std::string where = std::string(backend->name()) + suffix;
        Row& row = results()[{std::string(def.name), std::string(core::dtype_name(key)), where}];
        row.cases++;
        for (size_t o = 0; o < ref.owned.size(); ++o) {
          const double tol = tc.forward_tolerance > 0 ? tc.forward_tolerance : forward_tolerance(ref.owned[o].dtype());
          const double err = normalized_error(ref.owned[o], got.owned[o]);
          row.max_error = std::max(row.max_error, err);
          row.tolerance = std::max(row.tolerance, tol);
          EXPECT_LE(err, tol) << "output " << o << " " << ref.owned[o].meta().str() << " on " << where;
        }
      }
    }
  }
}

// y = op(x...); L = sum_k sum(y_k * R_k) over the op's result outputs (not the
// saved statistics). Analytic dL/dx from backward() vs central differences.
void check_gradient(core::OpKind kind) {
  const core::OpDef& def = core::op_def(kind);
  if (!def.backward) GTEST_SKIP() << def.name << " is not differentiable (it is a backward or update op)";
  uint64_t seed = 1000;
  int checked = 0;
  for (const core::TestCase& tc : def.test_cases()) {
    ++seed;
    bool all_f32 = true;
    for (const auto& s : tc.inputs) all_f32 = all_f32 && (s.meta.dtype == DType::f32 || !core::dtype_is_float(s.meta.dtype));
    if (!all_f32) continue;  // finite differences need f32 precision
    SCOPED_TRACE(std::string(def.name) + " / " + tc.label);

    core::Graph g;
    std::vector<core::ValueId> xs;
    for (size_t i = 0; i < tc.inputs.size(); ++i) {
      const auto& s = tc.inputs[i];
      xs.push_back(g.input("x" + std::to_string(i), s.meta.shape, s.meta.dtype,
                           s.differentiable && core::dtype_is_float(s.meta.dtype)));
    }
    const std::vector<core::ValueId> ys = g.add_node(kind, xs, tc.params);
    const size_t n_results = ys.size() - size_t(def.num_saved_outputs);
    std::vector<core::ValueId> rs;
    core::ValueId loss = core::kNoValue;
    for (size_t k = 0; k < n_results; ++k) {
      if (!core::dtype_is_float(g.meta(ys[k]).dtype)) continue;
      rs.push_back(g.input("r" + std::to_string(k), g.shape(ys[k]), DType::f32));
      // A bf16/f16 result (a narrowing cast) is widened so that mul sees one dtype.
      const core::ValueId yk = g.meta(ys[k]).dtype == DType::f32 ? ys[k] : ops::cast(g, ys[k], DType::f32);
      const core::ValueId term = ops::sum(g, ops::mul(g, yk, rs.back()));
      loss = loss == core::kNoValue ? term : ops::add(g, loss, term);
      g.mark_output(ys[k]);
    }
    if (loss == core::kNoValue) continue;  // integer results only (an i32 reshape): nothing to differentiate
    core::backward(g, loss);
    core::Executor ex(g, reference());

    std::vector<Tensor> x_vals = make_inputs(tc, seed);
    std::vector<Tensor> r_vals;
    for (size_t k = 0; k < rs.size(); ++k)
      r_vals.push_back(Tensor::uniform(g.shape(rs[k]), DType::f32, seed * 7 + k, -1.f, 1.f));
    for (size_t k = 0; k < rs.size(); ++k) ex.write(rs[k], r_vals[k].data(), r_vals[k].bytes());

    // L in double on the host, from the f32 outputs, so differences stay precise.
    auto eval_loss = [&]() {
      for (size_t i = 0; i < xs.size(); ++i) ex.write(xs[i], x_vals[i].data(), x_vals[i].bytes());
      ex.run();
      double l = 0.0;
      size_t k = 0;
      for (size_t o = 0; o < n_results; ++o) {
        if (!core::dtype_is_float(g.meta(ys[o]).dtype)) continue;
        const TensorView y = ex.view(ys[o]);
        for (int64_t e = 0; e < y.numel(); ++e)
          l += core::load_as_double(y.data, y.dtype(), size_t(e)) * double(r_vals[k].data_as<float>()[e]);
        ++k;
      }
      return l;
    };
    eval_loss();
    std::vector<Tensor> analytic;
    for (size_t i = 0; i < xs.size(); ++i) {
      const core::ValueId gv = g.grad_of(xs[i]);
      if (gv == core::kNoValue) {
        analytic.emplace_back();
        EXPECT_FALSE(g.value(xs[i]).requires_grad) << "no gradient for differentiable input " << i;
        continue;
      }
      Tensor t = Tensor::empty(g.shape(gv), DType::f32);
      ex.read(gv, t.data(), t.bytes());
      analytic.push_back(t);
    }

    const double eps = 1e-3;
    std::mt19937 rng{uint32_t(seed)};
    double worst = 0.0;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!analytic[i].defined()) continue;
      const int64_t n = x_vals[i].numel();
      const int64_t samples = std::min<int64_t>(n, 24);
      double max_abs = 1e-3, max_diff = 0.0;
      for (int64_t s = 0; s < samples; ++s) {
        const int64_t e = samples == n ? s : int64_t(rng() % uint64_t(n));
        float* p = x_vals[i].data_as<float>() + e;
        const float orig = *p;
        *p = orig + float(eps);
        const double lp = eval_loss();
        *p = orig - float(eps);
        const double lm = eval_loss();
        *p = orig;
        const double fd = (lp - lm) / (double(orig + float(eps)) - double(orig - float(eps)));
        const double an = analytic[i].data_as<float>()[e];
        max_abs = std::max({max_abs, std::abs(fd), std::abs(an)});
        max_diff = std::max(max_diff, std::abs(fd - an));
      }
      const double err = max_diff / max_abs;
      const double tol = tc.grad_tolerance > 0 ? tc.grad_tolerance : 1e-2;
      worst = std::max(worst, err);
      EXPECT_LE(err, tol) << "gradient of input " << i << " " << x_vals[i].meta().str();
    }
    Row& row = results()[{std::string(def.name), "f32", "grad"}];
    row.cases++;
    row.max_error = std::max(row.max_error, worst);
    row.tolerance = tc.grad_tolerance > 0 ? tc.grad_tolerance : 1e-2;
    ++checked;
  }
  EXPECT_GT(checked, 0) << def.name << " is differentiable but has no f32 test case to check its gradient";
}

class OpTest : public testing::Test {
 public:
  OpTest(core::OpKind k, bool grad) : kind_(k), grad_(grad) {}
  void TestBody() override { grad_ ? check_gradient(kind_) : check_forward(kind_); }

 private:
  core::OpKind kind_;
  bool grad_;
};

// The GPU backend runs every (op, dtype) the CPU backend runs; a visible
// skip (with the loader's reason) where there is no GPU.
TEST(CudaOps, Coverage) {
  if (backends().size() < 2) GTEST_SKIP() << "CUDA op cases not run: " << cuda_unavailable();
  const core::Backend& cpu = *backends()[0];
  const core::Backend& gpu = *backends()[1];
  std::printf("CUDA op cases ran on %s\n", gpu.description().c_str());
  for (int op = 0; op < core::kNumOps; ++op)
    for (int t = 0; t < core::kNumDTypes; ++t)
      if (cpu.supports(core::OpKind(op), DType(t)) && !cpu_only_ops().count(core::OpKind(op))) {
        EXPECT_TRUE(gpu.supports(core::OpKind(op), DType(t)))
            << "cuda has no kernel for " << core::op_name(core::OpKind(op)) << " " << core::dtype_name(DType(t));
      }
}

// A visible skip where this CPU cannot run the bf16-native kernels.
TEST(Bf16Paths, NativeKernelsRunWhereTheCpuHasThem) {
  const cpu::CpuFeatures& f = native_features();
  if (f.bf16 != cpu::Bf16Path::native)
    GTEST_SKIP() << "bf16-native kernels not run on this machine (" << f.bf16_reason
                 << "); bf16 cases ran on the bf16-emulated kernels only";
  std::printf("bf16 cases ran on both paths: bf16-native (%s) and bf16-emulated\n", f.bf16_reason.c_str());
  SUCCEED();
}

// A visible skip where the attention kernels' register tiles cannot run.
TEST(AttentionTiles, RunWhereTheCpuHasThem) {
  if (!native_features().avx2_fma)
    GTEST_SKIP() << "this CPU has no AVX2 + FMA: the attention kernels' f32 cases (plain and flash, causal and "
                    "masked) ran on BLAS products only";
  std::printf("the attention kernels' f32 cases (plain and flash, causal and masked) ran on both paths: AVX2 + FMA "
              "register tiles and BLAS products (this CPU's default: %s)\n",
              native_features().attention_tiles ? "tiles" : "BLAS");
  SUCCEED();
}

// A visible skip naming the int8 paths this CPU cannot run.
TEST(Int8Paths, EveryPathTheCpuHas) {
  std::string ran, missing;
  for (int p = 0; p <= int(cpu::Int8Dot::scalar); ++p) {
    std::string& to = cpu::int8_path_available(native_features(), cpu::Int8Dot(p)) ? ran : missing;
    to += std::string(to.empty() ? "" : ", ") + cpu::int8_dot_name(cpu::Int8Dot(p));
  }
  std::printf("int8 cases ran on: %s\n", ran.c_str());
  if (!missing.empty()) GTEST_SKIP() << "int8 paths not run on this CPU (it lacks the instructions): " << missing;
}

void print_table() {
  if (results().empty()) return;
  std::printf("\n%-24s %-6s %-18s %6s %12s %10s\n", "op", "dtype", "backend", "cases", "max error", "tolerance");
  for (const auto& [key, row] : results()) {
    const auto& [op, dtype, backend] = key;
    std::printf("%-24s %-6s %-18s %6d %12.3e %10.1e%s\n", op.c_str(), dtype.c_str(), backend.c_str(), row.cases,
                row.max_error, row.tolerance, row.max_error > row.tolerance ? "  FAIL" : "");
  }
  std::printf("(backend 'grad': finite-difference check of the backward rule on the reference backend)\n\n");
}

// One line: which backends the forward cases ran on, and why one did not.
void print_backends() {
  std::string ran;
  for (const auto& b : backends()) {
    if (!ran.empty()) ran += ", ";
    ran += b->description();
    if (b->name() == "cpu")
      ran += native_features().bf16 == cpu::Bf16Path::native ? " (bf16: native and emulated)" : " (bf16: emulated only)";
  }
  // The loader's reason may list every path it tried, one per line: the
  // first line here, the rest in CudaOps.Coverage's skip message.
  const std::string& why = cuda_unavailable();
  const std::string first = why.substr(0, why.find('\n'));
  const std::string not_run =
      why.empty() ? "" : "; cuda not run: " + first + (first.size() < why.size() ? " (see CudaOps.Coverage)" : "");
  std::printf("op harness backends: ran on %s%s\n", ran.c_str(), not_run.c_str());
  if (!cpu_only_skipped().empty()) {
    std::string names;
    for (const std::string& n : cpu_only_skipped()) names += (names.empty() ? "" : ", ") + n;
    std::printf("CPU-only ops and cases (no CUDA kernels yet), not run on the GPU: %s\n", names.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  ops::register_ops();
  for (int i = 0; i < core::kNumOps; ++i) {
    const auto k = core::OpKind(i);
    const std::string name(core::op_name(k));
    for (bool grad : {false, true}) {
      // Backward and update ops have no gradient to check: no test, rather than a skip.
      if (grad && core::op_def(k).backward == nullptr) continue;
      testing::RegisterTest(grad ? "OpGradient" : "OpForward", name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [k, grad]() -> testing::Test* { return new OpTest(k, grad); });
    }
  }
  const int rc = RUN_ALL_TESTS();
  // ctest lists the tests before each run (DISCOVERY_MODE PRE_TEST): listing
  // runs no case, so it must not load the CUDA backend (hundreds of MB of
  // libraries, slow from a cold disk) just to print which backends ran.
  if (GTEST_FLAG_GET(list_tests)) return rc;
  print_table();
  print_backends();
  return rc;
}

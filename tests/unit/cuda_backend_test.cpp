// The CUDA backend against the reference backend: add, scale, matmul (odd
// shapes, every transpose combination, batched with shared and per-batch B)
// and linear, in f32 and bf16. Inputs are drawn on the host, copied to device
// buffers from the backend's own allocator, run through core::run_op, copied
// back and compared by normalized max error. f32 must match to 1e-4, which
// only holds with TF32 off (the backend computes in CUBLAS_COMPUTE_32F).
//
// Where the backend cannot be loaded (not built, no GPU) the device tests
// skip with the loader's reason, so a CPU-only run says why they did not run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "brisk/core/backend_loader.h"
#include "brisk/core/tensor.h"
#include "brisk/ops/ops.h"
#include "brisk/ops/reference_backend.h"

using namespace brisk;
using core::DType;
using core::OpKind;
using core::Shape;
using core::Tensor;

namespace {

// ---- loading without a GPU --------------------------------------------------------

// Whatever the machine, loading must either give a CUDA backend or say why
// not; never crash, throw, or answer silently.
TEST(CudaBackendLoader, LoadsOrExplainsWhyNot) {
  std::string why;
  std::unique_ptr<core::Backend> b;
  ASSERT_NO_THROW(b = core::load_cuda_backend(&why));
  if (b) {
    EXPECT_EQ(b->name(), "cuda");
    EXPECT_EQ(b->device().kind, core::DeviceKind::cuda);
  } else {
    EXPECT_FALSE(why.empty());
    std::printf("[ info     ] CUDA backend unavailable (expected on CPU-only machines): %s\n", why.c_str());
  }
}

// A bad $BRISK_CUDA_LIBRARY is reported among the paths tried, unless another
// path finds a working library.
TEST(CudaBackendLoader, BadEnvironmentPathIsReported) {
  const char* old = std::getenv("BRISK_CUDA_LIBRARY");
  const std::string saved = old ? old : "";
  setenv("BRISK_CUDA_LIBRARY", "/nonexistent/libbrisk_cuda.so", 1);
  std::string why;
  auto b = core::load_cuda_backend(&why);
  if (old) {
    setenv("BRISK_CUDA_LIBRARY", saved.c_str(), 1);
  } else {
    unsetenv("BRISK_CUDA_LIBRARY");
  }
  if (!b && why.find("no GPU") == std::string::npos && why.find("CUDA device") == std::string::npos) {
    EXPECT_NE(why.find("/nonexistent/libbrisk_cuda.so"), std::string::npos) << why;
  }
}

// Without a backend nothing else crashes either: passing no reason pointer is fine.
TEST(CudaBackendLoader, NullReasonPointer) {
  std::unique_ptr<core::Backend> b;
  EXPECT_NO_THROW(b = core::load_cuda_backend());
}

// ---- kernels on the device ---------------------------------------------------------

class CudaBackendTest : public ::testing::Test {
 protected:
  // One backend for the suite: creating a CUDA context is slow.
  static void SetUpTestSuite() { backend_ = core::load_cuda_backend(&reason_).release(); }
  static void TearDownTestSuite() {
    delete backend_;
    backend_ = nullptr;
  }
  void SetUp() override {
    if (!backend_) GTEST_SKIP() << "CUDA backend unavailable: " << reason_;
  }

  // Runs `op` on the reference backend and on the CUDA backend with the same
  // host inputs; returns the largest normalized max error over the outputs.
  static double compare(OpKind op, const std::vector<Tensor>& inputs, const ops::OpParams& params) {
    ops::register_ops();
    core::Backend& cuda = *backend_;
    std::vector<core::TensorMeta> metas;
    for (const Tensor& t : inputs) metas.push_back(t.meta());
    const std::vector<core::TensorMeta> out_metas = core::op_def(op).infer(metas, params);

    std::vector<core::TensorView> in_h, out_h, in_d, out_d;
    std::vector<Tensor> ref_out, dev_in, dev_out;
    for (const Tensor& t : inputs) {
      in_h.push_back(t.as_view());
      Tensor d = Tensor::empty(t.shape(), t.dtype(), cuda.allocator(), cuda.device());
      cuda.copy_to_device(d.data(), t.data(), t.bytes());
      in_d.push_back(d.as_view());
      dev_in.push_back(d);
    }
    for (size_t o = 0; o < out_metas.size(); ++o) {
      const core::TensorMeta& m = out_metas[o];
      // An output over an input (an accumulator): on the device the input's
      // own buffer, as the executor binds it; on the host a copy of the input.
      const int alias = core::op_def(op).alias_of(o, inputs.size());
      ref_out.push_back(Tensor::empty(m.shape, m.dtype));
      if (alias >= 0) std::memcpy(ref_out.back().data(), inputs[size_t(alias)].data(), inputs[size_t(alias)].bytes());
      out_h.push_back(ref_out.back().as_view());
      dev_out.push_back(alias >= 0 ? dev_in[size_t(alias)] : Tensor::empty(m.shape, m.dtype, cuda.allocator(), cuda.device()));
      out_d.push_back(dev_out.back().as_view());
    }
    ops::ReferenceBackend ref;
    core::run_op(ref, op, in_h, out_h, params);
    core::run_op(cuda, op, in_d, out_d, params);
    cuda.synchronize();

    double worst = 0.0;
    for (size_t o = 0; o < out_metas.size(); ++o) {
      Tensor got = Tensor::empty(out_metas[o].shape, out_metas[o].dtype);
      cuda.copy_to_host(got.data(), dev_out[o].data(), got.bytes());
      double max_err = 0.0, max_ref = 0.0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        const double r = ref_out[o].item(i), y = got.item(i);
        if (!std::isfinite(y)) return INFINITY;
        max_err = std::max(max_err, std::abs(y - r));
        max_ref = std::max(max_ref, std::abs(r));
      }
      worst = std::max(worst, max_err / std::max(max_ref, 1e-30));
    }
    return worst;
  }

  static double tolerance(DType t) { return t == DType::f32 ? 1e-4 : 2e-2; }

  static inline core::Backend* backend_ = nullptr;
  static inline std::string reason_;
};

const DType kTypes[] = {DType::f32, DType::bf16};

std::string label(DType t, const std::vector<Tensor>& in) {
  std::string s(core::dtype_name(t));
  for (const Tensor& x : in) s += " " + x.shape().str();
  return s;
}

TEST_F(CudaBackendTest, Supports) {
  for (DType t : kTypes)
    for (OpKind op : {OpKind::add, OpKind::scale, OpKind::matmul, OpKind::linear})
      EXPECT_TRUE(backend_->supports(op, t)) << core::op_name(op) << " " << core::dtype_name(t);
}

TEST_F(CudaBackendTest, Add) {
  uint64_t seed = 1;
  for (DType t : kTypes)
    for (auto [a, b] : std::vector<std::pair<Shape, Shape>>{{{7, 13}, {7, 13}},
                                                             {{2, 5, 33}, {33}},
                                                             {{3, 4, 9}, {4, 9}},
                                                             {{1}, {1}},
                                                             {{1000, 257}, {257}}}) {
      std::vector<Tensor> in{Tensor::uniform(a, t, seed++, -1.f, 1.f), Tensor::uniform(b, t, seed++, -1.f, 1.f)};
      EXPECT_LE(compare(OpKind::add, in, ops::NoParams{}), tolerance(t)) << label(t, in);
    }
}

TEST_F(CudaBackendTest, Scale) {
  uint64_t seed = 100;
  for (DType t : kTypes)
    for (Shape s : {Shape{5, 17}, Shape{64}, Shape{3, 3, 3}, Shape{70001}}) {
      std::vector<Tensor> in{Tensor::uniform(s, t, seed++, -2.f, 2.f)};
      EXPECT_LE(compare(OpKind::scale, in, ops::ScaleParams{-1.7f}), tolerance(t)) << label(t, in);
    }
}

// A stored (M, K) or (K, M); B stored (K, N) or (N, K), with optional batch dims.
Shape stored(std::vector<int64_t> batch, int64_t rows, int64_t cols, bool trans) {
  Shape s(batch.begin(), batch.end());
  s.push_back(trans ? cols : rows);
  s.push_back(trans ? rows : cols);
  return s;
}

struct MatmulShape {
  std::vector<int64_t> batch_a, batch_b;
  int64_t m, k, n;
};

TEST_F(CudaBackendTest, Matmul) {
  const std::vector<MatmulShape> shapes = {
      {{}, {}, 1, 1, 1},         {{}, {}, 7, 13, 5},          {{}, {}, 33, 17, 65},
      {{}, {}, 64, 128, 96},     {{}, {}, 1, 300, 1},         {{3}, {}, 7, 13, 9},      // shared B
      {{2, 3}, {}, 5, 16, 11},   {{2, 3}, {2, 3}, 5, 16, 11}, {{4}, {4}, 33, 7, 13},   // per-batch B
      {{2}, {2}, 128, 64, 256},
  };
  uint64_t seed = 1000;
  for (DType t : kTypes)
    for (const MatmulShape& s : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          std::vector<Tensor> in{Tensor::uniform(stored(s.batch_a, s.m, s.k, ta), t, seed++, -1.f, 1.f),
                                 Tensor::uniform(stored(s.batch_b, s.k, s.n, tb), t, seed++, -1.f, 1.f)};
          EXPECT_LE(compare(OpKind::matmul, in, ops::MatmulParams{ta, tb}), tolerance(t))
              << label(t, in) << " trans_a=" << ta << " trans_b=" << tb;
        }
}

TEST_F(CudaBackendTest, Linear) {
  uint64_t seed = 5000;
  for (DType t : kTypes) {
    for (auto [x, out] : std::vector<std::pair<Shape, int64_t>>{{{7, 13}, 33}, {{2, 5, 16}, 24}, {{3, 4, 9}, 11},
                                                                 {{256, 64}, 128}}) {
      const int64_t k = x[x.rank() - 1];
      std::vector<Tensor> with_bias{Tensor::uniform(x, t, seed++, -1.f, 1.f),
                                    Tensor::uniform({out, k}, t, seed++, -1.f, 1.f),
                                    Tensor::uniform({out}, t, seed++, -1.f, 1.f)};
      EXPECT_LE(compare(OpKind::linear, with_bias, ops::NoParams{}), tolerance(t)) << label(t, with_bias);
      std::vector<Tensor> no_bias{with_bias[0], with_bias[1]};
      EXPECT_LE(compare(OpKind::linear, no_bias, ops::NoParams{}), tolerance(t)) << label(t, no_bias);
    }
  }
}

// Gradients summed into an f32 accumulator (core::grad_sink, the fused
// classifier's dw_into): beta = 1 products with f32 and bf16 operands,
// bias column sums, the embedding's scatter-add, and a bf16 head's weight
// gradient into f32. The
// accumulators are random, so a kernel that overwrites them fails.
TEST_F(CudaBackendTest, GradientsSummedIntoAnF32Accumulator) {
  uint64_t seed = 9000;
  for (DType t : kTypes) {
    for (auto [ta, tb] : std::vector<std::pair<bool, bool>>{{true, false}, {false, true}, {false, false}}) {
      const int64_t m = 96, k = 200, n = 40;
      std::vector<Tensor> in{Tensor::uniform(stored({}, m, k, ta), t, seed++, -1.f, 1.f),
                             Tensor::uniform(stored({}, k, n, tb), t, seed++, -1.f, 1.f),
                             Tensor::uniform({m, n}, DType::f32, seed++, -1.f, 1.f)};
      EXPECT_LE(compare(OpKind::matmul, in, ops::MatmulParams{ta, tb}), tolerance(t))
          << "matmul into f32, " << label(t, in) << " trans_a=" << ta << " trans_b=" << tb;
    }
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{5, 33}, {2048, 384}, {300, 7}}) {
      std::vector<Tensor> col{Tensor::uniform({rows, cols}, t, seed++, -1.f, 1.f),
                              Tensor::uniform({cols}, DType::f32, seed++, -1.f, 1.f)};
      EXPECT_LE(compare(OpKind::sum, col, ops::ReduceParams{0, false}), tolerance(t))
          << "column sum into f32, " << label(t, col);
    }
    const int64_t N = 37, C = 24, V = 301;
    Tensor targets = Tensor::empty({N}, DType::i32);
    for (int64_t i = 0; i < N; ++i) targets.data_as<int32_t>()[i] = int32_t((i * 97 + 5) % V);
    std::vector<Tensor> head{Tensor::uniform({N, C}, t, seed++, -1.f, 1.f), Tensor::uniform({V, C}, t, seed++, -1.f, 1.f),
                             targets, Tensor::uniform({}, DType::f32, seed++, 0.5f, 1.5f),
                             Tensor::uniform({V, C}, DType::f32, seed++, -1.f, 1.f)};
    EXPECT_LE(compare(OpKind::classifier_train, head, ops::CrossEntropyParams{-100}), tolerance(t))
        << "classifier_train, dw into f32, " << label(t, head);
  }
  Tensor ids = Tensor::empty({4, 64}, DType::i32);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data_as<int32_t>()[i] = int32_t((i * 13 + 7) % 50);
  std::vector<Tensor> emb{Tensor::uniform({4, 64, 48}, DType::f32, seed++, -1.f, 1.f), ids,
                          Tensor::uniform({50, 48}, DType::f32, seed++, -1.f, 1.f)};
  EXPECT_LE(compare(OpKind::embedding_backward, emb, ops::EmbeddingBackwardParams{50}), tolerance(DType::f32))
      << "embedding_backward into f32";
}

// Device buffers round-trip unchanged through the allocator and the copies.
TEST_F(CudaBackendTest, CopyRoundTrip) {
  Tensor h = Tensor::uniform({1 << 20}, DType::f32, 7, -1.f, 1.f);
  Tensor d = Tensor::empty(h.shape(), h.dtype(), backend_->allocator(), backend_->device());
  backend_->copy_to_device(d.data(), h.data(), h.bytes());
  Tensor back = Tensor::empty(h.shape(), h.dtype());
  backend_->copy_to_host(back.data(), d.data(), h.bytes());
  EXPECT_EQ(0, std::memcmp(h.data(), back.data(), h.bytes()));
}

}  // namespace

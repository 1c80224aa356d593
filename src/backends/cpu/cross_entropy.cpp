// CPU kernels for cross_entropy and cross_entropy_backward, f32 and bf16
// logits. Rows (tokens) are split across threads; each row is a max pass and
// an exp-sum pass over V logits (vectorised fast_exp: with a 50k vocabulary
// this op is all exponentials). Targets are validated on the calling thread
// before any parallel region, so a bad target throws a core::Error instead of
// escaping an OpenMP region or reading out of bounds. The mean is summed
// serially in double over the per-row values: N is small next to N * V, and
// the loss is then identical for any thread count. With label smoothing the
// forward also sums each kept row's logits, in double (in the same parallel
// pass, into a buffer that grows once and stays), and the backward
// subtracts the smoothed target (1 - e) onehot + e / V. Class weights w (an
// optional last input) weight each kept row by w[t] and its smoothing sum
// by w_j, and the mean divides by the kept rows' sum of w[t] (the op's
// formulas: src/ops/cross_entropy.cpp); without them the loops are the
// unweighted ones.
#include <cmath>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/op.h"
#include "cpu_util.h"
#include "kernels.h"
#include "vec_math.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;


// Checks every target and returns how many are kept.
int64_t check_targets(const char* op, const int32_t* t, int64_t n, int64_t v, int ignore) {
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (t[r] == ignore) continue;
    if (t[r] < 0 || t[r] >= v)
      throw core::Error(std::string(op) + ": target " + std::to_string(t[r]) + " at position " + std::to_string(r) +
                        " is out of range [0, " + std::to_string(v) + ") and is not ignore_index (" +
                        std::to_string(ignore) + ")");
    ++count;
  }
  return count;
}

// The mean's denominator, the kept rows' sum of w[t] (their count without
// class weights), and sum_j w_j (V without), for the forward and the backward alike.
struct WeightSums {
  double kept, all;
};
WeightSums weight_sums(const int32_t* t, int64_t n, int64_t v, int ignore, const float* w, int64_t count) {
  if (!w) return {double(count), double(v)};
  WeightSums s{0.0, 0.0};
  for (int64_t r = 0; r < n; ++r) s.kept += t[r] == ignore ? 0.0 : double(w[t[r]]);
  for (int64_t j = 0; j < v; ++j) s.all += double(w[j]);
  return s;
}

template <class T>
void cross_entropy_kernel(const KernelCall& c) {
  const T* x = c.in(0).as<const T>();
  const int32_t* t = c.in(1).as<const int32_t>();
  float* loss = c.out(0).as<float>();
  float* lse = c.out(1).as<float>();
  const int64_t n = c.in(0).shape()[0], v = c.in(0).shape()[1];
  const int ignore = c.p<core::CrossEntropyParams>().ignore_index;
  const float e = c.p<core::CrossEntropyParams>().label_smoothing;
  const float* w = c.inputs.size() > 2 ? c.in(2).as<const float>() : nullptr;  // class weights (V)
  const WeightSums ws = weight_sums(t, n, v, ignore, w, check_targets("cross_entropy", t, n, v, ignore));
  thread_local std::vector<double> row_sums;  // label smoothing: each row's (weighted) sum of logits
  if (e != 0.f && row_sums.size() < size_t(n)) row_sums.resize(size_t(n));
  double* sums = row_sums.data();
  parallel_for(n, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(v, 1) / 4), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * v;
      float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < v; ++j) mx = max_step(mx, widen(xr[j]));
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < v; ++j) s += fast_exp(widen(xr[j]) - mx);
      lse[r] = mx + std::log(s);
      if (e != 0.f && t[r] != ignore) {
        double all = 0.0;
        if (w) {
#pragma omp simd reduction(+ : all)
          for (int64_t j = 0; j < v; ++j) all += double(w[j]) * double(widen(xr[j]));
        } else {
#pragma omp simd reduction(+ : all)
          for (int64_t j = 0; j < v; ++j) all += double(widen(xr[j]));
        }
        sums[r] = all;
      }
    }
  });
  double total = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    if (t[r] == ignore) continue;
    const double wt = w ? double(w[t[r]]) : 1.0;
    const double nll = double(lse[r]) - double(widen(x[r * v + t[r]]));
    if (e == 0.f) {
      total += wt * nll;
      continue;
    }
    // e / V * sum_j w_j (lse - x_j) = e / V * (W lse - sum_j w_j x_j), W = sum_j w_j; sums[]
    // holds this row's sum only with smoothing on
    const double smooth = w ? e / double(v) * (ws.all * double(lse[r]) - sums[r])
                            : e * (double(lse[r]) - sums[r] / double(v));  // the same, unweighted
    total += (1.0 - e) * wt * nll + smooth;
  }
  // A batch whose kept rows all weigh 0 has loss 0 (and gradient 0), as one with every target ignored.
  loss[0] = ws.kept != 0.0 ? float(total / ws.kept) : 0.f;
}

// dlogits = dloss / count * (softmax - target), target the onehot or its
// smoothed (1 - e) onehot + e / V; rows of ignored targets are zero.
template <class T>
void cross_entropy_backward_kernel(const KernelCall& c) {
  const T* x = c.in(0).as<const T>();
  const int32_t* t = c.in(1).as<const int32_t>();
  const float* lse = c.in(2).as<const float>();
  T* dx = c.out(0).as<T>();
  const int64_t n = c.in(0).shape()[0], v = c.in(0).shape()[1];
  const int ignore = c.p<core::CrossEntropyParams>().ignore_index;
  const float* w = c.inputs.size() > 4 ? c.in(4).as<const float>() : nullptr;  // class weights (V)
  const WeightSums ws = weight_sums(t, n, v, ignore, w, check_targets("cross_entropy_backward", t, n, v, ignore));
  const float scale = ws.kept != 0.0 ? float(double(c.in(3).as<const float>()[0]) / ws.kept) : 0.f;
  const float e = c.p<core::CrossEntropyParams>().label_smoothing;
  const float spread = e / float(v), hit = 1.f - e + spread;  // the smoothed target off and at the label
  parallel_for(n, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(v, 1) / 4), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * v;
      T* dr = dx + r * v;
      if (t[r] == ignore) {
        std::fill(dr, dr + v, narrow<T>(0.f));
        continue;
      }
      const float l = lse[r];
      if (!w) {
#pragma omp simd
        for (int64_t j = 0; j < v; ++j) dr[j] = narrow<T>(scale * (fast_exp(widen(xr[j]) - l) - spread));
        dr[t[r]] = narrow<T>(scale * (fast_exp(widen(xr[t[r]]) - l) - hit));
        continue;
      }
      // (w[t] (1 - e) + e / V sum_k w_k) p_j - e / V w_j, less w[t] (1 - e) at the label
      const float wt = w[t[r]], a = wt * (1.f - e) + float(double(e) / double(v) * ws.all);
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) dr[j] = narrow<T>(scale * (a * fast_exp(widen(xr[j]) - l) - spread * w[j]));
      dr[t[r]] = narrow<T>(scale * (a * fast_exp(widen(xr[t[r]]) - l) - spread * wt - wt * (1.f - e)));
    }
  });
}

}  // namespace

void register_cross_entropy_kernels(core::KernelRegistry& r) {
  using core::DType;
  using core::OpKind;
  r.add(OpKind::cross_entropy, DType::f32, cross_entropy_kernel<float>);
  r.add(OpKind::cross_entropy, DType::bf16, cross_entropy_kernel<uint16_t>);
  r.add(OpKind::cross_entropy_backward, DType::f32, cross_entropy_backward_kernel<float>);
  r.add(OpKind::cross_entropy_backward, DType::bf16, cross_entropy_backward_kernel<uint16_t>);
  // f16 logits (fp16 mixed precision): the loss and lse still come out in f32.
  r.add(OpKind::cross_entropy, DType::f16, cross_entropy_kernel<core::f16>);
  r.add(OpKind::cross_entropy_backward, DType::f16, cross_entropy_backward_kernel<core::f16>);
}

}  // namespace brisk::cpu

// Bag-of-words logistic regression (bow_baseline.h).
#include "brisk/train/bow_baseline.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace brisk::train {

BowRecord bow_features(std::span<const int32_t> tokens, int32_t label, int64_t max_len) {
  std::vector<int32_t> ids(tokens.begin(), tokens.begin() + std::min<int64_t>(int64_t(tokens.size()), max_len));
  std::sort(ids.begin(), ids.end());
  BowRecord r;
  r.label = label;
  double norm = 0;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    const float w = std::log1p(float(j - i));
    r.features.emplace_back(ids[i], w);
    norm += double(w) * w;
    i = j;
  }
  const float inv = norm > 0 ? float(1 / std::sqrt(norm)) : 0.f;
  for (auto& f : r.features) f.second *= inv;
  return r;
}

namespace {

// W (K x V) and b (K), softmax over K.
struct Linear {
  int64_t K, V;
  std::vector<float> w, b;
  Linear(int64_t k, int64_t v) : K(k), V(v), w(size_t(k * v), 0.f), b(size_t(k), 0.f) {}

  void probs(const BowRecord& r, float* p) const {
    float mx = -1e30f;
    for (int64_t k = 0; k < K; ++k) {
      float z = b[size_t(k)];
      for (const auto& [id, x] : r.features) z += w[size_t(k * V + id)] * x;
      p[k] = z;
      mx = std::max(mx, z);
    }
    float sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += (p[k] = std::exp(p[k] - mx));
    for (int64_t k = 0; k < K; ++k) p[k] /= sum;
  }
};

ClassMetrics score(const Linear& m, const std::vector<BowRecord>& data) {
  std::vector<int32_t> labels;
  std::vector<float> probs(data.size() * size_t(m.K));
  for (size_t i = 0; i < data.size(); ++i) {
    labels.push_back(data[i].label);
    m.probs(data[i], probs.data() + i * size_t(m.K));
  }
  return classification_metrics(labels, probs, m.K);
}

// SGD with a 1/sqrt(t) step. L2 is applied lazily, as a multiplicative
// shrink of the whole model folded into a scalar, so a step costs only the
// record's non-zeros.
Linear fit(const std::vector<BowRecord>& train, int64_t K, int64_t V, double l2, int64_t epochs, uint64_t seed) {
  Linear m(K, V);
  std::vector<size_t> order(train.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::mt19937_64 rng(seed);
  double scale = 1;  // true weights = scale * m.w (biases are not decayed)
  std::vector<float> p(static_cast<size_t>(K));
  int64_t t = 0;
  for (int64_t e = 0; e < epochs; ++e) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      const BowRecord& r = train[i];
      const double lr = 0.5 / std::sqrt(1.0 + double(t++) / 100.0);
      // Forward with the scaled weights.
      float mx = -1e30f;
      for (int64_t k = 0; k < K; ++k) {
        double z = m.b[size_t(k)];
        for (const auto& [id, x] : r.features) z += scale * m.w[size_t(k * V + id)] * x;
        p[size_t(k)] = float(z);
        mx = std::max(mx, p[size_t(k)]);
      }
      float sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += (p[size_t(k)] = std::exp(p[size_t(k)] - mx));
      scale *= 1 - lr * l2;
      for (int64_t k = 0; k < K; ++k) {
        const double g = p[size_t(k)] / sum - (k == r.label ? 1.0 : 0.0);
        m.b[size_t(k)] -= float(lr * g);
        for (const auto& [id, x] : r.features) m.w[size_t(k * V + id)] -= float(lr * g * x / scale);
      }
      if (scale < 1e-6) {  // fold the scale back in before it underflows
        for (float& w : m.w) w *= float(scale);
        scale = 1;
      }
    }
  }
  for (float& w : m.w) w *= float(scale);
  return m;
}

}  // namespace

BowBaseline bow_baseline(const std::vector<BowRecord>& train, const std::vector<BowRecord>& val,
                         const std::vector<BowRecord>& test, int64_t K, int64_t V, uint64_t seed) {
  BowBaseline best;
  double best_val = -1;
  constexpr int64_t kEpochs = 20;
  for (double l2 : {1e-6, 1e-5, 1e-4}) {
    const Linear m = fit(train, K, V, l2, kEpochs, seed);
    const ClassMetrics v = val.empty() ? score(m, train) : score(m, val);
    const double key = K == 2 ? v.f1 : v.accuracy;
    if (key > best_val) {
      best_val = key;
      best.l2 = l2;
      best.epochs = kEpochs;
      best.val = v;
      best.test = score(m, test);
    }
  }
  return best;
}

}  // namespace brisk::train

// Classification metrics (classify_metrics.h).
#include "brisk/train/classify_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include <nlohmann/json.hpp>

#include "brisk/core/error.h"

namespace brisk::train {

double roc_auc(std::span<const int32_t> labels, std::span<const double> scores) {
  const size_t n = labels.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Sum of the positives' ranks, tied scores sharing their mean rank.
  double rank_sum = 0;
  int64_t pos = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double mean_rank = (double(i) + double(j - 1)) / 2 + 1;
    for (size_t k = i; k < j; ++k)
      if (labels[order[k]] == 1) rank_sum += mean_rank, ++pos;
    i = j;
  }
  const int64_t neg = int64_t(std::count(labels.begin(), labels.end(), 0));
  if (pos == 0 || neg == 0) return -1;
  return (rank_sum - double(pos) * double(pos + 1) / 2) / (double(pos) * double(neg));
}

ClassMetrics classification_metrics(std::span<const int32_t> labels, std::span<const float> probs, int64_t K) {
  if (K < 2 || probs.size() != labels.size() * size_t(K))
    throw core::ShapeError("classification_metrics: probs must hold labels x n_classes values");
  ClassMetrics m;
  m.count = int64_t(labels.size());
  m.confusion.assign(size_t(K), std::vector<int64_t>(size_t(K), 0));
  std::vector<double> positive_score(labels.size());
  double loss = 0;
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    const float* p = probs.data() + i * size_t(K);
    const int32_t y = labels[i];
    if (y < 0 || y >= K) throw core::ShapeError("classification_metrics: label " + std::to_string(y) + " out of range");
    const int64_t pred = std::max_element(p, p + K) - p;
    ++m.confusion[size_t(y)][size_t(pred)];
    correct += pred == y;
    loss -= std::log(std::max(double(p[y]), 1e-30));
    positive_score[i] = K == 2 ? double(p[1]) : 0.0;
  }
  m.accuracy = m.count ? double(correct) / double(m.count) : 0;
  m.loss = m.count ? loss / double(m.count) : 0;
  auto prf = [&](int64_t k, double& precision, double& recall, double& f1) {
    int64_t tp = m.confusion[size_t(k)][size_t(k)], fp = 0, fn = 0;
    for (int64_t j = 0; j < K; ++j)
      if (j != k) fp += m.confusion[size_t(j)][size_t(k)], fn += m.confusion[size_t(k)][size_t(j)];
    precision = tp + fp ? double(tp) / double(tp + fp) : 0;
    recall = tp + fn ? double(tp) / double(tp + fn) : 0;
    f1 = precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0;
  };
  if (K == 2) {
    prf(1, m.precision, m.recall, m.f1);
    m.roc_auc = roc_auc(labels, positive_score);
  } else {
    for (int64_t k = 0; k < K; ++k) {
      double p, r, f;
      prf(k, p, r, f);
      m.precision += p / double(K), m.recall += r / double(K), m.f1 += f / double(K);
    }
  }
  return m;
}

std::string metrics_json(const ClassMetrics& m) {
  nlohmann::json j = {{"count", m.count},   {"accuracy", m.accuracy}, {"precision", m.precision},
                      {"recall", m.recall}, {"f1", m.f1},             {"loss", m.loss},
                      {"confusion", m.confusion}};
  if (m.roc_auc >= 0) j["roc_auc"] = m.roc_auc;
  return j.dump();
}

std::string format_metrics(const ClassMetrics& m, const std::vector<std::string>& names, const std::string& indent) {
  char line[256];
  std::string s;
  std::snprintf(line, sizeof line, "%saccuracy %.4f  precision %.4f  recall %.4f  F1 %.4f", indent.c_str(), m.accuracy,
                m.precision, m.recall, m.f1);
  s += line;
  if (m.roc_auc >= 0) {
    std::snprintf(line, sizeof line, "  ROC AUC %.4f", m.roc_auc);
    s += line;
  }
  std::snprintf(line, sizeof line, "  (%lld records)\n", (long long)m.count);
  s += line;
  size_t w = 6;
  for (const std::string& n : names) w = std::max(w, n.size() + 1);
  s += indent + "confusion (rows: true, columns: predicted)\n" + indent + std::string(w, ' ');
  for (const std::string& n : names) s += std::string(w - n.size(), ' ') + n;
  s += "\n";
  for (size_t r = 0; r < m.confusion.size(); ++r) {
    const std::string& n = r < names.size() ? names[r] : std::to_string(r);
    s += indent + n + std::string(w - n.size(), ' ');
    for (int64_t v : m.confusion[r]) {
      const std::string c = std::to_string(v);
      s += std::string(w > c.size() ? w - c.size() : 1, ' ') + c;
    }
    s += "\n";
  }
  return s;
}

}  // namespace brisk::train

// The classifier run's pieces, each against an independent brute force: the
// stratified split, ROC AUC, precision/recall/F1 and the confusion matrix,
// the bag-of-words features and baseline, and the config's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "brisk/core/error.h"
#include "brisk/train/bow_baseline.h"
#include "brisk/train/classifier_trainer.h"
#include "brisk/train/classify_config.h"
#include "brisk/train/classify_metrics.h"

using namespace brisk;
using namespace brisk::train;

TEST(StratifiedSplit, PartsAreDisjointCoverEveryRecordAndKeepEachLabelsShare) {
  std::vector<int32_t> labels;
  std::mt19937 rng(3);
  for (int i = 0; i < 1003; ++i) labels.push_back(rng() % 10 < 3 ? 1 : 0);
  labels[5] = -1;  // left out (an empty record)
  const Split s = stratified_split(labels, 0.8, 0.1, 42);
  std::set<int64_t> seen;
  for (const auto* part : {&s.train, &s.val, &s.test}) {
    EXPECT_TRUE(std::is_sorted(part->begin(), part->end()));
    for (int64_t i : *part) EXPECT_TRUE(seen.insert(i).second) << "record " << i << " in two parts";
  }
  EXPECT_EQ(seen.size(), 1002u);
  EXPECT_FALSE(seen.count(5));
  for (int32_t k : {0, 1}) {
    const double n = double(std::count(labels.begin(), labels.end(), k));
    auto share = [&](const std::vector<int64_t>& part) {
      return double(std::count_if(part.begin(), part.end(), [&](int64_t i) { return labels[size_t(i)] == k; })) / n;
    };
    EXPECT_NEAR(share(s.train), 0.8, 1.0 / n + 1e-9) << "label " << k;
    EXPECT_NEAR(share(s.val), 0.1, 1.0 / n + 1e-9) << "label " << k;
  }
  const Split again = stratified_split(labels, 0.8, 0.1, 42), other = stratified_split(labels, 0.8, 0.1, 43);
  EXPECT_EQ(again.test, s.test);
  EXPECT_NE(other.test, s.test);
}

// A message and its copy in different parts scored the model on text it
// trained on: a record whose tokens repeat an earlier record's is in no
// part, whatever its label, and neither is an empty record.
TEST(StratifiedSplit, EmptyRecordsAndRepeatsOfEarlierRecordsAreInNoPart) {
  const std::vector<int32_t> labels{0, 1, 0, 1, 0, 1};
  const std::vector<int64_t> lengths{3, 4, 0, 4, 3, 5};
  const std::vector<std::string> digests{"a", "b", "empty", "b", "a", "c"};
  int64_t empty = 0, repeats = 0;
  const std::vector<int32_t> kept = split_labels_of(labels, lengths, digests, empty, repeats);
  EXPECT_EQ(kept, (std::vector<int32_t>{0, 1, -1, -1, -1, 1}));
  EXPECT_EQ(empty, 1);
  EXPECT_EQ(repeats, 2);
  const Split s = stratified_split(kept, 0.5, 0.0, 7);
  std::set<int64_t> all;
  for (const auto* part : {&s.train, &s.val, &s.test}) all.insert(part->begin(), part->end());
  EXPECT_EQ(all, (std::set<int64_t>{0, 1, 5}));
}

TEST(ClassMetrics, RocAucMatchesTheCountOverAllPairs) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<int32_t> labels;
    std::vector<double> scores;
    for (int i = 0; i < 200; ++i) {
      labels.push_back(rng() % 3 == 0);
      scores.push_back(double(rng() % 20) / 20 + 0.3 * labels.back());  // many ties
    }
    double wins = 0, pairs = 0;
    for (size_t i = 0; i < labels.size(); ++i)
      for (size_t j = 0; j < labels.size(); ++j)
        if (labels[i] == 1 && labels[j] == 0) {
          pairs += 1;
          wins += scores[i] > scores[j] ? 1 : scores[i] == scores[j] ? 0.5 : 0;
        }
    EXPECT_NEAR(roc_auc(labels, scores), wins / pairs, 1e-12);
  }
  EXPECT_EQ(roc_auc(std::vector<int32_t>{1, 1}, std::vector<double>{0.1, 0.2}), -1);
}

TEST(ClassMetrics, FiguresMatchTheirDefinitionsForTwoAndThreeClasses) {
  std::mt19937 rng(4);
  for (int64_t K : {2, 3}) {
    std::vector<int32_t> labels;
    std::vector<float> probs;
    for (int i = 0; i < 300; ++i) {
      labels.push_back(int32_t(rng() % K));
      std::vector<float> p(static_cast<size_t>(K));
      float sum = 0;
      for (auto& v : p) sum += (v = float(rng() % 1000 + 1));
      p[size_t(labels.back())] += sum;  // mostly right
      sum *= 2;
      for (auto& v : p) probs.push_back(v / sum);
    }
    const ClassMetrics m = classification_metrics(labels, probs, K);
    std::vector<std::vector<int64_t>> conf(static_cast<size_t>(K), std::vector<int64_t>(static_cast<size_t>(K)));
    double loss = 0;
    for (size_t i = 0; i < labels.size(); ++i) {
      const float* p = probs.data() + i * size_t(K);
      ++conf[size_t(labels[i])][size_t(std::max_element(p, p + K) - p)];
      loss -= std::log(p[labels[i]]);
    }
    EXPECT_EQ(m.confusion, conf);
    EXPECT_NEAR(m.loss, loss / 300, 1e-6);
    int64_t correct = 0;
    for (int64_t k = 0; k < K; ++k) correct += conf[size_t(k)][size_t(k)];
    EXPECT_DOUBLE_EQ(m.accuracy, double(correct) / 300);
    auto f1_of = [&](int64_t k) {
      double tp = double(conf[size_t(k)][size_t(k)]), pred = 0, real = 0;
      for (int64_t j = 0; j < K; ++j) pred += double(conf[size_t(j)][size_t(k)]), real += double(conf[size_t(k)][size_t(j)]);
      return 2 * (tp / pred) * (tp / real) / (tp / pred + tp / real);
    };
    if (K == 2) {
      EXPECT_NEAR(m.f1, f1_of(1), 1e-12);
      EXPECT_GT(m.roc_auc, 0.5);
    } else {
      EXPECT_NEAR(m.f1, (f1_of(0) + f1_of(1) + f1_of(2)) / 3, 1e-12);
      EXPECT_EQ(m.roc_auc, -1);
    }
  }
}

TEST(BowBaseline, FeaturesAreLogCountsOfUnitLength) {
  const BowRecord r = bow_features(std::vector<int32_t>{4, 2, 4, 4, 9, 2, 7}, 1, 6);  // the 7 is past max_len
  ASSERT_EQ(r.features.size(), 3u);
  EXPECT_EQ(r.features[0].first, 2);
  EXPECT_EQ(r.features[2].first, 9);
  double norm = 0;
  for (const auto& f : r.features) norm += double(f.second) * f.second;
  EXPECT_NEAR(norm, 1, 1e-6);
  EXPECT_NEAR(r.features[1].second / r.features[0].second, std::log1p(3.f) / std::log1p(2.f), 1e-6);
}

TEST(BowBaseline, LearnsWhichTokensMarkAClassAndScoresItsTestSplit) {
  std::mt19937 rng(5);
  auto make = [&](int n) {
    std::vector<BowRecord> out;
    for (int i = 0; i < n; ++i) {
      const int32_t label = int32_t(rng() % 2);
      std::vector<int32_t> t;
      for (int k = 0; k < 20; ++k) t.push_back(int32_t(rng() % 100));  // noise shared by both classes
      for (int k = 0; k < 3; ++k) t.push_back(int32_t(100 + label * 10 + rng() % 10));
      out.push_back(bow_features(t, label, 1000));
    }
    return out;
  };
  const auto train = make(400), val = make(100), test = make(100);
  const BowBaseline b = bow_baseline(train, val, test, 2, 120, 1);
  EXPECT_GE(b.test.accuracy, 0.95);
  EXPECT_EQ(b.test.count, 100);
  EXPECT_GT(b.l2, 0);
}

TEST(ClassifyConfig, EveryKeyIsCheckedAndNamed) {
  auto error_of = [](const std::string& text, std::vector<std::string> sets = {}) {
    try {
      parse_classify_config(text, "c.toml", sets);
    } catch (const core::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string base = "[model]\nkind = \"encoder\"\npreset = \"E1\"\n";
  EXPECT_EQ(error_of(base), "no error");
  EXPECT_NE(error_of(base + "[train]\nepoch = 3\n").find("unknown key 'train.epoch'"), std::string::npos);
  EXPECT_NE(error_of(base + "[data]\nlabel_names = [\"ham\"]\n").find("has 1 names but model.n_classes is 2"),
            std::string::npos);
  EXPECT_NE(error_of(base, {"data.train_frac=0.95"}).find("data.train_frac"), std::string::npos);
  EXPECT_NE(error_of(base, {"model.preset=E9"}).find("unknown encoder preset 'E9'"), std::string::npos);
  EXPECT_NE(error_of(base, {"model.n_head=3"}).find("divisible"), std::string::npos);
  EXPECT_NE(error_of(base, {"train.batch=0"}).find("train.batch must be positive"), std::string::npos);
  EXPECT_NE(error_of(base, {"checkpoint.every=-1"}).find("checkpoint.every must not be negative"), std::string::npos);
  EXPECT_EQ(error_of(base, {"data.cache_mb=0"}), "no error");  // no cache
  EXPECT_NE(error_of(base, {"data.cache_mb=99999999999"}).find("data.cache_mb must be in [0,"), std::string::npos);
  EXPECT_NE(error_of(base, {"train.precision=fp8"}).find("train.precision: unknown value 'fp8'"), std::string::npos);
  EXPECT_NE(error_of(base, {"train.precision=fp16"}).find("fp16 is not available for encoder-bodied runs"),
            std::string::npos);
  EXPECT_EQ(error_of(base, {"train.precision=bf16"}), "no error");
  // The written config reads back to the same run.
  const ClassifyConfig c = parse_classify_config(
      base + "[data]\nlabel_names = [\"ham\", \"spam\"]\n[train]\nprecision = \"bf16\"\n"
             "precision_fallback = false\n[checkpoint]\nevery = 50\n",
      "c.toml");
  EXPECT_EQ(c.precision, Precision::bf16);
  const ClassifyConfig back = parse_classify_config(to_toml(c), "back.toml");
  EXPECT_EQ(back.label_names, c.label_names);
  EXPECT_TRUE(back.model.same_shape(c.model));
  EXPECT_EQ(back.epochs, c.epochs);
  EXPECT_EQ(back.checkpoint_every, 50);
  EXPECT_EQ(back.precision, Precision::bf16);
  EXPECT_FALSE(back.precision_fallback);
}

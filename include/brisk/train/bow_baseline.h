// The plain baseline an encoder classifier is reported beside: multinomial
// logistic regression on bag-of-words counts of the same tokens the encoder
// sees (each record's first max_len tokens), trained on the same train split
// and scored on the same test split. Without it a spam F1 of 0.97 says
// nothing: a linear model on word counts is the classic spam filter.
//
// Features are log(1 + count) per token id, each record's vector scaled to
// unit length; minibatch SGD with a decaying step and L2 regularisation,
// its strength picked from a small grid by validation F1 (or accuracy for
// more than two classes). Deterministic for a seed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "brisk/train/classify_metrics.h"

namespace brisk::train {

// One record as sparse features.
struct BowRecord {
  std::vector<std::pair<int32_t, float>> features;  // (token id, weight), ids ascending, unique
  int32_t label = 0;
};

// Counts of tokens[0 .. max_len), log-scaled and normalised.
BowRecord bow_features(std::span<const int32_t> tokens, int32_t label, int64_t max_len);

struct BowBaseline {
  double l2 = 0;        // the regularisation validation picked
  int64_t epochs = 0;
  ClassMetrics val, test;
};

BowBaseline bow_baseline(const std::vector<BowRecord>& train, const std::vector<BowRecord>& val,
                         const std::vector<BowRecord>& test, int64_t n_classes, int64_t vocab, uint64_t seed);

}  // namespace brisk::train

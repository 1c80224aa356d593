// How well a classifier did on a labelled split: accuracy, precision, recall,
// F1 (of the positive class, label 1, for two classes; macro-averaged over
// the classes otherwise), ROC AUC (two classes) and the confusion matrix.
// Shared by the encoder's report and the bag-of-words baseline beside it, so
// both are scored by the same code.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace brisk::train {

struct ClassMetrics {
  int64_t count = 0;
  double accuracy = 0, precision = 0, recall = 0, f1 = 0;
  double roc_auc = -1;   // two classes only; -1 otherwise or with one class present
  double loss = 0;       // mean cross-entropy of the probabilities
  std::vector<std::vector<int64_t>> confusion;  // [true label][predicted label]
};

// probs: count x n_classes probabilities (rows sum to 1); the prediction is
// the most probable class (the lowest index on a tie).
ClassMetrics classification_metrics(std::span<const int32_t> labels, std::span<const float> probs, int64_t n_classes);

// Area under the ROC curve of `scores` for label 1 against label 0: the
// probability that a random positive scores above a random negative, ties
// counting one half (Mann-Whitney U). -1 when one of the classes is absent.
double roc_auc(std::span<const int32_t> labels, std::span<const double> scores);

// The metrics as a JSON object (text), for report.json.
std::string metrics_json(const ClassMetrics& m);
// A few lines for the terminal: the figures, then the confusion matrix with
// the class names as row and column heads.
std::string format_metrics(const ClassMetrics& m, const std::vector<std::string>& names, const std::string& indent);

}  // namespace brisk::train

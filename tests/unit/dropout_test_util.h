// What the dropout tests (dropout_test.cpp: model.dropout;
// attention_dropout_test.cpp: model.attention_dropout) share: a small GPT
// and encoder classifier, fixed batches for them, and the check that a
// config is refused with a message naming the problem.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/models/encoder.h"
#include "brisk/models/gpt.h"
#include "brisk/train/config.h"

namespace brisk::testing_util {

// A 2-layer, 32-wide GPT over 64 tokens, sequences up to 64.
inline models::GptConfig small_dropout_gpt(float dropout, float attention_dropout = 0.f,
                                           const std::string& attention = "plain",
                                           const std::string& recompute = "none") {
  models::GptConfig c{64, 2, 32, 4, 64};
  c.dropout = dropout;
  c.attention_dropout = attention_dropout;
  c.attention = attention;
  c.recompute = recompute;
  return c;
}

// B x T token ids and targets for it.
struct GptBatch {
  std::vector<int32_t> x, y;
  GptBatch(int64_t B, int64_t T) : x(size_t(B * T)), y(size_t(B * T)) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 7 + 3) % 64), y[i] = int32_t((i * 13 + 5) % 64);
  }
};

// A 2-layer, 32-wide, 2-class encoder classifier over 50 tokens.
inline models::EncoderConfig small_dropout_encoder(float dropout, float attention_dropout = 0.f,
                                                   const std::string& attention = "flash",
                                                   const std::string& recompute = "none") {
  models::EncoderConfig c;
  c.vocab_size = 50, c.n_layer = 2, c.n_embd = 32, c.n_head = 2, c.max_len = 64, c.n_classes = 2;
  c.dropout = dropout;
  c.attention_dropout = attention_dropout;
  c.attention = attention;
  c.recompute = recompute;
  return c;
}

// Three right-padded sequences of lengths 32, 17 and 5 (T 32) and their labels.
struct EncoderBatch {
  static constexpr int64_t B = 3, T = 32;
  std::vector<int32_t> ids = std::vector<int32_t>(size_t(B * T)), lengths = {32, 17, 5}, labels = {0, 1, 1};
  EncoderBatch() {
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 11 + 1) % 50);
  }
  double step(models::Encoder& m, uint64_t key) const {
    return m.train_micro_step(ids.data(), lengths.data(), labels.data(), B, T, 1.0, key);
  }
};

// load_train_config("", sets) throws a ConfigError whose message holds `want`.
inline void expect_config_refused(const std::vector<std::string>& sets, const std::string& want) {
  try {
    train::load_train_config("", sets);
    ADD_FAILURE() << "accepted " << sets.front();
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

}  // namespace brisk::testing_util

// Pruning (models/prune.h): magnitude pruning zeroes exactly the smallest
// weights of each matrix (checked against a full sort), 2:4 keeps the two
// largest of every group of four, nothing outside the block Linear weights
// changes, the report agrees with a recount, bad options are refused, and
// the mask puts pruned weights and their moments back to zero.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/models/prune.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/config.h"

using namespace brisk;

namespace {

cpu::CpuBackend& backend() {
  static cpu::CpuBackend b(1);
  return b;
}

models::GptConfig tiny() {
  models::GptConfig c;
  c.vocab_size = 64;
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 2;
  c.block_size = 16;
  return c;
}

std::map<std::string, std::vector<float>> snapshot(const core::ParameterStore& store) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, e] : store.entries()) {
    const float* p = e.value.data_as<float>();
    out[name].assign(p, p + e.value.numel());
  }
  return out;
}

std::vector<float> random_weights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(n));
  for (float& x : w) x = d(rng);
  return w;
}

// The k indices of smallest (|w|, index), by sorting everything.
std::vector<int64_t> smallest_by_sort(const std::vector<float>& w, int64_t k) {
  std::vector<int64_t> idx(w.size());
  std::iota(idx.begin(), idx.end(), int64_t(0));
  std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    const float fa = std::fabs(w[size_t(a)]), fb = std::fabs(w[size_t(b)]);
    return fa < fb || (fa == fb && a < b);
  });
  idx.resize(size_t(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<int64_t> zero_positions(const std::vector<float>& w) {
  std::vector<int64_t> z;
  for (size_t i = 0; i < w.size(); ++i)
    if (w[i] == 0.0f) z.push_back(int64_t(i));
  return z;
}

}  // namespace

TEST(Prune, PrunableNames) {
  EXPECT_TRUE(models::is_prunable("h.0.attn.c_attn.weight"));
  EXPECT_TRUE(models::is_prunable("h.11.attn.c_proj.weight"));
  EXPECT_TRUE(models::is_prunable("h.3.mlp.c_fc.weight"));
  EXPECT_TRUE(models::is_prunable("h.3.mlp.c_proj.weight"));
  for (const char* n : {"wte.weight", "wpe.weight", "ln_f.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.bias",
                        "h.0.mlp.c_fc.bias", "h.0.mlp.c_proj.bias"})
    EXPECT_FALSE(models::is_prunable(n)) << n;
}

TEST(Prune, MagnitudeMatchesFullSort) {
  for (const double s : {0.0, 0.1, 0.25, 0.5, 0.9, 0.999}) {
    for (const int64_t n : {int64_t(1), int64_t(7), int64_t(1000), int64_t(4099)}) {
      std::vector<float> w = random_weights(n, uint32_t(n * 31 + int64_t(s * 1000)));
      const std::vector<float> orig = w;
      const int64_t k = models::prune_magnitude(w.data(), n, s);
      EXPECT_LE(std::fabs(double(k) - s * double(n)), 0.5 + 1e-9) << "n " << n << " s " << s;
      EXPECT_EQ(zero_positions(w), smallest_by_sort(orig, k)) << "n " << n << " s " << s;
      for (size_t i = 0; i < w.size(); ++i)
        if (w[i] != 0.0f) {
          EXPECT_EQ(w[i], orig[i]);  // the kept ones are untouched
        }
    }
  }
}

TEST(Prune, MagnitudeTiesAndExistingZeros) {
  // Equal magnitudes and weights that are 0 already: the count stays exact.
  std::vector<float> w = {0.f, 1.f, -1.f, 0.f, 1.f, 2.f, -1.f, 0.f};
  EXPECT_EQ(models::prune_magnitude(w.data(), int64_t(w.size()), 0.5), 4);
  EXPECT_EQ(w, (std::vector<float>{0.f, 0.f, -1.f, 0.f, 1.f, 2.f, -1.f, 0.f}));
}

TEST(Prune, TwoFourKeepsTwoLargestOfEveryGroup) {
  const int64_t rows = 13, cols = 64;
  std::vector<float> w = random_weights(rows * cols, 5);
  const std::vector<float> orig = w;
  models::prune_two_four(w.data(), rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; c += 4) {
      const size_t at = size_t(r * cols + c);
      int nonzero = 0;
      std::vector<float> mags;
      for (int j = 0; j < 4; ++j) mags.push_back(std::fabs(orig[at + size_t(j)]));
      std::sort(mags.begin(), mags.end());
      for (int j = 0; j < 4; ++j) {
        if (w[at + size_t(j)] == 0.0f) continue;
        ++nonzero;
        EXPECT_EQ(w[at + size_t(j)], orig[at + size_t(j)]);
        EXPECT_GE(std::fabs(orig[at + size_t(j)]), mags[2]) << "row " << r << " group " << c / 4;
      }
      EXPECT_EQ(nonzero, 2) << "row " << r << " group " << c / 4;
    }
  }
}

TEST(Prune, GptMagnitudePerLayerAndOthersUnchanged) {
  models::Gpt model(tiny(), backend());
  model.init_weights(3);
  const auto before = snapshot(model.params());
  const models::PruneReport r = models::prune(model, models::PruneMethod::magnitude, 0.3);
  const auto after = snapshot(model.params());
  EXPECT_EQ(r.method, "magnitude");
  EXPECT_EQ(r.layers.size(), size_t(4 * 2));  // 4 Linear weights in each of 2 blocks
  EXPECT_EQ(r.model_params, model.params().num_params());
  int64_t zeros = 0, numel = 0;
  for (const models::LayerSparsity& l : r.layers) {
    ASSERT_TRUE(models::is_prunable(l.name));
    const std::vector<float>& w = after.at(l.name);
    EXPECT_EQ(int64_t(w.size()), l.numel());
    EXPECT_EQ(model.params().at(l.name).value.shape(), core::Shape({l.rows, l.cols}));
    const int64_t z = int64_t(zero_positions(w).size());
    EXPECT_EQ(z, l.zeros) << l.name;  // the report is a true count
    EXPECT_LE(std::fabs(double(z) - 0.3 * double(l.numel())), 1.0) << l.name;
    EXPECT_EQ(zero_positions(w), smallest_by_sort(before.at(l.name), z)) << l.name;
    zeros += z;
    numel += l.numel();
  }
  EXPECT_EQ(r.zeros(), zeros);
  EXPECT_EQ(r.numel(), numel);
  EXPECT_DOUBLE_EQ(r.sparsity(), double(zeros) / double(numel));
  for (const auto& [name, w] : before)
    if (!models::is_prunable(name)) {
      EXPECT_EQ(after.at(name), w) << name << " changed";
    }

  // A recount of the pruned model gives the same numbers.
  const models::PruneReport again = models::sparsity_report(model.params());
  ASSERT_EQ(again.layers.size(), r.layers.size());
  for (size_t i = 0; i < r.layers.size(); ++i) {
    EXPECT_EQ(again.layers[i].name, r.layers[i].name);
    EXPECT_EQ(again.layers[i].zeros, r.layers[i].zeros);
  }
}

// Global scope: the k smallest |w| of all prunable matrices together, k =
// round(s x all of them), checked against one full sort over the whole
// model (ties by matrix in store order, then index); layers end unequal.
TEST(Prune, GptMagnitudeGlobalIsOneLineOverAllMatrices) {
  models::Gpt model(tiny(), backend());
  model.init_weights(8);
  // Layers of different scales, as trained models have: block 1's MLP
  // output weights are 4x smaller, so they should lose the most.
  for (auto& [name, e] : model.params().entries())
    if (name == "h.1.mlp.c_proj.weight")
      for (int64_t i = 0; i < e.value.numel(); ++i) e.value.data_as<float>()[i] *= 0.25f;
  std::vector<std::string> names;
  for (const auto& [name, e] : model.params().entries())
    if (models::is_prunable(name)) names.push_back(name);
  const auto before = snapshot(model.params());
  std::vector<float> all;
  for (const std::string& n : names) all.insert(all.end(), before.at(n).begin(), before.at(n).end());
  const double s = 0.4;
  const auto k = int64_t(std::llround(s * double(all.size())));
  const std::vector<int64_t> want = smallest_by_sort(all, k);

  const models::PruneReport r = models::prune(model, models::PruneMethod::magnitude, s, models::PruneScope::global);
  EXPECT_EQ(r.scope, "global");
  EXPECT_EQ(r.zeros(), k);  // exact over the whole model
  std::vector<float> after_all;
  const auto after = snapshot(model.params());
  for (const std::string& n : names) after_all.insert(after_all.end(), after.at(n).begin(), after.at(n).end());
  EXPECT_EQ(zero_positions(after_all), want);
  double lo = 1, hi = 0;
  for (const models::LayerSparsity& l : r.layers) {
    EXPECT_EQ(l.zeros, int64_t(zero_positions(after.at(l.name)).size())) << l.name;
    lo = std::min(lo, l.sparsity());
    hi = std::max(hi, l.sparsity());
  }
  EXPECT_GT(hi - lo, 0.2) << "one line over all layers should prune them unequally";
  EXPECT_GT(r.layers.back().sparsity(), 0.8) << r.layers.back().name;  // h.1.mlp.c_proj: the small one
  EXPECT_EQ(r.layers.back().name, "h.1.mlp.c_proj.weight");
  for (const auto& [name, w] : before)
    if (!models::is_prunable(name)) {
      EXPECT_EQ(after.at(name), w) << name << " changed";
    }
  // The layer scope on the same weights ends every layer at s instead.
  models::Gpt again(tiny(), backend());
  again.init_weights(8);
  for (const models::LayerSparsity& l :
       models::prune(again, models::PruneMethod::magnitude, s, models::PruneScope::layer).layers)
    EXPECT_LE(std::fabs(double(l.zeros) - s * double(l.numel())), 1.0) << l.name;
  // 2:4 has no global scope; scope names parse and are listed in the error.
  try {
    models::prune(model, models::PruneMethod::two_four, 0.5, models::PruneScope::global);
    ADD_FAILURE() << "no error for 2:4 global";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no global scope"), std::string::npos) << e.what();
  }
  EXPECT_EQ(models::parse_prune_scope("global"), models::PruneScope::global);
  try {
    models::parse_prune_scope("model");
    ADD_FAILURE() << "no error for scope model";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("allowed: layer, global"), std::string::npos) << e.what();
  }
}

// Equal magnitudes at the line: the earlier matrix (store order), then the
// lower index, loses first, so the count is exact.
TEST(Prune, GlobalTiesAtTheLineGoInMatrixThenIndexOrder) {
  core::Graph g;
  g.param("h.0.attn.c_attn.weight", {1, 4});
  g.param("h.0.mlp.c_fc.weight", {1, 4});
  core::ParameterStore store;
  store.adopt(g);
  const float a[4] = {1, -2, 3, 4}, b[4] = {2, -2, 5, 6};
  std::copy(a, a + 4, store.at("h.0.attn.c_attn.weight").value.data_as<float>());
  std::copy(b, b + 4, store.at("h.0.mlp.c_fc.weight").value.data_as<float>());
  // 3 of 8: |1|, then the first two of the three 2s.
  const models::PruneReport r = models::prune(store, models::PruneMethod::magnitude, 0.375, models::PruneScope::global);
  EXPECT_EQ(r.zeros(), 3);
  const auto after = snapshot(store);
  EXPECT_EQ(after.at("h.0.attn.c_attn.weight"), (std::vector<float>{0, 0, 3, 4}));
  EXPECT_EQ(after.at("h.0.mlp.c_fc.weight"), (std::vector<float>{0, -2, 5, 6}));
}

TEST(Prune, GptTwoFourExactlyHalf) {
  models::Gpt model(tiny(), backend());
  model.init_weights(4);
  const auto before = snapshot(model.params());
  const models::PruneReport r = models::prune(model, models::PruneMethod::two_four, 0.5);
  EXPECT_EQ(r.method, "2:4");
  EXPECT_EQ(r.zeros() * 2, r.numel());
  const auto after = snapshot(model.params());
  for (const models::LayerSparsity& l : r.layers) {
    EXPECT_EQ(l.zeros * 2, l.numel()) << l.name;
    const std::vector<float>& w = after.at(l.name);
    const std::vector<float>& o = before.at(l.name);
    for (int64_t g = 0; g < l.numel() / 4; ++g) {  // groups of 4 along each row of (out, in)
      std::vector<float> mags;
      for (int j = 0; j < 4; ++j) mags.push_back(std::fabs(o[size_t(4 * g + j)]));
      std::sort(mags.begin(), mags.end());
      int kept = 0;
      for (int j = 0; j < 4; ++j) {
        const size_t i = size_t(4 * g + j);
        if (w[i] == 0.0f) continue;
        ++kept;
        EXPECT_GE(std::fabs(o[i]), mags[2]);
      }
      EXPECT_EQ(kept, 2) << l.name << " group " << g;
    }
  }
  for (const auto& [name, w] : before)
    if (!models::is_prunable(name)) {
      EXPECT_EQ(after.at(name), w) << name << " changed";
    }
}

TEST(Prune, ZeroSparsityChangesNothing) {
  models::Gpt model(tiny(), backend());
  model.init_weights(5);
  const auto before = snapshot(model.params());
  const models::PruneReport r = models::prune(model, models::PruneMethod::magnitude, 0.0);
  EXPECT_EQ(r.zeros(), 0);
  EXPECT_EQ(snapshot(model.params()), before);
}

TEST(Prune, BadOptionsAreRefusedBeforeAnythingChanges) {
  models::Gpt model(tiny(), backend());
  model.init_weights(6);
  const auto before = snapshot(model.params());
  auto message = [&](models::PruneMethod m, double s) -> std::string {
    try {
      models::prune(model, m, s);
    } catch (const core::ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message(models::PruneMethod::magnitude, 1.0).find("sparsity must be in [0, 1), got 1"), std::string::npos);
  EXPECT_NE(message(models::PruneMethod::magnitude, -0.1).find("got -0.1"), std::string::npos);
  EXPECT_NE(message(models::PruneMethod::magnitude, std::nan("")).find("sparsity"), std::string::npos);
  EXPECT_NE(message(models::PruneMethod::two_four, 0.3).find("2:4"), std::string::npos);
  EXPECT_EQ(snapshot(model.params()), before);
  try {
    models::parse_prune_method("foo");
    ADD_FAILURE() << "no error for method foo";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'foo'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(models::parse_prune_method("2:4"), models::PruneMethod::two_four);
}

TEST(Prune, TwoFourNeedsRowsOfFours) {
  core::Graph g;
  g.param("h.0.mlp.c_fc.weight", {4, 6});
  core::ParameterStore store;
  store.adopt(g);
  try {
    models::prune(store, models::PruneMethod::two_four, 0.5);
    ADD_FAILURE() << "no error";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("h.0.mlp.c_fc.weight"), std::string::npos) << e.what();
  }
}

TEST(Prune, MaskZeroesWeightsAndMoments) {
  models::Gpt model(tiny(), backend());
  model.init_weights(7);
  optim::AdamW adamw(optim::AdamWConfig{}, model.params(), backend());  // creates the moments
  models::prune(model, models::PruneMethod::magnitude, 0.5);
  const models::PruneMask mask = models::PruneMask::from_zeros(model.params());
  const models::PruneReport r = models::sparsity_report(model.params());
  EXPECT_EQ(mask.masked(), r.zeros());
  EXPECT_EQ(mask.prunable(), r.numel());
  const auto pruned = snapshot(model.params());

  // Everything moves (as an update would), then the mask puts the pruned entries back.
  for (auto& [name, e] : model.params().entries()) {
    for (core::Tensor* t : {&e.value, &e.state[0], &e.state[1]}) {
      float* p = t->data_as<float>();
      for (int64_t i = 0; i < t->numel(); ++i) p[i] += 0.25f;
    }
  }
  mask.apply(model.params());
  for (const auto& [name, e] : model.params().entries()) {
    const std::vector<float>& before = pruned.at(name);
    for (int64_t i = 0; i < e.value.numel(); ++i) {
      const bool masked = models::is_prunable(name) && before[size_t(i)] == 0.0f;
      const float expect = masked ? 0.0f : before[size_t(i)] + 0.25f;
      ASSERT_EQ(e.value.data_as<float>()[i], expect) << name << " [" << i << "]";
      for (int k = 0; k < 2; ++k)
        ASSERT_EQ(e.state[size_t(k)].data_as<float>()[i], masked ? 0.0f : 0.25f) << name << " moment " << k;
    }
  }
}

TEST(Prune, ConfigKeys) {
  const train::TrainConfig c = train::parse_train_config(
      "[train]\ninit_from = \"runs/pruned\"\nkeep_mask = true\n", "t.toml");
  EXPECT_EQ(c.init_from, "runs/pruned");
  EXPECT_TRUE(c.keep_mask);
  const train::TrainConfig back = train::parse_train_config(train::to_toml(c), "back.toml");
  EXPECT_EQ(back.init_from, "runs/pruned");
  EXPECT_TRUE(back.keep_mask);
  EXPECT_FALSE(train::parse_train_config("", "empty.toml").keep_mask);
  try {
    train::parse_train_config("[train]\nkeep_mask = 1\n", "t.toml");
    ADD_FAILURE() << "no error";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.keep_mask"), std::string::npos) << e.what();
  }
  try {
    train::parse_train_config("[train]\nkeep_mask = true\ndevice = \"cuda\"\n", "t.toml");
    ADD_FAILURE() << "no error";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("keep_mask"), std::string::npos) << e.what();
  }
}

// The encoder classifier as a whole: padding never reaches a real row (the
// same batch padded two ways gives the same logits and gradients), flash and
// plain attention agree, bad inputs are refused with a message, and a short
// train_classifier run on a synthetic store learns, reports and checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "../common/report_profile.h"
#include "../common/run_copy.h"
#include "../common/tiny_gpt.h"
#include "../unit/test_util.h"
#include "brisk/core/error.h"
#include "brisk/data/record_store.h"
#include "brisk/models/encoder.h"
#include "brisk/train/autoencoder_config.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/classifier_trainer.h"

namespace fs = std::filesystem;
using namespace brisk;
using testing_util::backend;
using testing_util::message_of;

namespace {

models::EncoderConfig small_config(const std::string& attention = "plain") {
  models::EncoderConfig c;
  c.vocab_size = 50, c.n_layer = 2, c.n_embd = 32, c.n_head = 2, c.max_len = 64, c.n_classes = 3;
  c.attention = attention;
  return c;
}

// Rows of `lengths` real tokens (the same in every layout), padded to T with
// random ids drawn from `pad_seed`.
std::vector<int32_t> padded(const std::vector<std::vector<int32_t>>& rows, int64_t T, uint64_t pad_seed) {
  std::mt19937 rng(static_cast<uint32_t>(pad_seed));
  std::vector<int32_t> ids(rows.size() * size_t(T));
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t t = 0; t < T; ++t)
      ids[r * size_t(T) + size_t(t)] = t < int64_t(rows[r].size()) ? rows[r][size_t(t)] : int32_t(rng() % 50);
  return ids;
}

std::vector<std::vector<int32_t>> random_rows(const std::vector<int32_t>& lengths, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<std::vector<int32_t>> rows;
  for (int32_t n : lengths) {
    rows.emplace_back();
    for (int32_t t = 0; t < n; ++t) rows.back().push_back(int32_t(rng() % 50));
  }
  return rows;
}

std::map<std::string, std::vector<float>> grads_of(models::Encoder& m) {
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, e] : m.params().entries()) {
    const float* g = e.grad.data_as<float>();
    out[name].assign(g, g + e.grad.numel());
  }
  return out;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-6;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::abs(a[i] - b[i])));
    scale = std::max(scale, double(std::abs(a[i])));
  }
  return diff / scale;
}

}  // namespace

// The attention kernel, and "bf16" for flash attention in a bf16 graph
// (mixed precision): the flash kernels there round a sequence's last key tile
// up to 16 keys and mask the rest, and bf16 rounding allows a looser match.
class EncoderPadding : public ::testing::TestWithParam<std::string> {};

TEST_P(EncoderPadding, TheSameBatchPaddedTwoWaysGivesTheSameLogitsAndGradients) {
  const bool bf16 = GetParam() == "bf16";
  models::EncoderConfig config = small_config(bf16 ? "flash" : GetParam());
  if (bf16) config.compute = core::DType::bf16;
  const double tol = bf16 ? 2e-2 : 1e-5;
  models::Encoder m(config, backend());
  m.init_weights(7);
  const std::vector<int32_t> lengths = {5, 30, 1, 17};
  const std::vector<int32_t> labels = {0, 2, 1, 2};
  const auto rows = random_rows(lengths, 11);
  const auto narrow = padded(rows, 30, 1), wide = padded(rows, 64, 2);

  const float* l30 = m.logits(narrow.data(), lengths.data(), 4, 30);
  const std::vector<float> a(l30, l30 + 12);
  const float* l64 = m.logits(wide.data(), lengths.data(), 4, 64);
  const std::vector<float> b(l64, l64 + 12);
  EXPECT_LT(rel_error(a, b), tol);
  // Back at width 30, after width 64 ran in the logits programs' shared arena
  // (which may have left anything in width 30's inputs: zeros here, in its
  // positions), the same numbers again.
  models::EncoderProgram& p30 = m.program(false, 4, 30);
  std::memset(p30.executor->data(p30.pos), 0, 30 * sizeof(int32_t));
  const float* again = m.logits(narrow.data(), lengths.data(), 4, 30);
  EXPECT_EQ(std::vector<float>(again, again + 12), a);
  double spread = 0;  // the check means something only if the rows differ
  for (int k = 0; k < 3; ++k) spread = std::max(spread, double(std::abs(a[size_t(k)] - a[size_t(3 + k)])));
  EXPECT_GT(spread, 1e-4);

  m.params().zero_grads();
  const double loss30 = m.train_micro_step(narrow.data(), lengths.data(), labels.data(), 4, 30);
  const auto g30 = grads_of(m);
  m.params().zero_grads();
  const double loss64 = m.train_micro_step(wide.data(), lengths.data(), labels.data(), 4, 64);
  const auto g64 = grads_of(m);
  EXPECT_NEAR(loss30, loss64, bf16 ? 2e-3 * loss30 : 1e-5);
  for (const auto& [name, g] : g30) {
    if (name == "wpe.weight") {  // rows past 30 exist only in the wide batch, and get nothing there either
      for (size_t i = 30 * 32; i < g64.at(name).size(); ++i) ASSERT_EQ(g64.at(name)[i], 0.f) << "wpe row " << i / 32;
    }
    EXPECT_LT(rel_error(g, g64.at(name)), tol) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, EncoderPadding, ::testing::Values("plain", "flash", "bf16"));

TEST(Encoder, FlashAndPlainAttentionGiveTheSameModel) {
  models::Encoder plain(small_config("plain"), backend()), flash(small_config("flash"), backend());
  plain.init_weights(3);
  flash.init_weights(3);
  const std::vector<int32_t> lengths = {40, 9, 64};
  const auto ids = padded(random_rows(lengths, 5), 64, 9);
  const float* a = plain.logits(ids.data(), lengths.data(), 3, 64);
  const std::vector<float> la(a, a + 9);
  const float* b = flash.logits(ids.data(), lengths.data(), 3, 64);
  EXPECT_LT(rel_error(la, std::vector<float>(b, b + 9)), 1e-4);
}

// Mixed precision: the blocks in bf16 (native on CPUs with avx512_bf16,
// emulated elsewhere), master weights and grads fp32. The same weights and
// batch give the fp32 model's loss, logits and gradients within bf16's
// rounding, and not exactly (the graph is really bf16): its masked flash
// attention runs on bf16 operands, not in f32 between casts.
TEST(Encoder, Bf16BlocksGiveTheFp32ModelWithinRounding) {
  models::EncoderConfig c16 = small_config("flash");
  c16.compute = core::DType::bf16;
  models::Encoder fp32(small_config("flash"), backend()), bf16(c16, backend());
  fp32.init_weights(5);
  bf16.init_weights(5);
  const std::vector<int32_t> lengths = {64, 17, 40, 1};
  const std::vector<int32_t> labels = {0, 2, 1, 2};
  const auto ids = padded(random_rows(lengths, 21), 64, 4);
  const double l32 = fp32.train_micro_step(ids.data(), lengths.data(), labels.data(), 4, 64);
  const double l16 = bf16.train_micro_step(ids.data(), lengths.data(), labels.data(), 4, 64);
  EXPECT_NEAR(l16, l32, 2e-2 * l32);
  EXPECT_NE(l16, l32);
  const auto g32 = grads_of(fp32), g16 = grads_of(bf16);
  for (const auto& [name, g] : g32) EXPECT_LT(rel_error(g, g16.at(name)), 5e-2) << name;
  const float* a = fp32.logits(ids.data(), lengths.data(), 4, 64);
  const std::vector<float> la(a, a + 12);
  const float* b = bf16.logits(ids.data(), lengths.data(), 4, 64);
  EXPECT_LT(rel_error(la, std::vector<float>(b, b + 12)), 5e-2);

  int bf16_attention = 0;
  const core::Graph& g = bf16.program(true, 4, 64).graph;
  for (const core::Node& n : g.nodes())
    if (n.op == core::OpKind::masked_flash_attention || n.op == core::OpKind::masked_flash_attention_backward)
      bf16_attention += g.meta(n.inputs[0]).dtype == core::DType::bf16;
  EXPECT_EQ(bf16_attention, 2 * 2) << "forward and backward of both layers on bf16 operands";
}

TEST(Encoder, BadInputsAreRefusedWithAMessage) {
  models::Encoder m(small_config(), backend());
  m.init_weights(1);
  std::vector<int32_t> ids(2 * 8, 3), lengths = {8, 4}, labels = {0, 1};
  ids[9] = 50;
  EXPECT_NE(message_of([&] { m.logits(ids.data(), lengths.data(), 2, 8); }).find("token id 50"), std::string::npos);
  ids[9] = 3;
  lengths[1] = 0;
  EXPECT_NE(message_of([&] { m.logits(ids.data(), lengths.data(), 2, 8); }).find("sequence length 0"),
            std::string::npos);
  lengths[1] = 9;
  EXPECT_NE(message_of([&] { m.logits(ids.data(), lengths.data(), 2, 8); }).find("sequence length 9"),
            std::string::npos);
  lengths[1] = 4;
  labels[1] = 3;
  EXPECT_NE(message_of([&] { m.train_micro_step(ids.data(), lengths.data(), labels.data(), 2, 8); }).find("label 3"),
            std::string::npos);
  EXPECT_NE(message_of([&] { m.logits(std::vector<int32_t>(65, 1).data(), lengths.data(), 1, 65); })
                .find("exceeds model.max_len"),
            std::string::npos);
}

// ---- a whole run on a synthetic store ------------------------------------------------

namespace {

// Class 1 rows draw their tokens from [10, 30), class 0 from [25, 45): a
// bag-of-words problem with overlap, learnable in a few epochs. Three empty
// records ride along and must be left out of every split.
std::string synthetic_store(const fs::path& dir, int32_t bad_label = -1) {
  fs::create_directories(dir);
  const std::string path = (dir / "synthetic.lmdb").string();
  data::RecordWriterOptions o;
  o.tokenizer = "bytes";
  o.vocab_size = 50;
  data::RecordWriter w(path, o);
  std::mt19937 rng(17);
  for (int i = 0; i < 360; ++i) {
    const int32_t label = i % 3 == 0 ? 1 : 0;
    const int n = 3 + int(rng() % 90);  // some longer than max_len 64: truncated
    std::vector<int32_t> t;
    for (int k = 0; k < n; ++k) t.push_back(int32_t((label ? 10 : 25) + rng() % 20));
    w.add(t, i == 100 && bad_label >= 0 ? bad_label : label, "rec" + std::to_string(i));
  }
  for (int i = 0; i < 3; ++i) w.add({}, 0, "empty" + std::to_string(i));
  w.finish();
  return path;
}

train::ClassifyConfig synthetic_config(const fs::path& dir) {
  train::ClassifyConfig c = train::parse_classify_config(R"(
[model]
kind = "encoder"
vocab_size = 50
n_layer = 1
n_embd = 32
n_head = 2
max_len = 64
n_classes = 2
[data]
label_names = ["zero", "one"]
[train]
batch = 16
epochs = 3
lr = 3e-3
warmup = 5
log_every = 1000
)",
                                                          "synthetic.toml");
  c.store = (dir / "synthetic.lmdb").string();
  c.out_dir = (dir / "run").string();
  return c;
}

}  // namespace

TEST(TrainClassifier, LearnsASyntheticTaskAndWritesItsReportAndCheckpoint) {
  const fs::path dir = fs::temp_directory_path() / ("brisk_encoder_run_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  synthetic_store(dir);
  const train::ClassifyConfig cfg = synthetic_config(dir);
  const train::ClassifyResult r = train::train_classifier(cfg, {.quiet = true});

  EXPECT_EQ(r.dropped_empty, 3);
  EXPECT_EQ(r.split.train.size() + r.split.val.size() + r.split.test.size(), 360u);
  EXPECT_GT(r.truncated, 0);
  EXPECT_LT(r.last_loss, r.first_loss);
  EXPECT_GE(r.test.accuracy, 0.9);
  EXPECT_GE(r.baseline.test.accuracy, 0.9);
  EXPECT_GT(r.cache_hit_rate, 0.5) << "epochs 2 and 3 read the records epoch 1 cached";
  EXPECT_LT(r.padding_waste, 0.5);

  const nlohmann::json report = nlohmann::json::parse(std::ifstream(dir / "run/report.json"));
  EXPECT_DOUBLE_EQ(report["test"]["f1"].get<double>(), r.test.f1);
  EXPECT_EQ(report["split"]["test"].get<size_t>(), r.split.test.size());
  EXPECT_TRUE(report["baseline"]["test"].contains("roc_auc"));
  EXPECT_TRUE(fs::exists(dir / "run/metrics.jsonl"));

  // The checkpoint reloads into the same predictions, and says what it is.
  const train::EncoderCheckpoint info = train::read_encoder_checkpoint(r.checkpoint);
  EXPECT_EQ(info.label_names, (std::vector<std::string>{"zero", "one"}));
  EXPECT_EQ(info.tokenizer, "bytes");
  models::Encoder reloaded(info.config, backend());
  train::load_encoder_checkpoint(r.checkpoint, reloaded);
  data::RecordStore store(cfg.store);
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> labels;
  for (int64_t i : r.split.test) {
    seqs.push_back(store.get(i).tokens);
    labels.push_back(store.get(i).label);
  }
  const train::ClassMetrics again =
      train::classification_metrics(labels, train::predict_probs(reloaded, seqs), info.config.n_classes);
  EXPECT_DOUBLE_EQ(again.accuracy, r.test.accuracy);
  fs::remove_all(dir);
}

// train.precision = "bf16" (without the fallback, so that a CPU without
// bf16 dot products runs it emulated rather than in fp32) learns the task,
// says which path ran, casts the weights at their use (an fp32 train graph
// has no casts), and its checkpoint holds fp32 weights.
TEST(TrainClassifier, Bf16RunLearnsTheSyntheticTask) {
  const fs::path dir = fs::temp_directory_path() / ("brisk_encoder_bf16_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  synthetic_store(dir);
  train::ClassifyConfig cfg = synthetic_config(dir);
  cfg.precision = train::Precision::bf16;
  cfg.precision_fallback = false;
  const train::ClassifyResult r = train::train_classifier(cfg, {.quiet = true, .profile = true});
  EXPECT_TRUE(r.precision_path == "bf16-native" || r.precision_path == "bf16-emulated") << r.precision_path;
  EXPECT_GT(brisk::testing::profile_calls(dir / "run/report.json", "cast"), 0) << "the weights are cast to bf16 at their use";
  EXPECT_LT(r.last_loss, r.first_loss);
  EXPECT_GE(r.test.accuracy, 0.9);
  const nlohmann::json report = nlohmann::json::parse(std::ifstream(dir / "run/report.json"));
  EXPECT_EQ(report["training"]["precision"], "bf16");
  const train::EncoderCheckpoint info = train::read_encoder_checkpoint(r.checkpoint);
  models::Encoder reloaded(info.config, backend());
  train::load_encoder_checkpoint(r.checkpoint, reloaded);
  EXPECT_EQ(reloaded.params().entries().at("wte.weight").value.dtype(), core::DType::f32);
  fs::remove_all(dir);
}

// Where bf16 would be emulated (an AVX2 CPU; forced here), train.precision =
// "bf16" with the default fallback trains in fp32 (no casts in its steps),
// and the result and the report name that path.
TEST(TrainClassifier, Bf16WithoutBf16DotProductsFallsBackToFp32) {
  testing_util::ScopedBf16Path emulated("emulated");
  const fs::path dir = fs::temp_directory_path() / ("brisk_encoder_fallback_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  synthetic_store(dir);
  train::ClassifyConfig cfg = synthetic_config(dir);
  cfg.precision = train::Precision::bf16;
  cfg.epochs = 1;
  const train::ClassifyResult r = train::train_classifier(cfg, {.quiet = true, .profile = true});
  EXPECT_EQ(r.precision_path, "fp32");
  EXPECT_EQ(brisk::testing::profile_calls(dir / "run/report.json", "cast"), 0) << "an fp32 train graph casts nothing";
  EXPECT_GT(brisk::testing::profile_calls(dir / "run/report.json", "masked_flash_attention"), 0);
  const nlohmann::json report = nlohmann::json::parse(std::ifstream(dir / "run/report.json"));
  EXPECT_EQ(report["training"]["precision"], "fp32");
  fs::remove_all(dir);
}

// A run that crashed after any of its checkpoints (mid-epoch or at an
// epoch's end), resumed, ends with the uninterrupted run's weights and
// moments bit for bit, logs every step once with the same loss, and scores
// the test split the same.
TEST(TrainClassifier, ResumedFromAnyCheckpointItEndsWithTheStraightRunsWeights) {
  const fs::path dir = fs::temp_directory_path() / ("brisk_encoder_resume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  synthetic_store(dir);
  brisk::testing::expect_resumes_end_as_the_straight_run<train::ClassifyConfig, train::ClassifyResult>(
      dir, synthetic_config(dir),
      [](const train::ClassifyConfig& c, bool resume) {
        return train::train_classifier(c, {.quiet = true, .resume = resume});
      },
      [](const train::ClassifyResult& r, const train::ClassifyResult& straight) {
        EXPECT_DOUBLE_EQ(r.test.f1, straight.test.f1);
        EXPECT_DOUBLE_EQ(r.val.loss, straight.val.loss);
      });
  fs::remove_all(dir);
}

// The val rows' (F1, loss) of a run directory, one per epoch in order.
std::vector<std::pair<double, double>> val_f1_and_loss(const fs::path& run) {
  std::vector<std::pair<double, double>> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("val")) out.emplace_back(j["val"]["f1"].get<double>(), j["val"]["loss"].get<double>());
  }
  return out;
}

// The test split's figures of the checkpoint in `ckpt`, read back and run
// on its own (not through the trainer).
train::ClassMetrics test_figures(const std::string& ckpt, const std::string& store_path,
                                 const std::vector<int64_t>& test) {
  const train::EncoderCheckpoint info = train::read_encoder_checkpoint(ckpt);
  models::Encoder m(info.config, backend());
  train::load_encoder_checkpoint(ckpt, m);
  data::RecordStore store(store_path);
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> labels;
  for (int64_t i : test) {
    seqs.push_back(store.get(i).tokens);
    labels.push_back(store.get(i).label);
  }
  return train::classification_metrics(labels, train::predict_probs(m, seqs), info.config.n_classes);
}

// A fresh directory (removed at the end) holding the synthetic store, and
// the synthetic config training into it.
struct SyntheticRun {
  fs::path dir;
  train::ClassifyConfig cfg;
  explicit SyntheticRun(const std::string& name)
      : dir(fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(dir);
    synthetic_store(dir);
    cfg = synthetic_config(dir);
  }
  ~SyntheticRun() { fs::remove_all(dir); }
};

// train.keep_best = "val_f1": the epoch whose F1 first reaches the run's
// best keeps its weights in <out_dir>/best/ (later epochs that only tie it
// do not replace it), and val and test are that checkpoint's figures, not
// the last epoch's. The synthetic task reaches F1 1 within the first
// epochs and its val loss keeps falling, so the two differ.
TEST(TrainClassifier, KeepBestScoresTheTestSplitOnTheBestEpochsWeights) {
  SyntheticRun run("brisk_encoder_best");
  train::ClassifyConfig& cfg = run.cfg;
  cfg.epochs = 4;
  cfg.keep_best = "val_f1";
  const train::ClassifyResult r = train::train_classifier(cfg, {.quiet = true});
  const auto vals = val_f1_and_loss(run.dir / "run");
  ASSERT_EQ(vals.size(), 4u);
  size_t best = 0;
  for (size_t e = 1; e < vals.size(); ++e)
    if (vals[e].first > vals[best].first) best = e;
  ASSERT_LT(best, 3u) << "the premise: F1 stops improving before the last epoch";
  ASSERT_NE(vals[best].second, vals.back().second);
  EXPECT_EQ(r.best_epoch, int64_t(best) + 1);
  EXPECT_EQ(r.best_score, vals[best].first);
  EXPECT_EQ(r.val.loss, vals[best].second) << "val is the best epoch's, not the last one's";
  EXPECT_FALSE(r.early_stopped);
  EXPECT_EQ(fs::path(r.best_checkpoint).parent_path(), run.dir / "run" / "best");
  const train::ClassMetrics best_test = test_figures(r.best_checkpoint, cfg.store, r.split.test);
  EXPECT_EQ(r.test.loss, best_test.loss);
  EXPECT_EQ(r.test.accuracy, best_test.accuracy);
  EXPECT_NE(r.test.loss, test_figures(r.checkpoint, cfg.store, r.split.test).loss) << "the last epoch's weights";
  const nlohmann::json report = nlohmann::json::parse(std::ifstream(run.dir / "run/report.json"));
  EXPECT_EQ(report["best"]["epoch"], r.best_epoch);
  EXPECT_EQ(report["best"]["checkpoint"], r.best_checkpoint);
  EXPECT_DOUBLE_EQ(report["test"]["loss"].get<double>(), r.test.loss);

  // A crash between saving a newer best and recording it leaves an
  // unrecorded step_* in best/: the checkpoint best.json names is still the
  // one `brisk classify --checkpoint <run>/best` reads.
  const fs::path best_dir = run.dir / "run" / "best";
  fs::copy(r.best_checkpoint, best_dir / "step_9999999");
  EXPECT_EQ(train::latest_checkpoint(best_dir.string()), r.best_checkpoint);
  // A resumed run removes it as it starts (this one has nothing left to train).
  const train::ClassifyResult again = train::train_classifier(cfg, {.quiet = true, .resume = true});
  EXPECT_EQ(again.best_checkpoint, r.best_checkpoint);
  EXPECT_FALSE(fs::exists(best_dir / "step_9999999"));
  EXPECT_TRUE(fs::exists(r.best_checkpoint));
  std::ofstream(best_dir / "best.json") << "{}";
  EXPECT_NE(message_of([&] { train::latest_checkpoint(best_dir.string()); }).find("best.json: field 'metric'"),
            std::string::npos);
}

// train.early_stop = 2: training ends once two epochs in a row did not beat
// the best one; a --resume of the stopped run trains nothing more (the best
// epoch is read back from best/best.json) and reports the same figures; a
// fresh run, or a --resume finding no checkpoint, is refused a directory
// that holds a best epoch.
TEST(TrainClassifier, EarlyStopEndsTrainingAndAResumeStaysStopped) {
  SyntheticRun run("brisk_encoder_stop");
  train::ClassifyConfig& cfg = run.cfg;
  cfg.epochs = 8;
  cfg.keep_best = "val_f1";
  cfg.early_stop = 2;
  const train::ClassifyResult r = train::train_classifier(cfg, {.quiet = true});
  const auto vals = val_f1_and_loss(run.dir / "run");
  ASSERT_GE(r.best_epoch, 1);
  EXPECT_TRUE(r.early_stopped);
  EXPECT_EQ(r.epochs, r.best_epoch + 2);
  EXPECT_EQ(int64_t(vals.size()), r.epochs) << "one validation per epoch trained";
  for (size_t e = size_t(r.best_epoch); e < vals.size(); ++e) EXPECT_LE(vals[e].first, r.best_score);
  EXPECT_EQ(r.steps % r.epochs, 0);

  brisk::testing::expect_stopped_run_stays_stopped<train::ClassifyResult>(
      run.dir / "run", r, [&](bool resume) { return train::train_classifier(cfg, {.quiet = true, .resume = resume}); });
}

// A damaged best/best.json stops a resume with a message naming the file,
// the field and the way out; the run's checkpoints stay as they were.
TEST(TrainClassifier, ADamagedBestRecordIsAClearError) {
  SyntheticRun run("brisk_encoder_badbest");
  train::ClassifyConfig& cfg = run.cfg;
  cfg.epochs = 1;
  cfg.keep_best = "val_loss";
  const train::ClassifyResult r = train::train_classifier(cfg, {.quiet = true});
  ASSERT_EQ(r.best_epoch, 1);
  cfg.epochs = 2;
  const fs::path record = run.dir / "run" / "best" / "best.json";
  const std::pair<std::string, std::string> damaged[] = {
      {"{\"metric\": \"val_loss\", \"epoch\": true, \"step\": 1, \"score\": 0.5, \"checkpoint\": \"x\"}",
       "field 'epoch'"},
      {"{\"metric\": \"val_loss\", \"epoch\": 1, \"step\": 1, \"score\": 0.5, \"checkpoint\": \"step_0000099\"}",
       "which is not there"},
      {"{\"metric\": \"val_loss\", \"epoch\": 1, \"step\": 1, \"score\": 0.5, \"checkpoint\": \"../run\"}",
       "is not the name of a checkpoint"},
      {"not json", "not JSON"}};
  for (const auto& [text, want] : damaged) {
    SCOPED_TRACE(text);
    std::ofstream(record) << text;
    const std::string message = message_of([&] { train::train_classifier(cfg, {.quiet = true, .resume = true}); });
    EXPECT_NE(message.find(want), std::string::npos) << message;
    EXPECT_NE(message.find("remove"), std::string::npos) << message;
    EXPECT_EQ(train::latest_checkpoint(cfg.out_dir), r.checkpoint);
  }
}

// train.label_smoothing: read into the model's train programs (only there:
// classifying is unchanged), written back, refused out of [0, 1); a step's
// loss with it is the smoothed one (the op harness and
// encoder_torch_crosscheck_label_smoothing check the numbers).
TEST(TrainClassifier, LabelSmoothingKey) {
  const std::string head = "[model]\nkind = \"encoder\"\n[train]\n";
  const train::ClassifyConfig c = train::parse_classify_config(head + "label_smoothing = 0.1\n", "a");
  EXPECT_FLOAT_EQ(c.model.label_smoothing, 0.1f);
  EXPECT_FLOAT_EQ(train::parse_classify_config(train::to_toml(c), "b").model.label_smoothing, 0.1f);
  EXPECT_EQ(train::parse_classify_config(head, "c").model.label_smoothing, 0.f);
  for (const char* bad : {"label_smoothing = 1.0\n", "label_smoothing = -0.1\n"})
    EXPECT_NE(message_of([&] { train::parse_classify_config(head + bad, "x"); })
                  .find("train.label_smoothing must be in [0, 1)"),
              std::string::npos)
        << bad;
  models::EncoderConfig smooth = c.model, plain = c.model;
  smooth.vocab_size = plain.vocab_size = 50, smooth.max_len = plain.max_len = 16;
  smooth.n_layer = plain.n_layer = 1, smooth.n_embd = plain.n_embd = 16;
  plain.label_smoothing = 0.f;
  models::Encoder a(smooth, backend()), b(plain, backend());
  a.init_weights(3);
  b.init_weights(3);
  const std::vector<int32_t> ids(2 * 8, 7), lengths = {8, 5}, labels = {0, 1};
  EXPECT_NE(a.train_micro_step(ids.data(), lengths.data(), labels.data(), 2, 8),
            b.train_micro_step(ids.data(), lengths.data(), labels.data(), 2, 8));
  const float* la = a.logits(ids.data(), lengths.data(), 2, 8);
  const std::vector<float> logits_a(la, la + 4);
  EXPECT_TRUE(std::equal(logits_a.begin(), logits_a.end(), b.logits(ids.data(), lengths.data(), 2, 8)));
}

// train.class_weights: "none", "balanced" or one number per class, read
// and written back, refused with the key's name; a train step's loss is
// then sum_i w[y_i] loss_i / sum_i w[y_i] of the rows' own cross-entropy
// (PyTorch's weight=; encoder_torch_crosscheck_class_weights checks the
// gradients), and the logits do not change.
TEST(TrainClassifier, ClassWeightsKey) {
  const std::string head = "[model]\nkind = \"encoder\"\nn_classes = 2\n[train]\n";
  EXPECT_EQ(train::parse_classify_config(head, "a").class_weights, "none");
  const train::ClassifyConfig balanced = train::parse_classify_config(head + "class_weights = \"balanced\"\n", "b");
  EXPECT_EQ(balanced.class_weights, "balanced");
  EXPECT_TRUE(balanced.model.class_weights.empty()) << "filled by the trainer from the train split";
  EXPECT_EQ(train::parse_classify_config(train::to_toml(balanced), "c").class_weights, "balanced");
  const train::ClassifyConfig given = train::parse_classify_config(head + "class_weights = [1, 2.5]\n", "d");
  EXPECT_EQ(given.class_weights, "given");
  EXPECT_EQ(given.model.class_weights, (std::vector<float>{1.f, 2.5f}));
  EXPECT_EQ(train::parse_classify_config(train::to_toml(given), "e").model.class_weights, given.model.class_weights);
  train::ClassifyConfig direct = train::parse_classify_config(head, "f");  // weights set through the API
  direct.model.class_weights = {2.f, 1.f};
  EXPECT_EQ(train::parse_classify_config(train::to_toml(direct), "g").model.class_weights, direct.model.class_weights);
  const std::pair<std::string, std::string> refused[] = {
      {"class_weights = \"uniform\"\n", "train.class_weights must be \"none\", \"balanced\" or an array"},
      {"class_weights = [1, \"x\"]\n", "train.class_weights must be \"none\", \"balanced\" or an array"},
      {"class_weights = []\n", "train.class_weights must be \"none\", \"balanced\" or an array"},
      {"class_weights = [1, 2, 3]\n", "train.class_weights has 3 weights but model.n_classes is 2"},
      {"class_weights = [1, -2]\n", "train.class_weights must be finite numbers >= 0, got -2"},
      {"class_weights = [0, 0]\n", "train.class_weights are all 0"}};
  for (const auto& r : refused)  // no structured binding: clang 14 cannot capture one in the lambda
    EXPECT_NE(message_of([&] { train::parse_classify_config(head + r.first, "x"); }).find(r.second),
              std::string::npos)
        << r.first;

  models::EncoderConfig weighted = given.model, plain = given.model;
  weighted.vocab_size = plain.vocab_size = 50, weighted.max_len = plain.max_len = 16;
  weighted.n_layer = plain.n_layer = 1, weighted.n_embd = plain.n_embd = 16;
  weighted.class_weights = {0.5f, 3.f};
  plain.class_weights.clear();
  models::Encoder a(weighted, backend()), b(plain, backend());
  a.init_weights(3);
  b.init_weights(3);
  // Widths 8, 16 and 8 again: the train programs share one arena, so the
  // third step finds the weights it was given overwritten and must write them again.
  const std::vector<int32_t> lengths = {8, 5, 3}, labels = {0, 1, 1};
  for (const int64_t T : {8, 16, 8}) {
    SCOPED_TRACE("width " + std::to_string(T));
    std::vector<int32_t> ids(size_t(3 * T));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7 + size_t(T)) % 50);
    const float* la = a.logits(ids.data(), lengths.data(), 3, T);
    const std::vector<float> logits(la, la + 6);
    EXPECT_TRUE(std::equal(logits.begin(), logits.end(), b.logits(ids.data(), lengths.data(), 3, T)));
    double sum = 0, weight = 0;
    for (int r = 0; r < 3; ++r) {
      const double z0 = logits[size_t(2 * r)], z1 = logits[size_t(2 * r + 1)], mx = std::max(z0, z1);
      const double lse = mx + std::log(std::exp(z0 - mx) + std::exp(z1 - mx));
      const double w = weighted.class_weights[size_t(labels[size_t(r)])];
      sum += w * (lse - logits[size_t(2 * r + labels[size_t(r)])]);
      weight += w;
    }
    EXPECT_NEAR(a.train_micro_step(ids.data(), lengths.data(), labels.data(), 3, T), sum / weight, 1e-6);
  }
}

// train.class_weights = "balanced": n / (n_classes x count_c) from the train
// split's labels, said at start-up and kept in report.json.
TEST(TrainClassifier, BalancedClassWeightsComeFromTheTrainSplit) {
  SyntheticRun run("brisk_encoder_balanced");
  train::ClassifyConfig& cfg = run.cfg;
  cfg.epochs = 1;
  cfg.class_weights = "balanced";
  const train::ClassifyResult r = train::train_classifier(cfg, {.quiet = true});
  data::RecordStore store(cfg.store);
  std::vector<double> count(2, 0);
  for (int64_t i : r.split.train) ++count[size_t(store.get(i).label)];
  ASSERT_NE(count[0], count[1]) << "the premise: the synthetic store's classes are unbalanced";
  const nlohmann::json report = nlohmann::json::parse(std::ifstream(run.dir / "run/report.json"));
  const std::vector<float> kept = report["training"]["class_weights"].get<std::vector<float>>();
  ASSERT_EQ(kept.size(), 2u);
  for (size_t k = 0; k < 2; ++k)
    EXPECT_FLOAT_EQ(kept[k], float(double(r.split.train.size()) / (2.0 * count[k]))) << "class " << k;
  // They reach the train steps: the same first batch at the same weights has another loss without them.
  SyntheticRun plain("brisk_encoder_unweighted");
  plain.cfg.epochs = 1;
  EXPECT_NE(train::train_classifier(plain.cfg, {.quiet = true}).first_loss, r.first_loss);
}

// train.keep_best and train.early_stop, shared by the epoch runs
// (epoch_config.h): read, written back and checked, each refusal naming the
// key; `higher` is the run's own higher-is-better score.
template <class Config>
void expect_keep_best_keys(Config (*parse)(std::string_view, const std::string&, const std::vector<std::string>&),
                           const std::string& kind, const std::string& higher) {
  SCOPED_TRACE(kind);
  const std::string head = "[model]\nkind = \"" + kind + "\"\n[train]\n";
  const Config c = parse(head + "keep_best = \"" + higher + "\"\nearly_stop = 3\n", "a", {});
  EXPECT_EQ(c.keep_best, higher);
  EXPECT_EQ(c.early_stop, 3);
  const Config back = parse(train::to_toml(c), "b", {});
  EXPECT_EQ(back.keep_best, higher);
  EXPECT_EQ(back.early_stop, 3);
  EXPECT_EQ(parse(head, "c", {}).keep_best, "none");
  EXPECT_EQ(parse(head + "keep_best = \"val_loss\"\n", "d", {}).keep_best, "val_loss");
  const std::pair<std::string, std::string> refused[] = {
      {head + "keep_best = \"f1\"\n", "train.keep_best: unknown value 'f1' (allowed: none, val_loss, " + higher + ")"},
      {head + "early_stop = 2\n", "set train.keep_best to val_loss or " + higher},
      {head + "keep_best = \"val_loss\"\nearly_stop = -1\n", "train.early_stop must not be negative"},
      {"[model]\nkind = \"" + kind + "\"\n[data]\nval_frac = 0\n[train]\nkeep_best = \"val_loss\"\n",
       "data.val_frac is 0"}};
  for (const auto& r : refused)  // no structured binding: clang 14 cannot capture one in the lambda
    EXPECT_NE(message_of([&] { parse(r.first, "x", {}); }).find(r.second), std::string::npos) << r.first;
}

TEST(EpochRunConfig, KeepBestAndEarlyStopKeys) {
  expect_keep_best_keys<train::ClassifyConfig>(train::parse_classify_config, "encoder", "val_f1");
  expect_keep_best_keys<train::AutoencoderConfig>(train::parse_autoencoder_config, "autoencoder", "val_accuracy");
}

// The same with model.dropout and model.classifier_dropout: each step's
// masks come from (train.seed, step), so the resumed steps drop what the
// straight run's did, and the run is not the one without dropout.
TEST(TrainClassifier, ResumedWithDropoutItEndsWithTheStraightRunsWeights) {
  const fs::path dir = fs::temp_directory_path() / ("brisk_encoder_resume_drop_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  synthetic_store(dir);
  train::ClassifyConfig cfg = synthetic_config(dir);
  cfg.model.dropout = 0.1f;
  cfg.model.classifier_dropout = 0.2f;
  double first_loss = 0;
  brisk::testing::expect_resumes_end_as_the_straight_run<train::ClassifyConfig, train::ClassifyResult>(
      dir, cfg,
      [](const train::ClassifyConfig& c, bool resume) {
        return train::train_classifier(c, {.quiet = true, .resume = resume});
      },
      [&](const train::ClassifyResult& r, const train::ClassifyResult& straight) {
        EXPECT_DOUBLE_EQ(r.test.f1, straight.test.f1);
        EXPECT_DOUBLE_EQ(r.val.loss, straight.val.loss);
        first_loss = straight.first_loss;
      });
  train::ClassifyConfig plain = synthetic_config(dir);
  plain.out_dir = (dir / "plain").string();
  EXPECT_NE(train::train_classifier(plain, {.quiet = true}).first_loss, first_loss) << "dropout changed nothing";
  fs::remove_all(dir);
}

// A resume that would not continue the stopped run is refused, naming the
// key and both values; a checkpoint from before resume existed says so; a
// run resumed at its last step only evaluates; none to resume starts fresh.
TEST(TrainClassifier, AResumeThatWouldNotContinueTheRunIsRefusedByName) {
  const fs::path dir = fs::temp_directory_path() / ("brisk_encoder_resume_bad_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  synthetic_store(dir);
  train::ClassifyConfig cfg = synthetic_config(dir);
  cfg.epochs = 1;
  const train::ClassifyResult first = train::train_classifier(cfg, {.quiet = true, .resume = true});
  EXPECT_EQ(first.start_step, 0) << "nothing to resume: a fresh run";
  const int64_t per_epoch = first.steps;

  auto refusal = [&](const std::function<void(train::ClassifyConfig&)>& change) {
    train::ClassifyConfig c = cfg;
    change(c);
    try {
      train::train_classifier(c, {.quiet = true, .resume = true});
    } catch (const core::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string what = refusal([](auto& c) { c.batch = 8; });
  EXPECT_NE(what.find("train.batch = 16, this config has 8"), std::string::npos) << what;
  what = refusal([](auto& c) { c.seed += 1; });
  EXPECT_NE(what.find("train.seed = 1337, this config has 1338"), std::string::npos) << what;
  what = refusal([](auto& c) { c.split_seed = 2; });
  EXPECT_NE(what.find("data.split_seed = 1, this config has 2"), std::string::npos) << what;
  what = refusal([](auto& c) { c.bucket = false; });
  EXPECT_NE(what.find("data.bucket = true, this config has false"), std::string::npos) << what;

  // At its last step: nothing to train, the validation and test figures as before.
  const train::ClassifyResult again = train::train_classifier(cfg, {.quiet = true, .resume = true});
  EXPECT_EQ(again.start_step, per_epoch);
  EXPECT_EQ(again.steps, per_epoch);
  EXPECT_DOUBLE_EQ(again.val.loss, first.val.loss);
  EXPECT_DOUBLE_EQ(again.test.f1, first.test.f1);
  EXPECT_EQ(brisk::testing::step_losses(dir / "run/metrics.jsonl").size(), size_t(per_epoch));

  // A checkpoint without the stream's record (written before resume existed).
  const fs::path state = fs::path(first.checkpoint) / "state.json";
  nlohmann::json st = nlohmann::json::parse(brisk::testing::file_bytes(state));
  nlohmann::json damaged = st;
  damaged["run"]["train_frac"] = 1.5;
  std::ofstream(state) << damaged.dump();
  try {
    train::read_encoder_checkpoint(first.checkpoint);
    ADD_FAILURE() << "a damaged run record was read";
  } catch (const core::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("field 'run.train_frac' must be a number in [0, 1], got 1.5"),
              std::string::npos)
        << e.what();
  }
  st.erase("run");
  std::ofstream(state) << st.dump();
  what = refusal([](auto&) {});
  EXPECT_NE(what.find("cannot be resumed"), std::string::npos) << what;
  fs::remove_all(dir);
}

TEST(TrainClassifier, AnUnknownLabelInTheStoreIsNamed) {
  const fs::path dir = fs::temp_directory_path() / ("brisk_encoder_badlabel_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  synthetic_store(dir, 7);
  try {
    train::train_classifier(synthetic_config(dir), {.quiet = true});
    ADD_FAILURE() << "no error";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("record 100 (rec100) has label 7"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(TrainClassifier, AMissingStoreSaysHowToMakeIt) {
  train::ClassifyConfig c = synthetic_config("/nonexistent");
  try {
    train::train_classifier(c, {.quiet = true});
    ADD_FAILURE() << "no error";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("brisk data emails"), std::string::npos) << e.what();
  }
}

TEST(EncoderCheckpoint, EachKindRefusesTheOther) {
  const fs::path dir = fs::temp_directory_path() / ("brisk_encoder_kinds_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string gpt = brisk::testing::save_tiny_gpt((dir / "gpt").string());
  models::Encoder enc(small_config(), backend());
  enc.init_weights(1);
  const std::string encoder =
      train::save_encoder_checkpoint((dir / "enc").string(), enc, nullptr,
                                     {small_config(), {"a", "b", "c"}, "bytes", false, 5, 1, {}}, 1);
  try {
    train::read_encoder_checkpoint(gpt);
    ADD_FAILURE() << "a GPT checkpoint was read as an encoder";
  } catch (const core::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("a GPT language model"), std::string::npos) << e.what();
  }
  try {
    train::read_checkpoint_config(encoder);
    ADD_FAILURE() << "an encoder checkpoint was read as a GPT";
  } catch (const core::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("an encoder classifier (for brisk classify)"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// The sequence autoencoder as a whole: padding never reaches a real row (the
// same sequences padded two ways give the same latents, logits and loss),
// the gradients match finite differences (also through the latent), a tiny
// batch is overfit, the cached greedy decode equals the recomputing one, the
// feature cache reuses repeated sequences, latents files round-trip and
// refuse damage by name, checkpoint kinds refuse each other, and a short
// train_autoencoder run on a synthetic FASTA store learns to reconstruct
// far above the trivial predictor and reports it, in fp32 and in bf16.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <vector>

#include "../common/report_profile.h"
#include "../common/run_copy.h"
#include "../common/tiny_gpt.h"
#include "../unit/test_util.h"
#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/data/converters.h"
#include "brisk/data/record_store.h"
#include "brisk/models/encoder.h"
#include "brisk/models/seq_autoencoder.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/autoencoder_trainer.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/latents_file.h"

namespace fs = std::filesystem;
using namespace brisk;
using testing_util::backend;
using testing_util::message_of;

namespace {

models::SeqAutoencoderConfig small_config(const std::string& attention = "plain") {
  models::SeqAutoencoderConfig c;
  c.vocab_size = data::kFastaVocab, c.n_layer = 2, c.n_embd = 32, c.n_head = 2, c.max_len = 64, c.latent = 8;
  c.attention = attention;
  return c;
}

std::vector<std::vector<int32_t>> random_rows(const std::vector<int32_t>& lengths, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<std::vector<int32_t>> rows;
  for (int32_t n : lengths) {
    rows.emplace_back();
    for (int32_t t = 0; t < n; ++t) rows.back().push_back(1 + int32_t(rng() % 20));
  }
  return rows;
}

// Right-padded to T with random residues (never seen by a real position).
std::vector<int32_t> padded(const std::vector<std::vector<int32_t>>& rows, int64_t T, uint64_t pad_seed) {
  std::mt19937 rng(static_cast<uint32_t>(pad_seed));
  std::vector<int32_t> ids(rows.size() * size_t(T));
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t t = 0; t < T; ++t)
      ids[r * size_t(T) + size_t(t)] = t < int64_t(rows[r].size()) ? rows[r][size_t(t)] : 1 + int32_t(rng() % 27);
  return ids;
}

double max_abs_diff(const float* a, const float* b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
  return d;
}

// Every parameter's gradient, copied.
std::map<std::string, core::Tensor> grads_of(models::SeqAutoencoder& m) {
  std::map<std::string, core::Tensor> out;
  for (auto& [name, e] : m.params().entries()) out.emplace(name, e.grad.clone());
  return out;
}

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("brisk_ae_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

// ---- the model ------------------------------------------------------------------------

// The attention kernel, and "bf16" for a bf16 train program (flash
// attention on bf16 operands, which rounds a sequence's last key tile up to
// 16 keys, clamped at the width, and masks the rest: the products' shapes
// change with the padding, and their sums' order with them). Encoding and
// logits are fp32 programs in every case.
class SeqAutoencoderPadding : public ::testing::TestWithParam<std::string> {};

TEST_P(SeqAutoencoderPadding, TheSameSequencesPaddedTwoWaysGiveTheSameLatentsLogitsLossAndGradients) {
  const bool bf16 = GetParam() == "bf16";
  models::SeqAutoencoderConfig config = small_config(bf16 ? "flash" : GetParam());
  if (bf16) config.compute = core::DType::bf16;
  models::SeqAutoencoder m(config, backend());
  m.init_weights(7);
  const std::vector<int32_t> lengths = {5, 30, 1, 17};
  const auto rows = random_rows(lengths, 11);
  const auto narrow = padded(rows, 30, 1), wide = padded(rows, 64, 2);
  const int64_t Z = 8, V = data::kFastaVocab, C = config.n_embd;

  const float* z30 = m.encode(narrow.data(), lengths.data(), 4, 30);
  const std::vector<float> a(z30, z30 + 4 * Z);
  const float* z64 = m.encode(wide.data(), lengths.data(), 4, 64);
  EXPECT_LT(max_abs_diff(a.data(), z64, a.size()), 1e-5);
  EXPECT_GT(max_abs_diff(a.data(), a.data() + Z, size_t(Z)), 1e-4) << "rows differ, so the check means something";

  const float* l30 = m.logits(narrow.data(), lengths.data(), 4, 30);
  const std::vector<float> la(l30, l30 + 4 * 30 * V);
  const float* l64 = m.logits(wide.data(), lengths.data(), 4, 64);
  for (int64_t r = 0; r < 4; ++r)
    EXPECT_LT(max_abs_diff(la.data() + r * 30 * V, l64 + r * 64 * V, size_t(lengths[size_t(r)] * V)), 1e-4)
        << "row " << r;
  // Back at width 30, after width 64 ran in each kind's shared arena (which
  // may have left anything in width 30's inputs: zeros here, in its
  // positions), the same numbers again.
  for (auto kind : {models::SeqAutoencoder::Kind::encode, models::SeqAutoencoder::Kind::reconstruct}) {
    models::SeqAutoencoderProgram& p30 = m.program(kind, 4, 30);
    std::memset(p30.executor->data(p30.pos), 0, 30 * sizeof(int32_t));
  }
  EXPECT_EQ(max_abs_diff(a.data(), m.encode(narrow.data(), lengths.data(), 4, 30), a.size()), 0.0);
  EXPECT_EQ(max_abs_diff(la.data(), m.logits(narrow.data(), lengths.data(), 4, 30), la.size()), 0.0);

  m.params().zero_grads();
  const double loss30 = m.train_micro_step(narrow.data(), lengths.data(), 4, 30);
  const auto g30 = grads_of(m);
  m.params().zero_grads();
  const double loss64 = m.train_micro_step(wide.data(), lengths.data(), 4, 64);
  const auto g64 = grads_of(m);
  EXPECT_NEAR(loss30, loss64, 1e-5);
  EXPECT_NEAR(loss30, std::log(double(V)), 0.3) << "a fresh model is close to uniform";
  for (const auto& [name, g] : g30) {
    const core::Tensor& w = g64.at(name);
    if (name == "enc.wpe.weight" || name == "dec.wpe.weight")  // rows past 30 exist only in the wide batch, and get nothing there
      for (int64_t i = 30 * C; i < w.numel(); ++i) ASSERT_EQ(w.item(i), 0.0) << name << " row " << i / C;
    EXPECT_LT(testing_util::normalized_error(g, w), bf16 ? 1e-4 : 1e-5) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, SeqAutoencoderPadding, ::testing::Values("plain", "flash", "bf16"));

// Flash and plain attention are the same model: one train step at the
// protein run's head width (16) over several query tiles and ragged lengths
// gives the same loss and gradients, the encoder's (reached only through
// the latent) included. The attention weights are scaled up from the init's
// 0.02 so that the scores are peaked, as a trained model's are: near-uniform
// attention would hide errors in the online softmax's rescaling.
TEST(SeqAutoencoder, FlashAndPlainAttentionGiveTheSameTrainStep) {
  auto make = [](const std::string& attention) {
    models::SeqAutoencoderConfig c = small_config(attention);
    c.n_embd = 64, c.n_head = 4, c.max_len = 160;
    auto m = std::make_unique<models::SeqAutoencoder>(c, backend());
    m->init_weights(17);
    for (auto& [name, e] : m->params().entries())
      if (name.find("attn.c_attn.weight") != std::string::npos)
        for (int64_t i = 0; i < e.value.numel(); ++i) e.value.data_as<float>()[i] *= 20.f;
    return m;
  };
  const auto plain = make("plain"), flash = make("flash");
  const std::vector<int32_t> lengths = {150, 1, 64, 65, 97, 16, 17, 130};
  const auto ids = padded(random_rows(lengths, 19), 150, 3);
  plain->params().zero_grads();
  flash->params().zero_grads();
  const double lp = plain->train_micro_step(ids.data(), lengths.data(), 8, 150);
  const double lf = flash->train_micro_step(ids.data(), lengths.data(), 8, 150);
  EXPECT_NEAR(lf, lp, 1e-5 * lp);
  const auto gp = grads_of(*plain), gf = grads_of(*flash);
  for (const auto& [name, g] : gp) EXPECT_LT(testing_util::normalized_error(g, gf.at(name)), 1e-4) << name;
}

// train.precision = "bf16": the train program's blocks (both stacks) run in
// bf16 on the fp32 weights, on either bf16 path (native where the CPU has
// avx512_bf16; emulated, forced here, everywhere). Against the fp32 model on
// the same weights and batch the loss and every gradient -- the encoder's
// too, reached only through the latent -- agree within bf16 rounding and
// not exactly; both attention kernels run forward and backward on bf16
// operands; encoding and logits stay the fp32 model's, bit for bit.
TEST(SeqAutoencoder, Bf16TrainStepGivesTheFp32ModelWithinRounding) {
  models::SeqAutoencoderConfig c16 = small_config("flash");
  c16.compute = core::DType::bf16;
  models::SeqAutoencoder fp32(small_config("flash"), backend());
  fp32.init_weights(9);
  const std::vector<int32_t> lengths = {5, 30, 1, 17};
  const auto ids = padded(random_rows(lengths, 13), 30, 1);
  fp32.params().zero_grads();
  const double l32 = fp32.train_micro_step(ids.data(), lengths.data(), 4, 30);
  const auto g32 = grads_of(fp32);
  const int64_t Z = 8, V = data::kFastaVocab;
  const float* z = fp32.encode(ids.data(), lengths.data(), 4, 30);
  const std::vector<float> z32(z, z + 4 * Z);
  const float* l = fp32.logits(ids.data(), lengths.data(), 4, 30);
  const std::vector<float> logits32(l, l + 4 * 30 * V);

  for (const char* path : {static_cast<const char*>(nullptr), "emulated"}) {
    SCOPED_TRACE(path ? path : "the machine's own bf16 path");
    testing_util::ScopedBf16Path scoped(path);
    models::SeqAutoencoder bf16(c16, backend());
    bf16.init_weights(9);
    bf16.params().zero_grads();
    const double l16 = bf16.train_micro_step(ids.data(), lengths.data(), 4, 30);
    EXPECT_NEAR(l16, l32, 2e-5 * l32);
    EXPECT_NE(l16, l32) << "the bf16 blocks must round somewhere";
    const auto g16 = grads_of(bf16);
    for (const auto& [name, g] : g32) EXPECT_LT(testing_util::normalized_error(g, g16.at(name)), 2e-2) << name;

    int bf16_attention = 0;
    const core::Graph& g = bf16.program(models::SeqAutoencoder::Kind::train, 4, 30).graph;
    for (const core::Node& n : g.nodes())
      if (n.op == core::OpKind::masked_flash_attention || n.op == core::OpKind::masked_flash_attention_backward ||
          n.op == core::OpKind::flash_attention || n.op == core::OpKind::flash_attention_backward)
        bf16_attention += g.meta(n.inputs[0]).dtype == core::DType::bf16;
    EXPECT_EQ(bf16_attention, 2 * 2 * 2) << "forward and backward, both layers, both stacks";

    EXPECT_EQ(max_abs_diff(z32.data(), bf16.encode(ids.data(), lengths.data(), 4, 30), z32.size()), 0.0);
    EXPECT_EQ(max_abs_diff(logits32.data(), bf16.logits(ids.data(), lengths.data(), 4, 30), logits32.size()), 0.0);
  }
}

TEST(SeqAutoencoder, GradientsMatchFiniteDifferencesIncludingThroughTheLatent) {
  models::SeqAutoencoder m(small_config(), backend());
  m.init_weights(5);
  const std::vector<int32_t> lengths = {12, 7, 20};
  const auto ids = padded(random_rows(lengths, 3), 32, 4);
  m.params().zero_grads();
  m.train_micro_step(ids.data(), lengths.data(), 3, 32);
  // The weight of largest gradient in each tensor: its effect on the loss is
  // well above float rounding. to_latent only reaches the loss through the
  // decoder, the encoder blocks only through the pooled latent.
  // (Read every gradient before the loss is evaluated again: each
  // train_micro_step adds to the gradients.)
  std::vector<std::pair<std::string, int64_t>> picks;
  std::vector<double> analytics;
  for (const char* name : {"to_latent.weight", "from_latent.weight", "enc.h.0.attn.c_attn.weight",
                           "dec.h.1.mlp.c_fc.weight", "dec.head.weight", "enc.wte.weight"}) {
    const auto& e = m.params().entries().at(name);
    const float* g = e.grad.data_as<float>();
    const int64_t k = std::max_element(g, g + e.grad.numel(), [](float x, float y) { return std::abs(x) < std::abs(y); }) - g;
    picks.emplace_back(name, k);
    analytics.push_back(g[k]);
  }
  for (size_t i = 0; i < picks.size(); ++i) {
    const auto& [name, k] = picks[i];
    const double analytic = analytics[i];
    float* w = m.params().entries().at(name).value.data_as<float>();
    const float w0 = w[k], h = 1e-2f;
    w[k] = w0 + h;
    const double up = m.train_micro_step(ids.data(), lengths.data(), 3, 32);
    w[k] = w0 - h;
    const double down = m.train_micro_step(ids.data(), lengths.data(), 3, 32);
    w[k] = w0;
    const double numeric = (up - down) / (2.0 * double(h));
    EXPECT_GT(std::abs(analytic), 1e-4) << name;
    EXPECT_NEAR(numeric, analytic, 0.05 * std::abs(analytic) + 2e-5) << name << "[" << k << "]";
  }
}

TEST(SeqAutoencoder, OverfitsATinyBatch) {
  models::SeqAutoencoder m(small_config(), backend());
  m.init_weights(9);
  optim::AdamWConfig ac;
  ac.lr = 3e-3f, ac.weight_decay = 0;
  optim::AdamW adamw(ac, m.params(), backend());
  const std::vector<int32_t> lengths = {20, 14, 9, 20};
  const auto ids = padded(random_rows(lengths, 21), 32, 22);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    m.params().zero_grads();
    last = m.train_micro_step(ids.data(), lengths.data(), 4, 32);
    if (step == 0) first = last;
    adamw.step(ac.lr);
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
}

TEST(SeqAutoencoder, CachedGreedyDecodingEqualsRecomputingTheDecoder) {
  models::SeqAutoencoder m(small_config(), backend());
  m.init_weights(13);
  // Larger weights spread the logits, so greedy choices are well separated.
  for (auto& [name, e] : m.params().entries()) {
    float* p = e.value.data_as<float>();
    for (int64_t i = 0; i < e.value.numel(); ++i) p[i] *= 4.f;
  }
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> latents(5 * 8);
  for (float& v : latents) v = nd(rng);
  const std::vector<int32_t> lengths = {40, 1, 64, 33, 7};
  const std::vector<int32_t> a = m.decode_cached(latents.data(), lengths.data(), 5);
  const std::vector<int32_t> b = m.decode_recompute(latents.data(), lengths.data(), 5);
  ASSERT_EQ(a.size(), 5u * 64u);
  EXPECT_EQ(a, b);
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t t = 0; t < 64; ++t) {
      const int32_t tok = a[size_t(r * 64 + t)];
      if (t < lengths[size_t(r)]) EXPECT_TRUE(tok >= 1 && tok < data::kFastaVocab) << r << "," << t;
      else EXPECT_EQ(tok, 0);
    }
  EXPECT_NE(message_of([&] { m.decode(latents.data(), std::vector<int32_t>{65, 1, 1, 1, 1}.data(), 5); })
                .find("decode length 65"),
            std::string::npos);
}

TEST(SeqAutoencoder, BadInputsAreRefusedWithAMessage) {
  models::SeqAutoencoder m(small_config(), backend());
  std::vector<int32_t> ids(2 * 8, 3), lengths = {8, 4};
  ids[9] = 28;
  EXPECT_NE(message_of([&] { m.encode(ids.data(), lengths.data(), 2, 8); }).find("token id 28"), std::string::npos);
  ids[9] = 3;
  lengths[1] = 0;
  EXPECT_NE(message_of([&] { m.encode(ids.data(), lengths.data(), 2, 8); }).find("sequence length 0"),
            std::string::npos);
  EXPECT_NE(message_of([&] { m.encode(std::vector<int32_t>(65, 1).data(), lengths.data(), 1, 65); })
                .find("exceeds model.max_len"),
            std::string::npos);
}

// ---- the feature cache ----------------------------------------------------------------

TEST(LatentCache, RepeatedSequencesReuseTheirLatentWithinAndAcrossCalls) {
  models::SeqAutoencoder m(small_config(), backend());
  m.init_weights(3);
  train::LatentCache cache(m, 1 << 20);
  auto seqs = random_rows({10, 25, 10, 80}, 8);
  seqs[2] = seqs[0];                                           // a repeat within the call
  std::vector<int32_t> long_twin = seqs[3];
  long_twin.push_back(5);                                      // differs only past max_len 64: the same latent
  seqs.push_back(long_twin);
  const std::vector<float> z = cache.encode(seqs);
  EXPECT_EQ(cache.lookups(), 5u);
  EXPECT_EQ(cache.hits(), 2u);
  EXPECT_GT(cache.hit_rate(), 0.0);
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(z[size_t(2 * 8 + k)], z[size_t(k)]);
    EXPECT_EQ(z[size_t(4 * 8 + k)], z[size_t(3 * 8 + k)]);
  }
  // The cached numbers are what encoding the sequence alone gives.
  const std::vector<int32_t> len = {25};
  const float* direct = m.encode(seqs[1].data(), len.data(), 1, 25);
  EXPECT_LT(max_abs_diff(direct, z.data() + 8, 8), 1e-5);
  // A second call: everything is a hit.
  const std::vector<float> again = cache.encode({seqs[1], seqs[0]});
  EXPECT_EQ(cache.hits(), 4u);
  EXPECT_EQ(std::vector<float>(again.begin(), again.begin() + 8), std::vector<float>(z.begin() + 8, z.begin() + 16));
  EXPECT_NE(message_of([&] { cache.encode({seqs[0], {}}); }).find("sequence 1 is empty"), std::string::npos);
}

// ---- latents files --------------------------------------------------------------------

TEST(LatentsFile, RoundTripsAndNamesWhatIsWrong) {
  const fs::path d = temp_dir("latents");
  train::LatentsFile f;
  f.latent = 3, f.max_len = 64, f.checkpoint = "runs/x/step_0000001";
  f.latents = {1, 2, 3, 4, 5, 6};
  f.lengths = {10, 64};
  f.full_lengths = {10, 300};
  f.names = {"sp|P1|first protein", "second \"quoted\""};
  const std::string path = (d / "z.safetensors").string();
  train::write_latents_file(path, f);
  const train::LatentsFile g = train::read_latents_file(path);
  EXPECT_EQ(g.latents, f.latents);
  EXPECT_EQ(g.lengths, f.lengths);
  EXPECT_EQ(g.full_lengths, f.full_lengths);
  EXPECT_EQ(g.names, f.names);
  EXPECT_EQ(g.latent, 3);
  EXPECT_EQ(g.max_len, 64);

  f.lengths = {10, 0};
  train::write_latents_file(path, f);
  EXPECT_NE(message_of([&] { train::read_latents_file(path); }).find("lengths[1] is 0"), std::string::npos);
  // Another safetensors file (a checkpoint's weights) is not a latents file.
  const std::vector<float> w(4, 1.f);
  core::save_safetensors(path, {{"wte.weight", {const_cast<float*>(w.data()), {core::Shape{2, 2}, core::DType::f32}}}});
  EXPECT_NE(message_of([&] { train::read_latents_file(path); }).find("no tensor 'latents'"), std::string::npos);

  // Metadata and tensors that disagree: a format or width of another file,
  // full lengths for other rows or below the encoded lengths.
  f.lengths = {10, 64};
  const std::vector<float> lat = f.latents;
  const std::vector<int32_t> len = f.lengths;
  auto write = [&](std::vector<int32_t> full, std::map<std::string, std::string> meta) {
    const core::TensorMeta lm{core::Shape{2, 3}, core::DType::f32};
    const core::TensorMeta im{core::Shape{int64_t(len.size())}, core::DType::i32};
    const core::TensorMeta fm{core::Shape{int64_t(full.size())}, core::DType::i32};
    core::save_safetensors(path,
                           {{"latents", {const_cast<float*>(lat.data()), lm}},
                            {"lengths", {const_cast<int32_t*>(len.data()), im}},
                            {"full_lengths", {full.data(), fm}}},
                           meta);
    return message_of([&] { train::read_latents_file(path); });
  };
  EXPECT_EQ(write({10, 300}, {{"format", "brisk-latents"}, {"latent", "3"}}), "no error");
  EXPECT_NE(write({10, 300}, {{"format", "other"}}).find("metadata 'format' is 'other'"), std::string::npos);
  EXPECT_NE(write({10, 300}, {{"latent", "8"}}).find("metadata 'latent' says 8 but tensor 'latents' is 3 wide"),
            std::string::npos);
  EXPECT_NE(write({10, 300, 5}, {}).find("tensor 'full_lengths' has 3 entries for 2 latents"), std::string::npos);
  EXPECT_NE(write({10, 60}, {}).find("full_lengths[1] is 60, below lengths[1] (64)"), std::string::npos);
  fs::remove_all(d);
}

// ---- checkpoints ----------------------------------------------------------------------

TEST(AutoencoderCheckpoint, ReloadsAndEachKindRefusesTheOthers) {
  const fs::path d = temp_dir("kinds");
  models::SeqAutoencoder m(small_config(), backend());
  m.init_weights(4);
  const std::string ae = train::save_autoencoder_checkpoint((d / "ae").string(), m, nullptr,
                                                            {small_config(), "fasta", 3, 1, {}}, 1);
  const train::AutoencoderCheckpoint info = train::read_autoencoder_checkpoint(ae);
  EXPECT_TRUE(info.config.same_shape(small_config()));
  EXPECT_EQ(info.tokenizer, "fasta");
  models::SeqAutoencoder back(info.config, backend());
  train::load_autoencoder_checkpoint(ae, back);
  const std::vector<int32_t> ids(16, 4), lengths = {16};
  const float* p0 = m.encode(ids.data(), lengths.data(), 1, 16);
  const std::vector<float> z0(p0, p0 + 8);
  EXPECT_LT(max_abs_diff(z0.data(), back.encode(ids.data(), lengths.data(), 1, 16), 8), 1e-6);

  const std::string gpt = brisk::testing::save_tiny_gpt((d / "gpt").string());
  models::EncoderConfig ec;
  ec.vocab_size = 28, ec.n_layer = 1, ec.n_embd = 16, ec.n_head = 2, ec.max_len = 16, ec.n_classes = 2;
  models::Encoder enc(ec, backend());
  const std::string classifier =
      train::save_encoder_checkpoint((d / "enc").string(), enc, nullptr, {ec, {"a", "b"}, "fasta", false, 1, 1, {}}, 1);
  EXPECT_NE(message_of([&] { train::read_autoencoder_checkpoint(gpt); })
                .find("this checkpoint is a GPT language model (for brisk generate, eval, serve), but a sequence "
                      "autoencoder (for brisk encode, decode) is needed here"),
            std::string::npos);
  EXPECT_NE(message_of([&] { train::read_autoencoder_checkpoint(classifier); }).find("an encoder classifier"),
            std::string::npos);
  EXPECT_NE(message_of([&] { train::read_checkpoint_config(ae); })
                .find("this checkpoint is a sequence autoencoder (for brisk encode, decode), but a GPT"),
            std::string::npos);
  EXPECT_NE(message_of([&] { train::read_encoder_checkpoint(ae); }).find("a sequence autoencoder"),
            std::string::npos);
  fs::remove_all(d);
}

// ---- config ---------------------------------------------------------------------------

TEST(AutoencoderConfig, DefaultsKeysAndErrors) {
  const train::AutoencoderConfig c = train::parse_autoencoder_config("[model]\nkind = \"autoencoder\"\n", "a.toml");
  EXPECT_EQ(c.model.vocab_size, data::kFastaVocab);
  EXPECT_EQ(c.store, "data/protein.lmdb");
  const train::AutoencoderConfig back = train::parse_autoencoder_config(train::to_toml(c), "b.toml");
  EXPECT_TRUE(back.model.same_shape(c.model));
  EXPECT_EQ(back.epochs, c.epochs);
  EXPECT_EQ(train::parse_autoencoder_config("[model]\nkind = \"autoencoder\"\n[checkpoint]\nevery = 7\n", "e.toml")
                .checkpoint_every,
            7);
  EXPECT_NE(message_of([] {
              train::parse_autoencoder_config("[model]\nkind = \"autoencoder\"\n[checkpoint]\nevery = -2\n", "x.toml");
            }).find("checkpoint.every must not be negative"),
            std::string::npos);
  EXPECT_NE(message_of([] { train::parse_autoencoder_config("[model]\nkind = \"autoencoder\"\nn_classes = 2\n", "x.toml"); })
                .find("unknown key 'model.n_classes'"),
            std::string::npos);
  EXPECT_NE(message_of([] { train::parse_autoencoder_config("[model]\nkind = \"autoencoder\"\nlatent = 0\n", "x.toml"); })
                .find("model.latent must be in"),
            std::string::npos);
  // data.cache_mb = 0 is no cache, as for the encoder classifier; past 2^24 MiB the byte budget would overflow.
  EXPECT_EQ(train::parse_autoencoder_config("[model]\nkind = \"autoencoder\"\n[data]\ncache_mb = 0\n", "z.toml").cache_mb, 0);
  EXPECT_NE(message_of([] {
              train::parse_autoencoder_config("[model]\nkind = \"autoencoder\"\n[data]\ncache_mb = 99999999999\n",
                                              "x.toml");
            }).find("data.cache_mb must be in [0,"),
            std::string::npos);
  EXPECT_NE(message_of([] { train::parse_autoencoder_config("[model]\nkind = \"encoder\"\n", "x.toml"); })
                .find("model.kind must be \"autoencoder\""),
            std::string::npos);
  // train.precision: fp32 (default) or bf16, written back; fp16 refused by name.
  EXPECT_EQ(c.precision, train::Precision::fp32);
  EXPECT_TRUE(c.precision_fallback);
  const train::AutoencoderConfig b16 = train::parse_autoencoder_config(
      "[model]\nkind = \"autoencoder\"\n[train]\nprecision = \"bf16\"\nprecision_fallback = false\n", "p.toml");
  EXPECT_EQ(b16.precision, train::Precision::bf16);
  const train::AutoencoderConfig b16_back = train::parse_autoencoder_config(train::to_toml(b16), "q.toml");
  EXPECT_EQ(b16_back.precision, train::Precision::bf16);
  EXPECT_FALSE(b16_back.precision_fallback);
  EXPECT_EQ(train::to_toml(b16_back), train::to_toml(b16)) << "every key written back as read";
  EXPECT_NE(message_of([] {
              train::parse_autoencoder_config("[model]\nkind = \"autoencoder\"\n[train]\nprecision = \"fp16\"\n",
                                              "x.toml");
            }).find("fp16 is not available for encoder-bodied runs"),
            std::string::npos);
}

// ---- a whole run on a synthetic FASTA store -------------------------------------------

namespace {

// Four protein "families": each record is its family's random sequence
// (12..41 residues, 40 for the first) with 5% of the residues changed at random. Knowing the
// family -- which only the latent can tell at the first positions -- gives
// ~95% of the residues; the most frequent residue gives ~10%. Some records
// are longer than max_len 32 (cut), every 25th repeats an earlier record
// word for word (left out of the split).
std::string synthetic_fasta(const fs::path& dir) {
  const std::string alphabet = "ACDEFGHIKLMNPQRSTVWY";
  std::mt19937 rng(5);
  std::vector<std::string> families;
  for (int f = 0; f < 4; ++f) {
    std::string s;
    const int n = f == 0 ? 40 : 12 + int(rng() % 30);  // family 0 is cut to max_len 32
    for (int j = 0; j < n; ++j) s += alphabet[rng() % 20];
    families.push_back(s);
  }
  std::string text;
  std::vector<std::string> made;
  for (int i = 0; i < 200; ++i) {
    std::string s;
    if (i % 25 == 24) {
      s = made[size_t(rng() % made.size())];
    } else {
      for (char c : families[rng() % 4]) s += rng() % 20 == 0 ? alphabet[rng() % 20] : c;
    }
    made.push_back(s);
    text += ">syn" + std::to_string(i) + " synthetic\n";
    for (size_t j = 0; j < s.size(); j += 50) text += s.substr(j, 50) + "\n";
  }
  const std::string fa = (dir / "synthetic.fa").string();
  std::ofstream(fa) << text;
  const std::string store = (dir / "synthetic.lmdb").string();
  data::fasta_to_lmdb({fa}, store, {});
  return store;
}

train::AutoencoderConfig synthetic_config(const fs::path& dir) {
  train::AutoencoderConfig c = train::parse_autoencoder_config(R"(
[model]
kind = "autoencoder"
n_layer = 1
n_embd = 32
n_head = 2
max_len = 32
latent = 16
[data]
train_frac = 0.8
val_frac = 0.1
[train]
batch = 8
epochs = 12
lr = 1e-2
warmup = 10
threads = 2
loader_workers = 1
log_every = 1000
)",
                                                               "synthetic.toml");
  c.store = (dir / "synthetic.lmdb").string();
  c.out_dir = (dir / "run").string();
  return c;
}

}  // namespace

namespace {

// The run's last checkpoint, reloaded, gives its reported test figures
// exactly: the same loss and teacher-forced and free-running accuracy.
void expect_checkpoint_reproduces_the_test_figures(const train::AutoencoderConfig& cfg,
                                                   const train::AutoencoderResult& r) {
  const train::AutoencoderCheckpoint info = train::read_autoencoder_checkpoint(r.checkpoint);
  models::SeqAutoencoder reloaded(info.config, backend());
  train::load_autoencoder_checkpoint(r.checkpoint, reloaded);
  data::RecordStore store(cfg.store);
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t i : r.split.test) seqs.push_back(store.get(i).tokens);
  const train::Reconstruction again = train::evaluate_reconstruction(reloaded, seqs, r.test.trivial_token, true);
  EXPECT_DOUBLE_EQ(again.loss, r.test.loss);
  EXPECT_DOUBLE_EQ(again.teacher_forced, r.test.teacher_forced);
  EXPECT_DOUBLE_EQ(again.free_running, r.test.free_running);
}

}  // namespace

TEST(TrainAutoencoder, LearnsToReconstructASyntheticStoreAndReportsIt) {
  const fs::path dir = temp_dir("run");
  synthetic_fasta(dir);
  const train::AutoencoderConfig cfg = synthetic_config(dir);
  const train::AutoencoderResult r = train::train_autoencoder(cfg, {.quiet = true, .profile = true});

  EXPECT_EQ(r.records, 200);
  EXPECT_GE(r.duplicates, 8);  // every 25th is a repeat (and maybe more by chance)
  EXPECT_EQ(int64_t(r.split.train.size() + r.split.val.size() + r.split.test.size()), 200 - r.duplicates);
  EXPECT_GT(r.truncated, 0);
  EXPECT_LT(r.last_loss, 0.5 * r.first_loss);
  EXPECT_GT(r.cache_hit_rate, 0.5) << "epochs 2.. read the records epoch 1 cached";
  EXPECT_LT(r.padding_waste, 0.5);
  EXPECT_GT(r.test.residues, 0);
  EXPECT_LT(r.test.trivial, 0.25);
  EXPECT_GT(r.test.teacher_forced, r.test.trivial + 0.4) << "trivial " << r.test.trivial;
  EXPECT_GT(r.test.free_running, r.test.trivial + 0.3) << "the latent must tell the family";
  std::printf("[ info ] synthetic families, %lld steps: test teacher-forced %.3f, free-running %.3f, trivial %.3f\n",
              (long long)r.steps, r.test.teacher_forced, r.test.free_running, r.test.trivial);

  const nlohmann::json report = nlohmann::json::parse(std::ifstream(dir / "run/report.json"));
  EXPECT_DOUBLE_EQ(report["test"]["teacher_forced_accuracy"].get<double>(), r.test.teacher_forced);
  EXPECT_DOUBLE_EQ(report["test"]["free_running_accuracy"].get<double>(), r.test.free_running);
  EXPECT_DOUBLE_EQ(report["test"]["trivial_accuracy"].get<double>(), r.test.trivial);
  EXPECT_EQ(report["split"]["test"].get<size_t>(), r.split.test.size());
  EXPECT_TRUE(report["training"]["cache"].contains("hit_rate"));
  // The profile: the encoder's masked attention and the decoder's causal one
  // (flash, the default), once per layer per step.
  const nlohmann::json& profile = report.at("profile");
  EXPECT_EQ(profile.at("masked_flash_attention").at("calls").get<int64_t>(), r.steps * cfg.model.n_layer);
  EXPECT_EQ(profile.at("flash_attention").at("calls").get<int64_t>(), r.steps * cfg.model.n_layer);
  EXPECT_TRUE(fs::exists(dir / "run/metrics.jsonl"));

  expect_checkpoint_reproduces_the_test_figures(cfg, r);
  fs::remove_all(dir);
}

// The classifier's resume test (encoder_test.cpp) for the autoencoder, whose
// input dropout draws from a generator of its own: a checkpoint keeps the
// generator's state, so a run resumed mid-epoch or at an epoch's end blanks
// the same residues and ends with the uninterrupted run's weights bit for bit.
TEST(TrainAutoencoder, ResumedFromAnyCheckpointItEndsWithTheStraightRunsWeights) {
  const fs::path dir = temp_dir("resume");
  synthetic_fasta(dir);
  const train::AutoencoderConfig cfg = synthetic_config(dir);
  ASSERT_GT(cfg.input_dropout, 0);
  brisk::testing::expect_resumes_end_as_the_straight_run<train::AutoencoderConfig, train::AutoencoderResult>(
      dir, cfg,
      [](const train::AutoencoderConfig& c, bool resume) {
        return train::train_autoencoder(c, {.quiet = true, .resume = resume});
      },
      [](const train::AutoencoderResult& r, const train::AutoencoderResult& straight) {
        EXPECT_DOUBLE_EQ(r.test.teacher_forced, straight.test.teacher_forced);
        EXPECT_DOUBLE_EQ(r.test.free_running, straight.test.free_running);
      });
  // The checkpoints keep the dropout generator's state, which has moved on from the seed.
  const train::AutoencoderCheckpoint saved = train::read_autoencoder_checkpoint((dir / "run/step_0000005").string());
  ASSERT_TRUE(saved.run.has_value());
  EXPECT_NE(saved.run->input_dropout_state, cfg.seed);
  fs::remove_all(dir);
}

// train.precision = "bf16" without the fallback learns the families as the
// fp32 run does on either bf16 path (native where the CPU has avx512_bf16;
// emulated, forced here, everywhere): its train steps cast the weights to
// bf16 (an fp32 train graph has no casts), it says which path ran, and its
// checkpoint holds fp32 weights that reproduce the reported test figures
// (the run evaluates in fp32, as the checkpoint does).
TEST(TrainAutoencoder, Bf16RunLearnsTheSyntheticStore) {
  for (const char* path : {static_cast<const char*>(nullptr), "emulated"}) {
    SCOPED_TRACE(path ? path : "the machine's own bf16 path");
    testing_util::ScopedBf16Path scoped(path);
    const fs::path dir = temp_dir("bf16");
    synthetic_fasta(dir);
    train::AutoencoderConfig cfg = synthetic_config(dir);
    cfg.precision = train::Precision::bf16;
    cfg.precision_fallback = false;
    const train::AutoencoderResult r = train::train_autoencoder(cfg, {.quiet = true, .profile = true});
    EXPECT_EQ(r.precision_path, std::string(cpu::bf16_path_name(cpu::cpu_features().bf16)));
    EXPECT_GT(brisk::testing::profile_calls(dir / "run/report.json", "cast"), 0) << "the weights are cast to bf16 at their use";
    EXPECT_LT(r.last_loss, 0.5 * r.first_loss);
    EXPECT_GT(r.test.teacher_forced, r.test.trivial + 0.4) << "trivial " << r.test.trivial;
    EXPECT_GT(r.test.free_running, r.test.trivial + 0.3) << "the latent must tell the family";
    const nlohmann::json report = nlohmann::json::parse(std::ifstream(dir / "run/report.json"));
    EXPECT_EQ(report["training"]["precision"], "bf16");
    EXPECT_EQ(report["training"]["precision_path"], r.precision_path);

    for (const auto& [name, t] : core::load_safetensors(r.checkpoint + "/model.safetensors").tensors)
      EXPECT_EQ(t.dtype(), core::DType::f32) << name;
    expect_checkpoint_reproduces_the_test_figures(cfg, r);
    fs::remove_all(dir);
  }
}

// Where bf16 would be emulated (an AVX2 CPU; forced here), train.precision =
// "bf16" with the default fallback trains in fp32 -- no casts in its steps --
// and the result and the report name that path.
TEST(TrainAutoencoder, Bf16WithoutBf16DotProductsFallsBackToFp32) {
  testing_util::ScopedBf16Path emulated("emulated");
  const fs::path dir = temp_dir("fallback");
  synthetic_fasta(dir);
  train::AutoencoderConfig cfg = synthetic_config(dir);
  cfg.precision = train::Precision::bf16;
  cfg.epochs = 1;
  const train::AutoencoderResult r = train::train_autoencoder(cfg, {.quiet = true, .profile = true});
  EXPECT_EQ(r.precision_path, "fp32");
  EXPECT_EQ(brisk::testing::profile_calls(dir / "run/report.json", "cast"), 0);
  EXPECT_GT(brisk::testing::profile_calls(dir / "run/report.json", "flash_attention"), 0) << "the profile holds the steps' ops";
  const nlohmann::json report = nlohmann::json::parse(std::ifstream(dir / "run/report.json"));
  EXPECT_EQ(report["training"]["precision"], "fp32");
  fs::remove_all(dir);
}

// train.recompute = "full" replays both stacks' blocks in every backward
// (each attention forward runs twice), at both batch widths of the run
// (they share one train arena), and trains the same run bit for bit: the
// same loss at every step, the same weights, the same test figures; the
// level is in the report.
TEST(TrainAutoencoder, RecomputeFullTrainsTheSameRun) {
  const fs::path dir = temp_dir("recompute");
  synthetic_fasta(dir);
  train::AutoencoderConfig cfg = synthetic_config(dir);
  cfg.epochs = 4;
  cfg.model.max_len = 64;  // rows of 12-41 residues: batches of width 32 and 64
  cfg.out_dir = (dir / "none").string();
  const train::AutoencoderResult none = train::train_autoencoder(cfg, {.quiet = true, .profile = true});
  cfg.model.recompute = "full";
  cfg.out_dir = (dir / "full").string();
  const train::AutoencoderResult full = train::train_autoencoder(cfg, {.quiet = true, .profile = true});
  for (const char* op : {"flash_attention", "masked_flash_attention"}) {  // each block's forward runs twice
    EXPECT_EQ(brisk::testing::profile_calls(dir / "none/report.json", op), none.steps * cfg.model.n_layer) << op;
    EXPECT_EQ(brisk::testing::profile_calls(dir / "full/report.json", op),
              2 * brisk::testing::profile_calls(dir / "none/report.json", op)) << op;
  }
  EXPECT_EQ(brisk::testing::step_losses(dir / "full/metrics.jsonl"), brisk::testing::step_losses(dir / "none/metrics.jsonl"));
  EXPECT_EQ(brisk::testing::file_bytes(full.checkpoint + "/model.safetensors"),
            brisk::testing::file_bytes(none.checkpoint + "/model.safetensors"));
  EXPECT_DOUBLE_EQ(full.test.loss, none.test.loss);
  EXPECT_DOUBLE_EQ(full.test.free_running, none.test.free_running);
  const nlohmann::json report = nlohmann::json::parse(std::ifstream(dir / "full/report.json"));
  EXPECT_EQ(report["training"]["recompute"], "full");
  std::set<int64_t> widths;
  std::ifstream metrics(dir / "full/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (row.contains("batch_width")) widths.insert(row["batch_width"].get<int64_t>());
  }
  EXPECT_EQ(widths, (std::set<int64_t>{32, 64}));
  fs::remove_all(dir);
}

TEST(TrainAutoencoder, AMissingOrForeignStoreIsNamed) {
  const fs::path dir = temp_dir("missing");
  train::AutoencoderConfig c = synthetic_config(dir);
  EXPECT_NE(message_of([&] { train::train_autoencoder(c, {.quiet = true}); }).find("brisk data fasta2lmdb"),
            std::string::npos);
  data::RecordWriterOptions o;
  o.tokenizer = "bytes", o.vocab_size = 256;
  data::RecordWriter w(c.store, o);
  w.add(std::vector<int32_t>{1, 2, 3}, 0, "x");
  w.finish();
  EXPECT_NE(message_of([&] { train::train_autoencoder(c, {.quiet = true}); }).find("holds 'bytes' tokens"),
            std::string::npos);
  fs::remove_all(dir);
}

// ---- train.keep_best and train.early_stop ----------------------------------------------

namespace {

// Each epoch's validation (metrics.jsonl): teacher-forced accuracy and loss.
std::vector<std::pair<double, double>> val_accuracy_and_loss(const fs::path& run) {
  std::vector<std::pair<double, double>> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("val"))
      out.emplace_back(j["val"]["teacher_forced_accuracy"].get<double>(), j["val"]["loss"].get<double>());
  }
  return out;
}

// The test split's reconstruction by the checkpoint in `ckpt`, read back on its own.
train::Reconstruction test_reconstruction(const std::string& ckpt, const train::AutoencoderConfig& cfg,
                                          const train::AutoencoderResult& r) {
  const train::AutoencoderCheckpoint info = train::read_autoencoder_checkpoint(ckpt);
  models::SeqAutoencoder m(info.config, backend());
  train::load_autoencoder_checkpoint(ckpt, m);
  data::RecordStore store(cfg.store);
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t i : r.split.test) seqs.push_back(store.get(i).tokens);
  return train::evaluate_reconstruction(m, seqs, r.test.trivial_token, true);
}

}  // namespace

// train.keep_best = "val_loss": the epoch with the lowest validation loss
// keeps its weights in <out_dir>/best/, and the reported val and test
// figures are that checkpoint's (read back on their own), not the last
// epoch's. Trained on 20% of the synthetic store without input dropout at
// a constant lr, the run overfits: its val loss bottoms out near epoch 14
// (0.83 on this machine) and ends near 0.9.
TEST(TrainAutoencoder, KeepBestScoresTheTestSplitOnTheBestEpochsWeights) {
  const fs::path dir = temp_dir("best");
  synthetic_fasta(dir);
  train::AutoencoderConfig cfg = synthetic_config(dir);
  cfg.keep_best = "val_loss";
  cfg.epochs = 24;
  cfg.train_frac = 0.2;
  cfg.val_frac = 0.3;
  cfg.input_dropout = 0;
  cfg.schedule.kind = optim::Schedule::constant;
  const train::AutoencoderResult r = train::train_autoencoder(cfg, {.quiet = true});
  const auto vals = val_accuracy_and_loss(dir / "run");
  ASSERT_EQ(int64_t(vals.size()), cfg.epochs);
  size_t best = 0;
  for (size_t e = 1; e < vals.size(); ++e)
    if (vals[e].second < vals[best].second) best = e;
  ASSERT_LT(best + 1, vals.size()) << "the premise: the val loss stops falling before the last epoch";
  EXPECT_EQ(r.best_epoch, int64_t(best) + 1);
  EXPECT_EQ(r.best_score, vals[best].second);
  EXPECT_EQ(r.val.loss, vals[best].second) << "val is the best epoch's, not the last one's";
  EXPECT_FALSE(r.early_stopped);
  EXPECT_EQ(fs::path(r.best_checkpoint).parent_path(), dir / "run" / "best");
  const train::Reconstruction best_test = test_reconstruction(r.best_checkpoint, cfg, r);
  EXPECT_EQ(r.test.loss, best_test.loss);
  EXPECT_EQ(r.test.free_running, best_test.free_running);
  EXPECT_NE(r.test.loss, test_reconstruction(r.checkpoint, cfg, r).loss) << "the last epoch's weights";
  const nlohmann::json report = nlohmann::json::parse(std::ifstream(dir / "run/report.json"));
  EXPECT_EQ(report["best"]["epoch"], r.best_epoch);
  EXPECT_EQ(report["best"]["metric"], "val_loss");
  EXPECT_DOUBLE_EQ(report["test"]["loss"].get<double>(), r.test.loss);
  fs::remove_all(dir);
}

// train.early_stop with keep_best = "val_accuracy" (teacher-forced, higher
// is better; a tie is no improvement, and the accuracy of ~500 validation
// residues often ties): training ends once early_stop epochs
// in a row did not beat the best one, a --resume of the stopped run trains
// nothing more and reports the same figures, and a fresh run is refused the
// directory that holds the best epoch.
TEST(TrainAutoencoder, EarlyStopEndsTrainingAndAResumeStaysStopped) {
  const fs::path dir = temp_dir("stop");
  synthetic_fasta(dir);
  train::AutoencoderConfig cfg = synthetic_config(dir);
  cfg.keep_best = "val_accuracy";
  cfg.early_stop = 2;
  cfg.epochs = 30;
  const train::AutoencoderResult r = train::train_autoencoder(cfg, {.quiet = true});
  const auto vals = val_accuracy_and_loss(dir / "run");
  ASSERT_GE(r.best_epoch, 1);
  EXPECT_TRUE(r.early_stopped);
  EXPECT_EQ(r.epochs, r.best_epoch + 2);
  EXPECT_EQ(int64_t(vals.size()), r.epochs) << "one validation per epoch trained";
  EXPECT_EQ(vals[size_t(r.best_epoch - 1)].first, r.best_score);
  for (size_t e = size_t(r.best_epoch); e < vals.size(); ++e) EXPECT_LE(vals[e].first, r.best_score);
  EXPECT_EQ(r.val.teacher_forced, r.best_score);

  brisk::testing::expect_stopped_run_stays_stopped<train::AutoencoderResult>(
      dir / "run", r, [&](bool resume) { return train::train_autoencoder(cfg, {.quiet = true, .resume = resume}); });
  fs::remove_all(dir);
}

// brisk_encoder_dump: everything an independent implementation needs to check
// brisk's encoder classifier end to end, written to one directory for
// encoder_torch_check.py (the encoder's counterpart of brisk_gpt_dump).
//
// A small Encoder with deliberately odd sizes (vocab 97, n_embd 48, 2 layers,
// 4 heads, 3 classes, max_len 40 so wpe has rows no position uses) is
// initialised from a seed and then sharpened (see sharpen() for why), and for
// each attention kernel ("plain", "flash") OUT_DIR/<attention>/ holds:
//   tensors.safetensors  "param.<name>" every initial weight in brisk's own
//                        layout (Linear weights (out, in), like torch.nn.Linear),
//                        ids (B, T), lengths (B), labels (B), the logits of
//                        Encoder::logits, and "grad.<name>" for every parameter
//                        after one train_micro_step (loss scale 1, grads zeroed).
//   results.json         config, batch shape, seed and the loss (and, with
//                        dropout, the step's dropout key).
// With probabilities after OUT_DIR (model.dropout, model.attention_dropout,
// model.classifier_dropout) the train step drops with them under the key of
// step 0 (models::dropout_key); the logits never drop. A fourth number is
// train.label_smoothing for the train step's loss, and three more after it
// are train.class_weights (one per class).
// The batch is B = 5 right-padded rows of T = 37 with lengths 37, 1 and values
// between, and the padding holds random token ids rather than zeros: a kernel
// that let padding leak into a real row would change the numbers, where zero
// ids (one fixed embedding row) could hide it.
// The weights are written straight from the ParameterStore, not through the
// encoder checkpoint writer, so this check depends on the model and the ops
// only. Every value comes from the public API the classifier trainer uses.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/encoder.h"
#include "brisk/models/transformer_block.h"  // models::dropout_key

using namespace brisk;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kBatch = 5, kSeq = 37;
constexpr uint64_t kSeed = 4321;
// 1 and T are the edge cases of the masks (one real key; no padding at all);
// the others leave short and long padded tails.
const std::vector<int32_t> kLengths = {37, 1, 20, 9, 33};

// Values in [0, n) from a fixed 64-bit LCG: reproducible and independent of
// any library RNG, and the dump carries them anyway.
std::vector<int32_t> draws(uint64_t seed, int64_t count, int64_t n) {
  std::vector<int32_t> out(static_cast<size_t>(count));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& t : out) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t = int32_t((s >> 33) % uint64_t(n));
  }
  return out;
}

core::Tensor i32_tensor(const std::vector<int32_t>& v, core::Shape shape) {
  core::Tensor t = core::Tensor::empty(shape, core::DType::i32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

// init_weights alone makes a weak test point: with std-0.02 matrices the
// attention scores are ~1e-2, so softmax is nearly uniform over the real keys
// (a wrong score scale or a mask off by one key barely shows), GELU sees
// inputs near 0 (where its tanh and erf forms agree to 1e-5), and zero biases
// and unit LayerNorm gains make a forward that drops a bias or a gain
// indistinguishable. So, after init_weights, matrices and embeddings are
// scaled by 8 (scores and GELU inputs of order 1) and every bias and
// LayerNorm gain gets a distinct value. The result is still an ordinary set
// of weights; the reference loads whatever the dump holds.
void sharpen(core::ParameterStore& ps) {
  uint64_t s = 77;
  auto uniform = [&] {  // in [-1, 1), the same LCG as draws()
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return double(s >> 11) * 0x1.0p-52 - 1.0;
  };
  for (auto& [name, e] : ps.entries()) {
    core::Tensor h = ps.download(e.value).clone();
    float* v = h.data_as<float>();
    const bool bias = name.ends_with(".bias"), gain = !bias && name.find("ln_") != std::string::npos;
    for (int64_t i = 0; i < h.numel(); ++i)
      v[i] = bias ? float(0.1 * uniform()) : gain ? float(1.0 + 0.3 * uniform()) : 8.f * v[i];
    ps.upload(e.value, h);
  }
}

struct Dropouts {
  float dropout = 0.f, attention = 0.f, classifier = 0.f, label_smoothing = 0.f;
  std::vector<float> class_weights;
};

models::EncoderConfig config(const std::string& attention, const Dropouts& d) {
  models::EncoderConfig c;
  c.vocab_size = 97, c.n_layer = 2, c.n_embd = 48, c.n_head = 4, c.max_len = 40, c.n_classes = 3;
  c.attention = attention;
  c.dropout = d.dropout, c.attention_dropout = d.attention, c.classifier_dropout = d.classifier;
  c.label_smoothing = d.label_smoothing;
  c.class_weights = d.class_weights;
  return c;
}

void dump(const std::string& dir, const std::string& attention, const Dropouts& drop) {
  const models::EncoderConfig cfg = config(attention, drop);
  cpu::CpuBackend backend(2);
  models::Encoder model(cfg, backend);
  model.init_weights(kSeed);
  sharpen(model.params());
  fs::create_directories(dir);

  // Every position, padding included, gets a random id; labels are random
  // (the check is about numbers, not learnability).
  const std::vector<int32_t> ids = draws(2000, kBatch * kSeq, cfg.vocab_size);
  const std::vector<int32_t> labels = draws(2001, kBatch, cfg.n_classes);

  std::vector<core::Tensor> keep_alive;
  keep_alive.reserve(4 + 2 * model.params().entries().size());
  std::vector<core::NamedTensor> tensors;
  auto add = [&](const std::string& name, core::Tensor t) {
    keep_alive.push_back(std::move(t));
    tensors.push_back({name, keep_alive.back().as_view()});
  };
  add("ids", i32_tensor(ids, {kBatch, kSeq}));
  add("lengths", i32_tensor(kLengths, {kBatch}));
  add("labels", i32_tensor(labels, {kBatch}));
  // Weights before the step (the step only accumulates gradients, but reading
  // them first keeps the dump correct should that ever change).
  for (const auto& [name, e] : model.params().entries()) add("param." + name, model.params().download(e.value).clone());

  const float* lg = model.logits(ids.data(), kLengths.data(), kBatch, kSeq);
  core::Tensor logits = core::Tensor::empty({kBatch, cfg.n_classes}, core::DType::f32);
  std::copy(lg, lg + logits.numel(), logits.data_as<float>());
  add("logits", std::move(logits));

  model.params().zero_grads();
  const uint64_t key = models::dropout_key(kSeed, 0, 0, 0);
  const double loss = model.train_micro_step(ids.data(), kLengths.data(), labels.data(), kBatch, kSeq, 1.0, key);
  for (const auto& [name, e] : model.params().entries()) add("grad." + name, model.params().download(e.grad).clone());
  core::save_safetensors((fs::path(dir) / "tensors.safetensors").string(), tensors);

  nlohmann::json res = {
      {"config", {{"vocab_size", cfg.vocab_size}, {"n_layer", cfg.n_layer}, {"n_embd", cfg.n_embd},
                  {"n_head", cfg.n_head}, {"max_len", cfg.max_len}, {"n_classes", cfg.n_classes},
                  {"attention", cfg.attention}, {"dropout", cfg.dropout},
                  {"attention_dropout", cfg.attention_dropout}, {"classifier_dropout", cfg.classifier_dropout},
                  {"label_smoothing", cfg.label_smoothing}, {"class_weights", cfg.class_weights}}},
      {"dropout_key", {uint32_t(key), uint32_t(key >> 32)}},
      {"batch", kBatch},
      {"seq", kSeq},
      {"seed", kSeed},
      {"loss", loss}};
  std::ofstream((fs::path(dir) / "results.json").string()) << res.dump(2) << "\n";
  std::printf("brisk_encoder_dump: wrote %s (attention %s, loss %.6f)\n", dir.c_str(), attention.c_str(), loss);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 5 && argc != 6 && argc != 9) {
    std::fprintf(stderr,
                 "usage: %s OUT_DIR [DROPOUT ATTENTION_DROPOUT CLASSIFIER_DROPOUT [LABEL_SMOOTHING [W0 W1 W2]]]   "
                 "(writes OUT_DIR/plain and OUT_DIR/flash)\n",
                 argv[0]);
    return 2;
  }
  try {
    Dropouts drop;
    if (argc >= 5) drop = {std::stof(argv[2]), std::stof(argv[3]), std::stof(argv[4])};
    if (argc >= 6) drop.label_smoothing = std::stof(argv[5]);
    for (int i = 6; i < argc; ++i) drop.class_weights.push_back(std::stof(argv[i]));
    for (const char* attention : {"plain", "flash"})
      dump((fs::path(argv[1]) / attention).string(), attention, drop);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "brisk_encoder_dump: %s\n", e.what());
    return 1;
  }
}

// brisk_gpt_dump: everything an independent implementation needs to check
// brisk's GPT end to end, written to one directory for gpt_torch_check.py.
//
// A small GPT with deliberately odd sizes (vocab 97, n_embd 48, 2 layers,
// 4 heads, batch 3 x seq 16 inside a block of 32, so wpe has rows that no
// position uses) is initialised from a seed, and the dump holds:
//   ckpt/step_0000000/   the initial weights, written by brisk's own
//                        train::save_checkpoint: HF GPT-2 names, Conv1D
//                        weights transposed to HF's (in, out) layout. Going
//                        through the real writer means the cross-check also
//                        checks the checkpoint layout a HF loader relies on.
//   tensors.safetensors  x (B, T) and y (B*T) of the first batch, the logits
//                        of Gpt::logits, and "grad.<name>" for every parameter
//                        after one train_micro_step — gradients in brisk's own
//                        layout (Linear weights (out, in), like torch.nn.Linear).
//   steps.safetensors    x.<k>, y.<k>: the batch of optimizer step k (k = 0..9,
//                        batch 0 is the first batch above).
//   final.safetensors    every parameter after the 10 steps (brisk layout).
//   results.json         config, the first loss, and for 10 AdamW steps the
//                        loss (before that step's update), grad norm and lr.
// With a dropout probability as the third argument the model trains with
// model.dropout = P (a fourth, model.attention_dropout = A, and a fifth,
// model.attention: plain, the default, or flash): the first
// gradients and step k use the dropout key of step k (models::dropout_key),
// which results.json lists as two 32-bit words per step, so the check can
// make the same masks.
// Every value comes from the public API the trainer uses (Gpt, AdamW,
// save_checkpoint), so nothing here re-implements what it is meant to check.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brisk/core/backend_loader.h"
#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/models/transformer_block.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/checkpoint.h"

using namespace brisk;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kBatch = 3, kSeq = 16, kSteps = 10;
constexpr uint64_t kSeed = 1234;

// Token batches from a fixed 64-bit LCG: reproducible and independent of any
// library RNG, and the dump carries them anyway.
std::vector<int32_t> tokens(uint64_t seed, int64_t n, int64_t vocab) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& t : out) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t = int32_t((s >> 33) % uint64_t(vocab));
  }
  return out;
}

core::Tensor i32_tensor(const std::vector<int32_t>& v, core::Shape shape) {
  core::Tensor t = core::Tensor::empty(shape, core::DType::i32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

// "cpu", or "cuda": the same dump computed on the GPU (weights, gradients and
// optimizer state in GPU memory), checked against the same PyTorch numbers.
std::unique_ptr<core::Backend> make_backend(const std::string& device) {
  if (device == "cpu") return std::make_unique<cpu::CpuBackend>(2);
  std::string why;
  auto b = core::load_cuda_backend(&why);
  if (!b) throw core::Error("--device cuda: the CUDA backend is unavailable: " + why);
  std::printf("brisk_gpt_dump: on %s\n", b->description().c_str());
  return b;
}

int run(const std::string& out_dir, const std::string& device, float dropout, float attention_dropout,
        const std::string& attention) {
  models::GptConfig cfg{97, 2, 48, 4, 32};
  cfg.dropout = dropout;
  cfg.attention_dropout = attention_dropout;
  cfg.attention = attention;
  auto key = [](int64_t step) { return models::dropout_key(kSeed, step, 0, 0); };
  std::unique_ptr<core::Backend> backend_owner = make_backend(device);
  core::Backend& backend = *backend_owner;
  models::Gpt model(cfg, backend);
  model.init_weights(kSeed);
  fs::create_directories(out_dir);

  // Initial weights through the real checkpoint writer (HF layout).
  train::TrainState st;
  st.seed = kSeed;
  st.tokenizer = "bytes";
  train::save_checkpoint((fs::path(out_dir) / "ckpt").string(), model, nullptr, st, 0);

  // Batches: x random tokens, y random targets (the check is about numbers,
  // not learnability).
  std::vector<std::vector<int32_t>> xs, ys;
  for (int64_t k = 0; k < kSteps; ++k) {
    xs.push_back(tokens(1000 + 2 * uint64_t(k), kBatch * kSeq, cfg.vocab_size));
    ys.push_back(tokens(1001 + 2 * uint64_t(k), kBatch * kSeq, cfg.vocab_size));
  }

  // Logits and one micro-step's loss and gradients at the initial weights.
  const float* lg = model.logits(xs[0].data(), kBatch, kSeq);
  core::Tensor logits = core::Tensor::empty({kBatch * kSeq, cfg.vocab_size}, core::DType::f32);
  std::copy(lg, lg + logits.numel(), logits.data_as<float>());
  model.params().zero_grads();
  const double loss0 = model.train_micro_step(xs[0].data(), ys[0].data(), kBatch, kSeq, 1.0, key(0));

  std::vector<core::Tensor> keep_alive = {i32_tensor(xs[0], {kBatch, kSeq}), i32_tensor(ys[0], {kBatch * kSeq}), logits};
  std::vector<core::NamedTensor> tensors = {
      {"x", keep_alive[0].as_view()}, {"y", keep_alive[1].as_view()}, {"logits", logits.as_view()}};
  for (const auto& [name, e] : model.params().entries()) {
    keep_alive.push_back(model.params().download(e.grad).clone());  // the loop below reuses the grads
    tensors.push_back({"grad." + name, keep_alive.back().as_view()});
  }
  core::save_safetensors((fs::path(out_dir) / "tensors.safetensors").string(), tensors);

  std::vector<core::Tensor> step_data;
  std::vector<core::NamedTensor> step_tensors;
  for (int64_t k = 0; k < kSteps; ++k) {
    step_data.push_back(i32_tensor(xs[size_t(k)], {kBatch, kSeq}));
    step_data.push_back(i32_tensor(ys[size_t(k)], {kBatch * kSeq}));
  }
  for (int64_t k = 0; k < kSteps; ++k) {
    step_tensors.push_back({"x." + std::to_string(k), step_data[size_t(2 * k)].as_view()});
    step_tensors.push_back({"y." + std::to_string(k), step_data[size_t(2 * k + 1)].as_view()});
  }
  core::save_safetensors((fs::path(out_dir) / "steps.safetensors").string(), step_tensors);

  // Ten AdamW steps at the docs/workloads.md settings, a constant lr.
  optim::AdamWConfig ocfg;  // lr 6e-4, betas (0.9, 0.95), eps 1e-8, wd 0.1, clip 1.0
  optim::AdamW adamw(ocfg, model.params(), backend);
  nlohmann::json steps = nlohmann::json::array();
  for (int64_t k = 0; k < kSteps; ++k) {
    model.params().zero_grads();
    const double loss = model.train_micro_step(xs[size_t(k)].data(), ys[size_t(k)].data(), kBatch, kSeq, 1.0, key(k));
    const optim::StepStats s = adamw.step(ocfg.lr);
    steps.push_back({{"loss", loss}, {"grad_norm", s.grad_norm}, {"clip_scale", s.clip_scale}, {"lr", ocfg.lr},
                     {"dropout_key", {uint32_t(key(k)), uint32_t(key(k) >> 32)}}});
  }

  // The weights after the 10 steps, brisk layout.
  std::vector<core::NamedTensor> final_weights;
  std::vector<core::Tensor> final_host;
  final_host.reserve(model.params().entries().size());
  for (const auto& [name, e] : model.params().entries()) {
    final_host.push_back(model.params().download(e.value));
    final_weights.push_back({name, final_host.back().as_view()});
  }
  core::save_safetensors((fs::path(out_dir) / "final.safetensors").string(), final_weights);

  nlohmann::json res = {
      {"config", {{"vocab_size", cfg.vocab_size}, {"n_layer", cfg.n_layer}, {"n_embd", cfg.n_embd},
                  {"n_head", cfg.n_head}, {"block_size", cfg.block_size}}},
      {"batch", kBatch},
      {"seq", kSeq},
      {"seed", kSeed},
      {"checkpoint", "ckpt/step_0000000"},
      {"loss", loss0},
      {"dropout", cfg.dropout},
      {"attention_dropout", cfg.attention_dropout},
      {"attention", cfg.attention},
      {"adamw", {{"lr", ocfg.lr}, {"beta1", ocfg.beta1}, {"beta2", ocfg.beta2}, {"eps", ocfg.eps},
                 {"weight_decay", ocfg.weight_decay}, {"grad_clip", ocfg.grad_clip},
                 {"decay", "every parameter of rank >= 2 (Linear weights, wte, wpe)"}}},
      {"steps", steps}};
  std::ofstream((fs::path(out_dir) / "results.json").string()) << res.dump(2) << "\n";
  std::printf("brisk_gpt_dump: wrote %s (loss %.6f, %lld steps)\n", out_dir.c_str(), loss0, (long long)kSteps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string device = argc >= 3 ? argv[2] : "cpu";
  if (argc < 2 || argc > 6 || (device != "cpu" && device != "cuda")) {
    std::fprintf(stderr, "usage: %s OUT_DIR [cpu|cuda] [DROPOUT [ATTENTION_DROPOUT [plain|flash]]]\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1], device, argc >= 4 ? std::stof(argv[3]) : 0.f, argc >= 5 ? std::stof(argv[4]) : 0.f,
               argc == 6 ? argv[5] : "plain");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "brisk_gpt_dump: %s\n", e.what());
    return 1;
  }
}

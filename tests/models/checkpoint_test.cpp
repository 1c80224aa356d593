// Checkpoints: save then load into a fresh model gives the same weights bit
// for bit and the same logits; the file really is in HF GPT-2 layout (Conv1D
// weights (in, out)); AdamW moments and the step count survive; a checkpoint
// of another model size and a truncated model.safetensors are rejected with
// errors that name the sizes and the file. (PyTorch reading the same files is
// checked by gpt_torch_check.py.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/checkpoint.h"

using namespace brisk;
namespace fs = std::filesystem;

namespace {

cpu::CpuBackend& backend() {
  static cpu::CpuBackend b(2);
  return b;
}

// Odd sizes on purpose: a transpose bug cannot hide behind square matrices.
const models::GptConfig kConfig{61, 2, 24, 3, 20};
constexpr int64_t kB = 2, kT = 7;

// A fresh directory per test, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() /
           ("brisk_ckpt_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// What a directory holds, by name, sorted.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int32_t> ids(int64_t n, int64_t vocab, int32_t mul) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * mul + 5) % vocab);
  return v;
}

std::vector<float> logits_of(models::Gpt& m, const std::vector<int32_t>& x) {
  const float* p = m.logits(x.data(), kB, kT);
  return std::vector<float>(p, p + kB * kT * m.config().vocab_size);
}

void expect_same_weights(const models::Gpt& a, const models::Gpt& b) {
  ASSERT_EQ(a.params().entries().size(), b.params().entries().size());
  for (const auto& [name, e] : a.params().entries()) {
    const auto& f = b.params().at(name);
    ASSERT_TRUE(e.value.meta() == f.value.meta()) << name;
    EXPECT_EQ(std::memcmp(e.value.data(), f.value.data(), e.value.bytes()), 0) << name << " differs after the round trip";
  }
}

TEST(Checkpoint, RoundTripGivesIdenticalWeightsAndLogits) {
  TempDir dir;
  models::Gpt a(kConfig, backend());
  a.init_weights(7);
  train::TrainState st;
  st.step = 3;
  st.tokenizer = "bytes";
  const std::string ckpt = train::save_checkpoint(dir.path.string(), a, nullptr, st, 2);
  EXPECT_EQ(train::latest_checkpoint(dir.path.string()), ckpt);

  models::Gpt b(kConfig, backend());
  b.init_weights(8);  // different weights, so the load must overwrite them all
  train::load_checkpoint(ckpt, b, nullptr);
  expect_same_weights(a, b);

  const auto x = ids(kB * kT, kConfig.vocab_size, 13);
  const auto la = logits_of(a, x), lb = logits_of(b, x);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "logits differ after the round trip";
}

TEST(Checkpoint, FileUsesHuggingFaceConv1dLayout) {
  TempDir dir;
  models::Gpt a(kConfig, backend());
  a.init_weights(7);
  const std::string ckpt = train::save_checkpoint(dir.path.string(), a, nullptr, {}, 1);
  auto file = core::load_safetensors((fs::path(ckpt) / "model.safetensors").string());
  const int64_t C = kConfig.n_embd;
  // brisk holds c_attn (3C, C) like nn.Linear; HF's Conv1D holds (C, 3C).
  const core::Tensor& w = file.tensors.at("h.1.attn.c_attn.weight");
  ASSERT_EQ(w.shape(), (core::Shape{C, 3 * C}));
  const core::Tensor& mine = a.params().at("h.1.attn.c_attn.weight").value;
  for (int64_t o = 0; o < 3 * C; o += 5)
    for (int64_t i = 0; i < C; i += 3)
      ASSERT_EQ(w.data_as<float>()[i * 3 * C + o], mine.data_as<float>()[o * C + i]) << "(" << o << ", " << i << ")";
  EXPECT_EQ(file.tensors.at("h.0.mlp.c_fc.weight").shape(), (core::Shape{C, 4 * C}));
  EXPECT_EQ(file.tensors.at("h.0.mlp.c_proj.weight").shape(), (core::Shape{4 * C, C}));
  EXPECT_EQ(file.tensors.at("wte.weight").shape(), (core::Shape{kConfig.vocab_size, C}));  // not transposed
  EXPECT_EQ(file.metadata.at("format"), "pt");
}

TEST(Checkpoint, OptimizerMomentsAndStepSurvive) {
  TempDir dir;
  models::Gpt a(kConfig, backend());
  a.init_weights(7);
  optim::AdamW oa({}, a.params(), backend());
  const auto x = ids(kB * kT, kConfig.vocab_size, 13), y = ids(kB * kT, kConfig.vocab_size, 29);
  for (int s = 0; s < 2; ++s) {
    a.params().zero_grads();
    a.train_micro_step(x.data(), y.data(), kB, kT);
    oa.step(6e-4f);
  }
  train::TrainState st;
  st.step = 2;
  const std::string ckpt = train::save_checkpoint(dir.path.string(), a, &oa, st, 1);

  models::Gpt b(kConfig, backend());
  optim::AdamW ob({}, b.params(), backend());
  train::load_checkpoint(ckpt, b, &ob);
  expect_same_weights(a, b);
  EXPECT_EQ(ob.steps_taken(), 2);
  for (const auto& [name, e] : a.params().entries())
    for (size_t k = 0; k < 2; ++k)
      EXPECT_EQ(std::memcmp(e.state[k].data(), b.params().at(name).state[k].data(), e.state[k].bytes()), 0)
          << name << (k == 0 ? " exp_avg" : " exp_avg_sq");
}

// Built with AddressSanitizer (gcc says so with a macro, clang with a feature test)?
#if defined(__SANITIZE_ADDRESS__)
#define BRISK_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BRISK_TEST_ASAN 1
#endif
#endif
#ifndef BRISK_TEST_ASAN
#define BRISK_TEST_ASAN 0
#endif

// VmHWM and VmRSS of this process, in bytes.
std::pair<size_t, size_t> peak_and_current_rss() {
  std::ifstream f("/proc/self/status");
  size_t hwm = 0, rss = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmHWM:", 0) == 0) hwm = std::stoull(line.substr(6)) * 1024;
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoull(line.substr(6)) * 1024;
  }
  return {hwm, rss};
}

// Loading reads each tensor straight into a buffer of its own, uploads it
// and drops it: beside the model and its moments the loader holds about one
// tensor at a time. It used to read each file whole into a string, copy
// that, then copy every tensor out (a resume's peak was the moments file
// three times over: 553 MiB against a fresh run's 348 for W1).
TEST(Checkpoint, LoadingHoldsOneTensorAtATimeBesideTheModel) {
#if BRISK_TEST_ASAN
  GTEST_SKIP() << "under AddressSanitizer freed memory stays in its quarantine, so RSS says nothing about the loader "
                  "(the release build runs this test)";
#endif
  TempDir dir;
  const models::GptConfig wide{8192, 2, 256, 4, 32};  // wte 8 MiB of 14 MiB of weights; moments 28 MiB
  models::Gpt a(wide, backend());
  a.init_weights(7);
  optim::AdamW oa({}, a.params(), backend());
  const std::string ckpt = train::save_checkpoint(dir.path.string(), a, &oa, {}, 1);
  models::Gpt b(wide, backend());
  optim::AdamW ob({}, b.params(), backend());
  size_t weights = 0;
  for (auto& [name, e] : b.params().entries()) {
    weights += e.value.bytes();
    // Every page of the weights and moments written first (fresh zero
    // pages are not resident): only the loader's own memory is new.
    std::memset(e.value.data(), 1, e.value.bytes());
    for (core::Tensor& m : e.state) std::memset(m.data(), 1, m.bytes());
  }
  // The peak from here on: writing 5 to clear_refs resets VmHWM to VmRSS.
  std::ofstream("/proc/self/clear_refs") << "5";
  const auto [reset_peak, before] = peak_and_current_rss();
  ASSERT_LE(reset_peak, before + (1u << 20)) << "VmHWM was not reset";
  train::load_checkpoint(ckpt, b, &ob);
  const size_t growth = peak_and_current_rss().first - before;
  std::printf("loading %.1f MiB of weights and %.1f MiB of moments: peak RSS grew %.1f MiB\n", weights / 1048576.0,
              2 * weights / 1048576.0, growth / 1048576.0);
  // Read whole, the moments file alone (2x the weights) took three times its
  // size: 84 MiB here. Read a tensor at a time, what is left is malloc's
  // reuse of freed tensors of other sizes (about 20 MiB here, the largest
  // tensor 8 MiB).
  EXPECT_LT(growth, 2 * weights);
  expect_same_weights(a, b);
}

// A resumed run that stops at the step it resumed from saves that step again:
// the new checkpoint replaces the old one whole and nothing is left beside
// it. (That no moment exists without a complete checkpoint of the step is by
// construction, an atomic exchange of the two directories; a test would have
// to crash between two system calls to see it.)
TEST(Checkpoint, SavingAStepAgainReplacesItWhole) {
  TempDir dir;
  train::TrainState st;
  st.step = 3;
  models::Gpt first(kConfig, backend());
  first.init_weights(7);
  train::save_checkpoint(dir.path.string(), first, nullptr, st, 2);
  models::Gpt second(kConfig, backend());
  second.init_weights(8);
  const std::string ckpt = train::save_checkpoint(dir.path.string(), second, nullptr, st, 2);

  models::Gpt loaded(kConfig, backend());
  train::load_checkpoint(ckpt, loaded, nullptr);
  expect_same_weights(second, loaded);
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"step_0000003"}) << "a temporary or old directory was left behind";
}

// Names are padded to 7 digits: past step 9,999,999 the newest is found by
// step number (string order picked step_9999999 over step_10000000, and
// keep = 1 deleted each new checkpoint as it was written).
TEST(Checkpoint, NewestAndPruningGoByStepNumberPastSevenDigits) {
  TempDir dir;
  models::Gpt m(kConfig, backend());
  m.init_weights(7);
  train::TrainState st;
  for (int64_t step : {int64_t(9999999), int64_t(10000000)}) {
    st.step = step;
    train::save_checkpoint(dir.path.string(), m, nullptr, st, 2);
  }
  EXPECT_EQ(fs::path(train::latest_checkpoint(dir.path.string())).filename(), "step_10000000");
  st.step = 10000001;
  const std::string newest = train::save_checkpoint(dir.path.string(), m, nullptr, st, 1);
  EXPECT_TRUE(fs::exists(newest));
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"step_10000001"});
}

// A writer killed part-way leaves a .tmp_step_* it was writing (a stop
// checkpoint of a step never saved again) or a .del_step_* it was
// removing; the next checkpoint write sweeps both.
TEST(Checkpoint, LeftoversOfAKilledWriterAreSwept) {
  TempDir dir;
  models::Gpt m(kConfig, backend());
  m.init_weights(7);
  for (const char* stale : {".tmp_step_0000014", ".del_step_0000001"}) {
    fs::create_directories(dir.path / stale);
    std::ofstream(dir.path / stale / "model.safetensors") << "partial";
  }
  train::TrainState st;
  st.step = 20;
  train::save_checkpoint(dir.path.string(), m, nullptr, st, 2);
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"step_0000020"});
}

TEST(Checkpoint, AnotherModelSizeIsRejectedNamingBothSizes) {
  TempDir dir;
  models::Gpt a(kConfig, backend());
  a.init_weights(7);
  const std::string ckpt = train::save_checkpoint(dir.path.string(), a, nullptr, {}, 1);

  models::GptConfig other = kConfig;
  other.n_embd = 36;
  models::Gpt b(other, backend());
  try {
    train::load_checkpoint(ckpt, b, nullptr);
    FAIL() << "loading a checkpoint of another size did not throw";
  } catch (const core::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("n_embd 24"), std::string::npos) << msg;
    EXPECT_NE(msg.find("n_embd 36"), std::string::npos) << msg;
    EXPECT_NE(msg.find(ckpt), std::string::npos) << msg;
  }
}

TEST(Checkpoint, TruncatedWeightsFileIsAnIoErrorNamingTheFile) {
  TempDir dir;
  models::Gpt a(kConfig, backend());
  a.init_weights(7);
  const std::string ckpt = train::save_checkpoint(dir.path.string(), a, nullptr, {}, 1);
  const fs::path weights = fs::path(ckpt) / "model.safetensors";
  const auto full = fs::file_size(weights);
  // Cut inside the tensor data, then inside the 8-byte header length.
  for (const uintmax_t size : {full - 100, uintmax_t(5)}) {
    fs::resize_file(weights, size);
    models::Gpt b(kConfig, backend());
    try {
      train::load_checkpoint(ckpt, b, nullptr);
      FAIL() << "a model.safetensors truncated to " << size << " bytes loaded";
    } catch (const core::IoError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(weights.string()), std::string::npos) << msg;
      EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    }
  }
}

// The streaming writer: a file whose tensors do not match its header, or
// that misses one, is never renamed into place, and the file already there
// is untouched; a complete one reads back byte for byte.
TEST(SafetensorsWriter, OnlyACompleteMatchingFileReplacesThePreviousOne) {
  TempDir dir;
  const std::string path = (dir.path / "t.safetensors").string();
  core::Tensor a = core::Tensor::uniform({3, 5}, core::DType::f32, 1, -1.f, 1.f);
  core::Tensor b = core::Tensor::uniform({7}, core::DType::f32, 2, -1.f, 1.f);
  core::save_safetensors(path, {{"a", a.as_view()}, {"b", b.as_view()}}, {{"k", "v"}});
  const std::string before = core::read_file(path);
  const std::vector<core::SafetensorsWriter::Entry> entries = {{"b", b.meta()}, {"a", a.meta()}};
  {
    core::SafetensorsWriter w(path, entries);
    EXPECT_THROW(w.write(a.as_view()), core::Error) << "a (3, 5) tensor where the header says (7)";
    w.write(b.as_view());
    EXPECT_THROW(w.commit(), core::Error) << "'a' was never written";
  }
  {
    core::SafetensorsWriter w(path, entries);
    w.write(b.as_view());
  }  // destroyed without commit
  EXPECT_EQ(core::read_file(path), before);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  core::SafetensorsWriter w(path, entries);
  w.write(b.as_view());
  w.write(a.as_view());
  w.commit();
  const core::SafetensorsFile f = core::load_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(std::memcmp(f.tensors.at("a").data(), a.data(), a.bytes()), 0);
  EXPECT_EQ(std::memcmp(f.tensors.at("b").data(), b.data(), b.bytes()), 0);
}

// Filled out of order in parts (as ZeRO-1 checkpoints are, from the slabs
// of every rank): the same bytes as writing each tensor whole; a part
// outside its tensor or over bytes already written, a tensor short of a
// part, or mixing the two ways is refused, and no file appears.
TEST(SafetensorsWriter, PartsInAnyOrderMakeTheSameFile) {
  TempDir dir;
  const std::string whole = (dir.path / "whole.safetensors").string(), parts = (dir.path / "parts.safetensors").string();
  core::Tensor a = core::Tensor::uniform({3, 5}, core::DType::f32, 1, -1.f, 1.f);
  core::Tensor b = core::Tensor::uniform({7}, core::DType::f32, 2, -1.f, 1.f);
  const std::vector<core::SafetensorsWriter::Entry> entries = {{"b", b.meta()}, {"a", a.meta()}};
  core::SafetensorsWriter w(whole, entries);
  w.write(b.as_view());
  w.write(a.as_view());
  w.commit();

  const auto* fa = static_cast<const char*>(a.data());
  const auto* fb = static_cast<const char*>(b.data());
  {
    core::SafetensorsWriter p(parts, entries);
    EXPECT_THROW(p.write_part(1, 56, fa, 8), core::Error) << "bytes 56..64 of a 60-byte tensor";
    EXPECT_THROW(p.write_part(2, 0, fa, 4), core::Error) << "no third tensor";
    p.write_part(1, 40, fa + 40, 20);
    EXPECT_THROW(p.write_part(1, 30, fa + 30, 20), core::Error) << "bytes 40..50 were written";
    EXPECT_THROW(p.write_part(1, 44, fa + 44, 4), core::Error) << "inside a written part";
    EXPECT_THROW(p.write(b.as_view()), core::Error) << "write() after write_part()";
    p.write_part(0, 0, fb, 28);
    EXPECT_THROW(p.commit(), core::Error) << "bytes 0..40 of 'a' are missing";
  }
  EXPECT_FALSE(fs::exists(parts));
  core::SafetensorsWriter p(parts, entries);
  p.write_part(1, 40, fa + 40, 20);
  p.write_part(0, 12, fb + 12, 16);
  p.write_part(1, 0, fa, 40);
  p.write_part(0, 0, fb, 12);
  p.commit();
  EXPECT_EQ(core::read_file(parts), core::read_file(whole));
}

}  // namespace

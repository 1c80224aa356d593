// Memory-budget tuning (brisk/train/tune.h): size strings, the binary search,
// the planned peak growing with the micro-batch, and the search's promises:
// the choice fits the budget, keeps batch x grad_accum, prefers the cheapest
// recompute level when memory allows, and a budget below every setting is an
// error that names the minimum. A tiny GPT keeps each plan to milliseconds.
#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "brisk/core/error.h"
#include "brisk/core/planner.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/encoder.h"
#include "brisk/models/gpt.h"
#include "brisk/monitor/run_summary.h"
#include "brisk/train/config.h"
#include "brisk/train/tune.h"

using namespace brisk;
using train::parse_byte_size;

namespace {

train::TrainConfig tiny_config(int64_t batch, int64_t accum) {
  train::TrainConfig c;
  c.model.vocab_size = 256;
  c.model.n_layer = 2;
  c.model.n_embd = 32;
  c.model.n_head = 2;
  c.model.block_size = 32;
  c.seq = 32;
  c.batch = batch;
  c.grad_accum = accum;
  c.threads = 1;
  c.data_dir = "/nonexistent/brisk-tune-test";  // no shards: their share is 0
  return c;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const core::ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

}  // namespace

TEST(ParseByteSize, Units) {
  EXPECT_EQ(parse_byte_size("4GiB", "k"), uint64_t(4) << 30);
  EXPECT_EQ(parse_byte_size("512MiB", "k"), uint64_t(512) << 20);
  EXPECT_EQ(parse_byte_size("1.5GB", "k"), uint64_t(1500000000));
  EXPECT_EQ(parse_byte_size("300MB", "k"), uint64_t(300000000));
  EXPECT_EQ(parse_byte_size("64KiB", "k"), uint64_t(65536));
  EXPECT_EQ(parse_byte_size("2kB", "k"), uint64_t(2000));
  EXPECT_EQ(parse_byte_size("123456", "k"), uint64_t(123456));
  EXPECT_EQ(parse_byte_size("123456B", "k"), uint64_t(123456));
  EXPECT_EQ(parse_byte_size("2 GiB", "k"), uint64_t(2) << 30);
  EXPECT_EQ(parse_byte_size("4g", "k"), uint64_t(4) << 30);  // bare letters are binary
  EXPECT_EQ(parse_byte_size("0.5gib", "k"), uint64_t(512) << 20);
}

TEST(ParseByteSize, BadStringsNameTheKey) {
  for (const char* bad : {"", "GiB", "4 gigs", "4XB", "-1GiB", "1.5", "0", "4GiB extra", "1..5GB", "4GiBB"}) {
    const std::string msg = message_of([&] { parse_byte_size(bad, "train.memory_budget"); });
    EXPECT_NE(msg.find("train.memory_budget"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("4GiB"), std::string::npos) << "the message shows an example: " << msg;
  }
}

TEST(LargestFitting, BinarySearch) {
  for (int64_t limit : {0, 1, 2, 7, 8, 9, 1000}) {
    int calls = 0;
    const int64_t got = train::largest_fitting(64, [&](int64_t b) {
      ++calls;
      return b <= limit;
    });
    EXPECT_EQ(got, std::min<int64_t>(limit, 64)) << limit;
    EXPECT_LE(calls, 8) << "a binary search over 64 needs at most 1 + log2(64) + 1 probes";
  }
  EXPECT_EQ(train::largest_fitting(0, [](int64_t) { return true; }), 0);
}

TEST(TuneEstimate, MonotoneInTheMicroBatch) {
  cpu::CpuBackend backend(1);
  for (const char* level : {"none", "selective", "full"}) {
    for (const bool fused : {false, true}) {
      train::TrainConfig c = tiny_config(1, 1);
      c.model.recompute = level;
      c.model.fused_classifier = fused;
      uint64_t last = 0;
      for (int64_t b = 1; b <= 16; ++b) {
        c.batch = b;
        const train::RunMemoryEstimate m = train::estimate_run_memory(c, backend);
        EXPECT_GE(m.total(), last) << level << " fused " << fused << " batch " << b;
        EXPECT_GT(m.train.arena, 0u);
        EXPECT_GT(m.eval_arena, 0u) << "eval_every > 0: the eval program's arena is part of the run";
        EXPECT_EQ(m.train.optimizer_state, 2 * m.train.params) << "AdamW: two fp32 moments per fp32 weight";
        EXPECT_EQ(m.baseline, train::kProcessBaselineBytes);
        last = m.total();
      }
    }
  }
}

TEST(TuneEstimate, NoEvalNoEvalArena) {
  cpu::CpuBackend backend(1);
  train::TrainConfig c = tiny_config(4, 1);
  c.eval_every = 0;
  EXPECT_EQ(train::estimate_run_memory(c, backend).eval_arena, 0u);
}

// With the fused classifier the eval program runs its head in row chunks
// (models::Gpt::eval_chunk_rows): the tuner plans that program, so the eval
// arena it counts falls below the (B*T, V) logits that the unfused one holds.
TEST(TuneEstimate, FusedClassifierPlansTheChunkedEvalArena) {
  cpu::CpuBackend backend(1);
  train::TrainConfig c = tiny_config(4, 1);
  c.model.vocab_size = 65536;
  c.model.n_embd = 16;
  const double logits = double(c.batch * c.seq) * double(c.model.vocab_size) * 4.0;
  c.model.fused_classifier = false;
  const train::RunMemoryEstimate plain = train::estimate_run_memory(c, backend);
  c.model.fused_classifier = true;
  const train::RunMemoryEstimate fused = train::estimate_run_memory(c, backend);
  EXPECT_GE(double(plain.eval_arena), logits);
  EXPECT_LT(double(fused.eval_arena), 0.6 * logits);
  EXPECT_LT(fused.total(), plain.total());
}

TEST(Tune, GenerousBudgetKeepsTheCheapestSetting) {
  cpu::CpuBackend backend(1);
  const train::TrainConfig c = tiny_config(8, 1);
  const train::TuneResult r = train::tune_for_budget(c, uint64_t(64) << 30, backend);
  EXPECT_EQ(r.chosen.batch, 8);
  EXPECT_EQ(r.chosen.grad_accum, 1);
  EXPECT_EQ(r.chosen.model.recompute, "none");
  EXPECT_EQ(r.chosen.model.fused_classifier, c.model.fused_classifier) << "ties keep the config's own classifier";
  EXPECT_EQ(r.candidates.size(), 6u);
  EXPECT_DOUBLE_EQ(r.candidates.front().relative_throughput, 1.0);
  EXPECT_NE(r.summary.find("fits"), std::string::npos) << r.summary;
}

TEST(Tune, RespectsTheBudgetAndKeepsTokensPerStep) {
  cpu::CpuBackend backend(1);
  for (const auto& [batch, accum] : std::vector<std::pair<int64_t, int64_t>>{{12, 1}, {4, 3}, {16, 1}, {8, 2}}) {
    const train::TrainConfig c = tiny_config(batch, accum);
    const int64_t G = batch * accum;
    const uint64_t full = train::estimate_run_memory(c, backend).total();
    train::TrainConfig one = c;
    one.batch = 1;
    one.model.recompute = "full";
    one.model.fused_classifier = true;
    const uint64_t smallest = train::estimate_run_memory(one, backend).total();
    for (double f : {1.0, 0.9, 0.8, 0.7, 0.6}) {
      const uint64_t budget = std::max(smallest, uint64_t(double(full) * f));
      const train::TuneResult r = train::tune_for_budget(c, budget, backend);
      const train::TuneCandidate& best = r.candidates.front();
      ASSERT_TRUE(best.fits());
      EXPECT_LE(best.memory.total(), budget) << "budget " << budget;
      EXPECT_EQ(r.chosen.batch * r.chosen.grad_accum, G) << "tokens per optimizer step are kept";
      EXPECT_EQ(G % r.chosen.batch, 0);
      EXPECT_EQ(r.chosen.memory_budget, "");
      // Evaluation at the smaller micro-batch scores at least the config's windows.
      EXPECT_GE(r.chosen.batch * r.chosen.eval_batches, c.batch * c.eval_batches);
      EXPECT_LT((r.chosen.eval_batches - 1) * r.chosen.batch, c.batch * c.eval_batches);
      EXPECT_EQ(train::estimate_run_memory(r.chosen, backend).total(), best.memory.total())
          << "the chosen config plans to what the search reported";
      // Every fitting candidate is at its largest fitting divisor: one more
      // step up would not fit (or is not a divisor at all).
      for (const train::TuneCandidate& cand : r.candidates) {
        if (!cand.fits()) continue;
        EXPECT_LE(cand.memory.total(), budget);
        for (int64_t b = cand.batch + 1; b <= G; ++b) {
          if (G % b) continue;
          train::TrainConfig t = c;
          t.batch = b;
          t.model.recompute = cand.recompute;
          t.model.fused_classifier = cand.fused_classifier;
          EXPECT_GT(train::estimate_run_memory(t, backend).total(), budget)
              << cand.recompute << " fused " << cand.fused_classifier << " could have run batch " << b;
          break;
        }
      }
      // Fitting candidates come first, best (fewest FLOPs per token) first.
      bool seen_unfit = false;
      double last_fpt = 0;
      for (const train::TuneCandidate& cand : r.candidates) {
        if (!cand.fits()) {
          seen_unfit = true;
          continue;
        }
        EXPECT_FALSE(seen_unfit) << "a fitting candidate after one that does not fit";
        EXPECT_GE(cand.flops_per_token, last_fpt * (1 - 1e-9));
        last_fpt = cand.flops_per_token;
      }
    }
  }
}

TEST(Tune, TighterBudgetsNeverCostLessCompute) {
  // FLOPs per token do not depend on the micro-batch, and a tighter budget
  // only removes choices: the chosen setting can only get dearer per token.
  cpu::CpuBackend backend(1);
  train::TrainConfig c = tiny_config(16, 1);
  const uint64_t full = train::estimate_run_memory(c, backend).total();
  c.batch = 1;
  c.grad_accum = 16;
  c.model.recompute = "full";
  const uint64_t least = train::estimate_run_memory(c, backend).total();
  c = tiny_config(16, 1);
  double last = 0;
  std::set<std::string> choices;
  for (double f = 1.0; f >= 0; f -= 0.05) {  // from the config as given down to the smallest run
    const uint64_t budget = least + uint64_t(double(full - least) * f);
    const train::TuneResult r = train::tune_for_budget(c, budget, backend);
    EXPECT_GE(r.candidates.front().flops_per_token, last * (1 - 1e-9)) << f;
    EXPECT_LE(r.candidates.front().memory.total(), budget);
    last = r.candidates.front().flops_per_token;
    choices.insert(r.chosen.model.recompute + " x" + std::to_string(r.chosen.batch));
  }
  EXPECT_EQ(choices.count("none x16"), 1u) << "the config as given, at its own planned peak";
  EXPECT_GT(choices.size(), 2u) << "tighter budgets change the micro-batch or the recompute level";
}

TEST(Tune, BelowTheMinimumIsAnErrorNamingIt) {
  cpu::CpuBackend backend(1);
  const train::TrainConfig c = tiny_config(8, 1);
  const std::string msg = message_of([&] { train::tune_for_budget(c, uint64_t(1) << 20, backend); });
  EXPECT_NE(msg.find("below the smallest planned run"), std::string::npos) << msg;
  EXPECT_NE(msg.find("micro-batch 1 x grad_accum 8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MiB"), std::string::npos) << msg;
}

TEST(Tune, ApplyMemoryBudget) {
  cpu::CpuBackend backend(1);
  train::TrainConfig c = tiny_config(8, 1);
  std::string report;
  EXPECT_EQ(train::to_toml(train::apply_memory_budget(c, backend, &report)), train::to_toml(c)) << "no budget: as is";
  EXPECT_EQ(report, "");
  c.memory_budget = "64GiB";
  const train::TrainConfig t = train::apply_memory_budget(c, backend, &report);
  EXPECT_EQ(t.memory_budget, "");
  EXPECT_EQ(t.batch, 8);
  EXPECT_NE(report.find("train.memory_budget: memory budget 64.00 GiB"), std::string::npos) << report;
  // A GPU run's budget is GPU memory, planned here on the host.
  c.device = "cuda";
  const train::TrainConfig g = train::apply_memory_budget(c, backend, &report);
  EXPECT_EQ(g.batch, 8);
  EXPECT_NE(report.find("planned GPU memory"), std::string::npos) << report;
}

// train.device = "cuda": the estimate is GPU memory, as the GPU runs it
// (its bf16 graph and classifier chunks, `brisk plan`'s figures) plus the
// CUDA process's fixed share; the host's parts (loader, shards, checkpoint
// staging, the process baseline) are not in it.
TEST(TuneEstimate, GpuPlansDeviceMemoryOnly) {
  cpu::CpuBackend backend(1);
  train::TrainConfig c = tiny_config(4, 1);
  c.precision = train::Precision::bf16;
  c.model.fused_classifier = true;
  const train::RunMemoryEstimate host = train::estimate_run_memory(c, backend);
  EXPECT_FALSE(host.gpu);
  EXPECT_GT(host.loader, 0u);
  c.device = "cuda";
  const train::RunMemoryEstimate gpu = train::estimate_run_memory(c, backend);
  EXPECT_TRUE(gpu.gpu);
  EXPECT_EQ(gpu.loader + gpu.data + gpu.checkpoint, 0u);
  EXPECT_EQ(gpu.baseline, train::kCudaProcessBytes);
  models::GptConfig mc = c.model;
  mc.compute = core::DType::bf16;  // the GPU's bf16 is native: no fp32 fallback as on this CPU
  mc.classifier_chunk_floats = models::kDeviceClassifierChunkFloats;
  models::Gpt model(mc, backend);
  const core::MemoryReport want = core::plan_memory(model.train_graph(c.batch, c.seq)).report;
  EXPECT_EQ(gpu.train.arena, want.arena);
  EXPECT_EQ(gpu.train.params, want.params);
  EXPECT_EQ(gpu.total(), want.total() + gpu.train.optimizer_state + gpu.eval_arena + train::kCudaProcessBytes);
  // The search over GPU plans: at a budget of micro-batch 2's plan, the
  // choice fits it and says it is GPU memory.
  c.batch = 1;
  c.grad_accum = 4;
  const uint64_t at2 = [&] {
    train::TrainConfig t = c;
    t.batch = 2;
    return train::estimate_run_memory(t, backend).total();
  }();
  const train::TuneResult r = train::search_budget(c, at2, backend);
  ASSERT_TRUE(r.fits()) << r.summary;
  EXPECT_LE(r.candidates.front().memory.total(), at2);
  EXPECT_TRUE(r.candidates.front().memory.gpu);
  EXPECT_NE(r.summary.find("planned GPU memory"), std::string::npos) << r.summary;
}

// "auto": 90% of MemAvailable for a CPU run, said where it came from; a
// GPU run's "auto" needs its CUDA backend (an error on the host backend);
// sizes pass through; the config reader accepts "auto" and still refuses
// other words.
TEST(Tune, AutoBudget) {
  cpu::CpuBackend backend(1);
  train::TrainConfig c = tiny_config(8, 1);
  std::string how;
  const uint64_t b = train::resolve_memory_budget("auto", "train.memory_budget", c, backend, &how);
  const uint64_t available = monitor::available_ram_bytes();
  ASSERT_GT(available, 0u) << "this test reads /proc/meminfo";
  EXPECT_GT(b, available / 2);
  EXPECT_LE(b, available);
  EXPECT_NE(how.find("MemAvailable"), std::string::npos) << how;
  EXPECT_EQ(train::resolve_memory_budget("4GiB", "k", c, backend, nullptr), uint64_t(4) << 30);
  c.device = "cuda";
  EXPECT_NE(message_of([&] { train::resolve_memory_budget("auto", "--memory-budget", c, backend, nullptr); })
                .find("--memory-budget = \"auto\" reads the free memory of the GPU"),
            std::string::npos);
  EXPECT_EQ(train::load_train_config("", {"train.memory_budget=auto"}).memory_budget, "auto");
  EXPECT_NE(message_of([] { train::load_train_config("", {"train.memory_budget=automatic"}); })
                .find("'automatic' is not a memory size"),
            std::string::npos);
  c.device = "cpu";
  c.memory_budget = "auto";
  std::string report;
  const train::TrainConfig t = train::apply_memory_budget(c, backend, &report);
  EXPECT_EQ(t.memory_budget, "");
  EXPECT_NE(report.find("train.memory_budget: auto: "), std::string::npos) << report;
}

// The FLOP count brisk plan prints: the encoder-bodied models' masked
// attention counts as the GPT's causal one does (4 B T^2 C forward, 8 B T^2 C
// backward), beside 6 x rows x the block Linears' in x out and the head's.
TEST(GraphMatmulFlops, CountsMaskedAttention) {
  models::EncoderConfig c;
  c.vocab_size = 64, c.n_layer = 2, c.n_embd = 32, c.n_head = 2, c.max_len = 64, c.n_classes = 3;
  cpu::CpuBackend backend(1);
  for (const char* attention : {"flash", "plain"}) {
    c.attention = attention;
    models::Encoder m(c, backend);
    const int64_t B = 4, T = 64, C = 32, L = 2, K = 3;
    const double linears = 6.0 * double(B * T) * double(12 * C * C * L) + 6.0 * double(B) * double(C * K);
    const double attn = 12.0 * double(L) * double(B) * double(T * T) * double(C);
    EXPECT_DOUBLE_EQ(train::graph_matmul_flops(m.graph(true, B, T)), linears + attn) << attention;
  }
}

// The decoding benchmark (generate_bench.h).
//
// How it measures:
// - brisk runs in this process, each row on a fresh Engine; the peer runs as
//   a child process per round. Rows are interleaved: every round runs every
//   row once, and the table shows the median over rounds with the range.
// - Decode speed is (new tokens - 1) / the time after the first token, on
//   both sides: the first token comes out of the prefill pass and is timed
//   with it. Batch rows decode the same prompt `batch` times at once and
//   count every sequence's tokens.
// - Greedy rows, plus one sampled row per side at the batch size (temperature
//   0.8, top-p 0.95): what a chat client asks for, and where the sampler
//   itself is timed (each side draws from its own seeded generator).
// - Memory: the weights and the key/value pool brisk allocates, and the
//   peer's RSS growth over its own baseline (torch imported).
#include "brisk/bench/generate_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/data/shards.h"
#include "brisk/infer/engine.h"
#include "brisk/models/generate.h"
#include "brisk/monitor/machine.h"
#include "brisk/train/checkpoint.h"
#include "bench_util.h"

namespace brisk::bench {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Run {
  double prefill_ms = 0, decode_ms = 0;
  std::vector<int32_t> tokens;  // the first sequence's
};

// The sampled rows' settings.
constexpr float kSampleTemperature = 0.8f, kSampleTopP = 0.95f;

// One generation of `batch` copies of the prompt: greedy, or top-p sampling;
// the key/value pool in `kv` (f32 or bf16).
Run run_engine(const infer::Model& model, const std::vector<int32_t>& prompt, int64_t new_tokens, int64_t batch,
               int threads, bool sampled, core::DType kv) {
  infer::EngineOptions eo;
  eo.max_seqs = int(batch);
  eo.threads = threads;
  eo.kv_dtype = kv;
  eo.max_step_tokens = std::max<int64_t>(512, batch * int64_t(prompt.size()));
  infer::Engine engine(model, eo);
  infer::SamplingParams sp;
  sp.temperature = sampled ? kSampleTemperature : 0.f;
  sp.top_p = sampled ? kSampleTopP : 1.f;
  sp.seed = 1;
  sp.max_tokens = new_tokens;
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < batch; ++b) ids.push_back(engine.add(prompt, sp));
  Run r;
  const double t0 = now();
  double t1 = 0;
  bool first = true;
  while (!engine.idle()) {
    for (const infer::TokenEvent& e : engine.step())
      if (e.seq == ids[0]) r.tokens.push_back(e.choice.token);
    if (first) t1 = now(), first = false;
  }
  const double t2 = now();
  r.prefill_ms = (t1 - t0) * 1e3;
  r.decode_ms = (t2 - t1) * 1e3;
  return r;
}

struct Row {
  std::string name, engine, format;
  int64_t batch = 1;
  bool sampled = false;  // top-p sampling instead of greedy
  core::DType kv = core::DType::f32;  // brisk's key/value pool
  std::vector<double> prefill_ms, decode_tok_s;
  std::vector<int32_t> tokens;
  double memory_mib = 0;        // the weights' bytes, for either engine
  double rss_growth_mib = -1;   // the peer's peak RSS over its own baseline (its file reading included)
  std::string error;
};

std::string range(const std::vector<double>& v, const char* fmt) {
  if (v.empty()) return "-";
  char buf[128];
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  char m[32], a[32], b[32];
  std::snprintf(m, sizeof m, fmt, median(v));
  std::snprintf(a, sizeof a, fmt, *lo);
  std::snprintf(b, sizeof b, fmt, *hi);
  std::snprintf(buf, sizeof buf, "%s [%s-%s]", m, a, b);
  return buf;
}

// a[i] / b[i] for each round both have: ratios formed within a round.
std::vector<double> per_round_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) r.push_back(a[i] / b[i]);
  return r;
}

std::vector<int32_t> read_tokens(const std::string& dir, const char* split, int64_t begin, int64_t n) {
  data::TokenDataset d(dir, split);
  if (d.size() < begin + n) throw core::IoError(dir + ": the " + split + " split has only " + std::to_string(d.size()) + " tokens");
  std::vector<int32_t> out(static_cast<size_t>(n));
  d.read(begin, n, out.data());
  return out;
}

}  // namespace

int run_generate_bench(const GenerateBenchOptions& o) {
  if (o.workload != "I1") throw core::ConfigError("unknown inference workload '" + o.workload + "' (allowed: I1)");
  if (o.rounds < 1 || o.new_tokens < 2 || o.prompt_tokens < 1 || o.batch < 1)
    throw core::ConfigError("rounds, batch and prompt tokens must be >= 1 and new tokens >= 2");
  if (o.quality && o.quality_windows < 1)
    throw core::ConfigError("--quality-windows must be at least 1, got " + std::to_string(o.quality_windows));
  if (!o.json_path.empty()) core::check_output_file(o.json_path);  // before the rounds, not after them
  cpu::set_num_threads(o.threads);
  const fs::path root = repo_root();
  const std::string data_dir = o.data_dir.empty() ? (root / "data" / "kjv-gpt2").string() : o.data_dir;
  // A run directory is its newest checkpoint here too: the peer and the
  // recompute check read the step directory's files (the run's failed).
  std::string ckpt = o.checkpoint.empty() ? train::latest_checkpoint((root / "runs" / "w1").string())
                                          : train::require_checkpoint(o.checkpoint);
  std::string weights_note = "trained checkpoint " + ckpt;
  if (ckpt.empty()) {  // speed does not depend on what the weights learned
    const fs::path dir = root / "bench" / "results" / "i1_random_w1";
    cpu::CpuBackend be(o.threads);
    models::Gpt gpt(models::GptConfig::preset("W1"), be);
    gpt.init_weights(1337);
    train::TrainState st;
    st.tokenizer = "gpt2";
    ckpt = train::save_checkpoint(dir.string(), gpt, nullptr, st, 1);
    weights_note = "random W1 weights (no runs/w1 checkpoint; speed only) " + ckpt;
  }
  const infer::Model fp32 = infer::load_model(ckpt);
  const std::vector<int32_t> prompt = read_tokens(data_dir, "val", 0, o.prompt_tokens);
  if (fp32.config.vocab_size != 50304 || fp32.config.n_layer != 4 || fp32.config.n_embd != 256)
    std::fprintf(stderr, "bench generate: note: %s is not the W1 shape\n", ckpt.c_str());
  // A sequence that reaches the context ends early: its decode rate would
  // count tokens it never generated.
  if (o.prompt_tokens + o.new_tokens > fp32.config.block_size)
    throw core::ConfigError("--prompt-tokens " + std::to_string(o.prompt_tokens) + " + --new " +
                            std::to_string(o.new_tokens) + " exceed the model's context of " +
                            std::to_string(fp32.config.block_size) + " tokens");
  std::fprintf(stderr, "bench generate I1: %s; prompt %lld tokens, %lld new, %d threads, int8 path %s\n",
               weights_note.c_str(), (long long)o.prompt_tokens, (long long)o.new_tokens, o.threads,
               cpu::int8_dot_name(cpu::cpu_features().int8));
  std::fprintf(stderr, "  quantizing int8 and int4 ...\n");
  const infer::Model int8 = infer::quantize(fp32, infer::Scheme::int8);
  const infer::Model int4 = infer::quantize(fp32, infer::Scheme::int4);

  struct Side {
    Row row;
    const infer::Model* model = nullptr;
  };
  // Batch 1, and the asked batch when it is another.
  const std::vector<int64_t> batches = o.batch == 1 ? std::vector<int64_t>{1} : std::vector<int64_t>{1, o.batch};
  std::vector<Side> sides;
  for (const infer::Model* m : {&fp32, &int8, &int4})
    for (int64_t b : batches) {
      Side s;
      s.model = m;
      s.row.engine = "brisk";
      s.row.format = infer::scheme_name(m->scheme);
      s.row.batch = b;
      s.row.name = "brisk " + s.row.format + " b" + std::to_string(b);
      sides.push_back(s);
      // A bf16 key/value pool at the batch (where the pool is read most),
      // fp32 and int8 weights, run right after its f32-pool row.
      if (b > 1 && m != &int4) {
        s.row.kv = core::DType::bf16;
        s.row.name += " kv-bf16";
        sides.push_back(s);
      }
    }
  {
    Side s;
    s.model = &fp32;
    s.row.engine = "brisk";
    s.row.format = "fp32";
    s.row.batch = o.batch;
    s.row.sampled = true;
    s.row.name = "brisk fp32 b" + std::to_string(o.batch) + " top-p";
    sides.push_back(s);
  }
  std::vector<Row> peers;
  for (int64_t b : batches) {
    Row r;
    r.engine = "pytorch";
    r.format = "fp32";
    r.batch = b;
    r.name = "pytorch fp32 b" + std::to_string(b);
    peers.push_back(r);
  }
  {
    Row r;
    r.engine = "pytorch";
    r.format = "fp32";
    r.batch = o.batch;
    r.sampled = true;
    r.name = "pytorch fp32 b" + std::to_string(o.batch) + " top-p";
    peers.push_back(r);
  }
  std::string prompt_csv;
  for (int32_t t : prompt) prompt_csv += (prompt_csv.empty() ? "" : ",") + std::to_string(t);
  const std::string peer_script = (root / "bench" / "torch_generate_peer.py").string();

  // One untimed run per brisk row first, as the peer warms up in its own
  // process before the runs it reports: a first run pays for page faults
  // and cold caches, and had been timed on brisk's side only.
  std::fprintf(stderr, "  warm-up\n");
  for (Side& s : sides) run_engine(*s.model, prompt, o.new_tokens, s.row.batch, o.threads, s.row.sampled, s.row.kv);
  for (int round = 0; round < o.rounds; ++round) {
    std::fprintf(stderr, "  round %d/%d\n", round + 1, o.rounds);
    // Every other round in reverse order: a row and its neighbour (the f32
    // and bf16 pools) swap who runs first.
    for (size_t k = 0; k < sides.size(); ++k) {
      Side& s = sides[round % 2 ? sides.size() - 1 - k : k];
      const Run r = run_engine(*s.model, prompt, o.new_tokens, s.row.batch, o.threads, s.row.sampled, s.row.kv);
      s.row.prefill_ms.push_back(r.prefill_ms);
      s.row.decode_tok_s.push_back(double(s.row.batch * (o.new_tokens - 1)) / (r.decode_ms / 1e3));
      s.row.tokens = r.tokens;
      s.row.memory_mib = double(s.model->weight_bytes()) / (1 << 20);
    }
    if (!o.peer) continue;
    for (Row& p : peers) {
      std::vector<std::string> args = {o.python, peer_script, "--checkpoint", ckpt, "--prompt", prompt_csv, "--new",
                                       std::to_string(o.new_tokens), "--batch", std::to_string(p.batch), "--rounds", "1",
                                       "--threads", std::to_string(o.threads)};
      if (p.sampled)
        for (const std::string& a : {std::string("--temperature"), std::to_string(kSampleTemperature),
                                     std::string("--top-p"), std::to_string(kSampleTopP)})
          args.push_back(a);
      const ChildResult c = run_child(args);
      const auto rep = report_of(c.out);
      if (c.exit_code != 0 || !rep || !rep->contains("runs")) {
        p.error = rep && rep->contains("error") ? (*rep)["error"].get<std::string>() : "peer failed (exit " + std::to_string(c.exit_code) + ")";
        continue;
      }
      const json& run = (*rep)["runs"][0];
      p.prefill_ms.push_back(run["prefill_ms"].get<double>());
      p.decode_tok_s.push_back(double(p.batch * (o.new_tokens - 1)) / (run["decode_ms"].get<double>() / 1e3));
      p.tokens = run["tokens"].get<std::vector<int32_t>>();
      p.rss_growth_mib =
          double((*rep)["peak_rss_bytes"].get<int64_t>() - (*rep)["baseline_rss_bytes"].get<int64_t>()) / (1 << 20);
      p.memory_mib = double(rep->value("weight_bytes", int64_t(0))) / (1 << 20);
    }
  }

  // Greedy fp32 output against the recompute path (the whole window per token).
  std::vector<int32_t> recompute;
  {
    cpu::CpuBackend be(o.threads);
    train::TrainState st;
    models::Gpt gpt(train::read_checkpoint_config(ckpt, &st), be);
    train::load_checkpoint(ckpt, gpt, nullptr);
    models::SampleOptions so;
    so.temperature = 0;
    so.max_new_tokens = o.new_tokens;
    const auto all = models::generate(gpt, prompt, so);
    recompute.assign(all.begin() + std::ptrdiff_t(prompt.size()), all.end());
  }
  const std::vector<int32_t>& ours = sides[0].row.tokens;
  const bool same_as_recompute = ours == recompute;
  // A peer that failed compared nothing: "not run", not "differs".
  bool peers_ok = true;
  for (const Row& p : peers) peers_ok = peers_ok && p.error.empty();
  const bool peer_compared = o.peer && peers[0].error.empty() && !peers[0].tokens.empty();
  const bool same_as_peer = peer_compared && ours == peers[0].tokens;

  std::vector<Row> rows;
  for (const Side& s : sides) rows.push_back(s.row);
  if (o.peer) rows.insert(rows.end(), peers.begin(), peers.end());
  const double peer_b1 = o.peer && !peers[0].decode_tok_s.empty() ? median(peers[0].decode_tok_s) : 0;
  std::printf("\n== bench generate I1: %lld-token prompt, %lld new tokens, greedy, %d threads, %d rounds ==\n",
              (long long)o.prompt_tokens, (long long)o.new_tokens, o.threads, o.rounds);
  std::printf("%-24s %26s %24s %9s %22s %10s %12s\n", "row", "decode tok/s [range]", "prefill ms [range]", "x peer b1",
              "x peer same b [range]", "x own b1", "weights MiB");
  json jrows = json::array();
  for (const Row& r : rows) {
    if (!r.error.empty()) {
      std::printf("%-24s error: %s\n", r.name.c_str(), r.error.c_str());
      jrows.push_back({{"row", r.name}, {"error", r.error}});
      continue;
    }
    const double tps = median(r.decode_tok_s);
    // Against the peer at the same batch and sampling, formed within each round.
    std::vector<double> same_batch;
    if (r.engine == "brisk")
      for (const Row& q : rows)
        if (q.engine == "pytorch" && q.batch == r.batch && q.sampled == r.sampled && q.error.empty()) {
          const std::vector<double> v = per_round_ratio(r.decode_tok_s, q.decode_tok_s);
          same_batch.insert(same_batch.end(), v.begin(), v.end());
        }
    double own_b1 = 0;
    for (const Row& q : rows)
      if (q.engine == r.engine && q.format == r.format && q.batch == 1 && !q.sampled && q.kv == core::DType::f32 &&
          !q.decode_tok_s.empty())
        own_b1 = median(q.decode_tok_s);
    std::printf("%-24s %26s %24s %9s %22s %10s %12.1f\n", r.name.c_str(), range(r.decode_tok_s, "%.0f").c_str(),
                range(r.prefill_ms, "%.2f").c_str(), peer_b1 > 0 ? (std::to_string(tps / peer_b1).substr(0, 5) + "x").c_str() : "-",
                same_batch.empty() ? "-" : (range(same_batch, "%.2f") + "x").c_str(),
                (std::to_string(tps / own_b1).substr(0, 5) + "x").c_str(), r.memory_mib);
    jrows.push_back({{"row", r.name}, {"engine", r.engine}, {"format", r.format}, {"batch", r.batch},
                     {"sampling", r.sampled ? "top-p" : "greedy"},
                     {"kv_dtype", r.engine == "brisk" ? json(core::dtype_name(r.kv)) : json(nullptr)},
                     {"decode_tokens_per_s", r.decode_tok_s}, {"prefill_ms", r.prefill_ms},
                     {"median_decode_tokens_per_s", tps}, {"vs_peer_batch1", peer_b1 > 0 ? tps / peer_b1 : 0},
                     {"vs_own_batch1", tps / own_b1},
                     {"vs_peer_same_batch", same_batch.empty() ? json(nullptr)
                                                               : json{{"median", median(same_batch)},
                                                                      {"min", *std::min_element(same_batch.begin(), same_batch.end())},
                                                                      {"max", *std::max_element(same_batch.begin(), same_batch.end())},
                                                                      {"per_round", same_batch}}},
                     {"weights_mib", r.memory_mib},
                     {"rss_growth_mib", r.rss_growth_mib >= 0 ? json(r.rss_growth_mib) : json(nullptr)}});
  }
  std::printf("(weights MiB: the parameters' bytes on either side; the KV cache is not in it. The peer's peak RSS "
              "growth over its own baseline, which includes reading the checkpoint file, is in the JSON)\n");
  std::printf("greedy fp32 tokens: %s the recompute path (%zu tokens)%s\n", same_as_recompute ? "identical to" : "DIFFER from",
              recompute.size(),
              !o.peer          ? ""
              : !peer_compared ? "; pytorch did not run (see its row)"
              : same_as_peer   ? "; identical to pytorch"
                               : "; differ from pytorch");
  // The sampled rows side by side, the ratio formed per round.
  const Row& ours_sampled = sides.back().row;
  const std::vector<double> sampled_ratio = o.peer && peers.back().error.empty()
                                                ? per_round_ratio(ours_sampled.decode_tok_s, peers.back().decode_tok_s)
                                                : std::vector<double>{};
  std::printf("top-p sampling (temperature %.1f, top-p %.2f) at batch %lld: brisk %.0f tok/s, %s pytorch\n",
              kSampleTemperature, kSampleTopP, (long long)o.batch, median(ours_sampled.decode_tok_s),
              sampled_ratio.empty() ? "no" : (range(sampled_ratio, "%.2f") + "x").c_str());
  // The bf16 pool against the f32 one: decode rate per round, and whether
  // the first sequence's greedy tokens stayed the same.
  json kv_bf16 = json::array();
  for (const Side& b : sides) {
    if (b.row.kv != core::DType::bf16) continue;
    for (const Side& f : sides) {
      if (f.row.kv != core::DType::f32 || f.row.format != b.row.format || f.row.batch != b.row.batch ||
          f.row.sampled)
        continue;
      const std::vector<double> ratio = per_round_ratio(b.row.decode_tok_s, f.row.decode_tok_s);
      const bool same = b.row.tokens == f.row.tokens;
      std::printf("bf16 key/value pool, %s at batch %lld: %s the f32 pool's decode rate; greedy tokens %s\n",
                  b.row.format.c_str(), (long long)b.row.batch, (range(ratio, "%.3f") + "x").c_str(),
                  same ? "identical" : "differ");
      kv_bf16.push_back({{"format", b.row.format}, {"batch", b.row.batch}, {"vs_f32_pool_per_round", ratio},
                         {"vs_f32_pool_median", median(ratio)}, {"greedy_tokens_identical", same}});
    }
  }

  json quality = nullptr;
  if (o.quality) {
    std::fprintf(stderr, "  quality: %lld validation windows ...\n", (long long)o.quality_windows);
    const int64_t w = fp32.config.block_size;
    data::TokenDataset val(data_dir, "val");
    const int64_t windows = std::min<int64_t>(o.quality_windows, val.size() / w);
    const std::vector<int32_t> calib = read_tokens(data_dir, "train", 0, 8 * w);
    const infer::Model int4_awq = infer::quantize(fp32, infer::Scheme::int4, calib);
    struct Q {
      std::string name;
      const infer::Model* m;
      core::DType kv = core::DType::f32;
      double nll = 0;
      int64_t n = 0, agree = 0;
    };
    std::vector<Q> qs = {{"fp32", &fp32},
                         {"int8", &int8},
                         {"int4", &int4},
                         {"int4+awq", &int4_awq},
                         {"fp32 kv-bf16", &fp32, core::DType::bf16}};  // the weights' fp32, the pool's bf16
    std::vector<std::vector<int32_t>> fp32_top;
    for (Q& q : qs) {
      infer::EngineOptions eo;
      eo.max_seqs = 16;
      eo.max_step_tokens = w;
      eo.threads = o.threads;
      eo.kv_dtype = q.kv;
      infer::Engine e(*q.m, eo);
      for (int64_t i = 0; i < windows; ++i) {
        std::vector<int32_t> ids(static_cast<size_t>(w));
        val.read(i * w, w, ids.data());
        const infer::ScoreResult s = e.score(ids);
        q.nll += s.nll_sum;
        q.n += s.count;
        if (&q == &qs[0]) fp32_top.push_back(s.argmax);
        for (size_t j = 0; j < s.argmax.size(); ++j) q.agree += s.argmax[j] == fp32_top[size_t(i)][j];
      }
    }
    std::printf("\n== quality: KJV validation, %lld windows of %lld tokens ==\n", (long long)windows, (long long)w);
    std::printf("%-13s %12s %10s %16s\n", "weights", "perplexity", "vs fp32", "top-1 = fp32");
    quality = json::array();
    const double base = std::exp(qs[0].nll / double(qs[0].n));
    for (const Q& q : qs) {
      const double ppl = std::exp(q.nll / double(q.n));
      std::printf("%-13s %12.3f %+9.2f%% %15.2f%%\n", q.name.c_str(), ppl, 100 * (ppl / base - 1),
                  100.0 * double(q.agree) / double(q.n));
      quality.push_back({{"weights", q.name}, {"kv_dtype", core::dtype_name(q.kv)}, {"perplexity", ppl}, {"vs_fp32", ppl / base - 1},
                         {"top1_agreement", double(q.agree) / double(q.n)}, {"positions", q.n}});
    }
    std::printf("int4+awq: %s\n", int4_awq.quant_note.c_str());
  }

  const std::string path =
      o.json_path.empty() ? (root / "bench" / "results" / "generate_I1.json").string() : o.json_path;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  const json report = {{"workload", "I1"},          {"weights", weights_note},
                       {"prompt_tokens", o.prompt_tokens}, {"new_tokens", o.new_tokens},
                       {"threads", o.threads},      {"rounds", o.rounds},
                       {"cpu", monitor::cpu_model()}, {"int8_path", cpu::int8_dot_name(cpu::cpu_features().int8)},
                       {"rows", jrows},             {"greedy_identical_to_recompute", same_as_recompute},
                       {"greedy_identical_to_peer", peer_compared ? json(same_as_peer) : json(nullptr)},
                       {"sampled_vs_peer", sampled_ratio}, {"kv_bf16", kv_bf16},
                       {"quality", quality}, {"date", now_iso()}};
  core::write_file_atomic(path, report.dump(2) + "\n");
  std::printf("report: %s\n", shown(path).c_str());
  return same_as_recompute && peers_ok ? 0 : 1;
}

}  // namespace brisk::bench

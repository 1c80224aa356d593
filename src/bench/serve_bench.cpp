// The serving load generator (serve_bench.h).
//
// How it measures:
// - The server is this binary's own `brisk serve`, a child process, so the
//   numbers include everything a client pays: HTTP, JSON, SSE framing, the
//   scheduler's hand-offs. The load generator runs on the same machine and
//   its CPU time is reported beside the server's.
// - Rounds (--rounds, default 3; 1 with --duration-s): each runs the single
//   stream, then the load, so the machine's drift hits both alike; the
//   headline is the median over rounds of each throughput and of the
//   per-round ratio, with the range beside it. Latency percentiles pool
//   every round's requests.
// - Single stream: one request at a time (after one untimed request that
//   opens the connection and touches the server's buffers); its output
//   tokens/s is completion tokens / end-to-end time.
// - Load: N client threads, each with its own keep-alive connection, send
//   requests back to back until R have been sent in the round (or the
//   duration is over);
//   aggregate output tokens/s is every successful request's tokens / the
//   wall time from the first request to the last answer.
// - Latencies are per request, client side: TTFT to the first content
//   chunk, ITL between content chunks (pooled over requests), TPOT =
//   (e2e - TTFT) / (tokens - 1), e2e to [DONE]. Percentiles interpolate
//   between the closest ranks.
#include "brisk/bench/serve_bench.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench_util.h"
#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/shards.h"
#include "brisk/models/gpt.h"
#include "brisk/monitor/machine.h"
#include "brisk/train/checkpoint.h"
#include "serve_load.h"

namespace brisk::bench {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Pct {
  double p50 = 0, p90 = 0, p99 = 0;
};

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * double(sorted.size() - 1);
  const size_t lo = size_t(pos);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - double(lo)) * (sorted[hi] - sorted[lo]);
}

Pct percentiles_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {1e3 * percentile(v, 0.5), 1e3 * percentile(v, 0.9), 1e3 * percentile(v, 0.99)};
}

json to_json(const Pct& p) { return {{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}}; }

// The default weights: the newest runs/w1 checkpoint, else random W1
// weights (serving speed does not depend on what the weights learned).
std::string default_checkpoint(const fs::path& root, int threads, std::string* note) {
  std::string ckpt = train::latest_checkpoint((root / "runs" / "w1").string());
  *note = "trained checkpoint " + ckpt;
  if (!ckpt.empty()) return ckpt;
  cpu::CpuBackend be(threads);
  models::Gpt gpt(models::GptConfig::preset("W1"), be);
  gpt.init_weights(1337);
  train::TrainState st;
  st.tokenizer = "gpt2";
  ckpt = train::save_checkpoint((root / "bench" / "results" / "serve_random_w1").string(), gpt, nullptr, st, 1);
  *note = "random W1 weights (no runs/w1 checkpoint; speed only) " + ckpt;
  return ckpt;
}

// Consecutive windows of the validation split, as token ids, so every
// prompt has exactly `len` tokens whatever the text.
std::vector<std::vector<int32_t>> read_prompts(const std::string& dir, int64_t len, int64_t count) {
  data::TokenDataset d(dir, "val");
  count = std::min(count, d.size() / len);
  if (count < 1) throw core::IoError(dir + ": the val split has fewer than " + std::to_string(len) + " tokens");
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(count), std::vector<int32_t>(static_cast<size_t>(len)));
  for (int64_t i = 0; i < count; ++i) d.read(i * len, len, out[size_t(i)].data());
  return out;
}

// Samples the server's RSS every `every_s` until stopped, and once when
// `mark_s` seconds of load have run (the "after the first minute" point):
// load time only, summed over the rounds' load phases between
// begin_load() and end_load(), not the warm-up or single-stream requests.
class RssSampler {
 public:
  RssSampler(const ServerProcess& server, double every_s, double mark_s)
      : server_(server), every_(every_s), mark_(mark_s), t0_(steady_now()), thread_([this] { loop(); }) {}
  ~RssSampler() { stop(); }
  void begin_load() {
    {
      std::lock_guard lk(m_);
      load_t0_ = steady_now() - t0_;
    }
    cv_.notify_all();
  }
  void end_load() {
    std::lock_guard lk(m_);
    if (load_t0_ >= 0) load_done_ += steady_now() - t0_ - load_t0_;
    load_t0_ = -1;
  }
  void stop() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  json series;          // [[seconds, MiB], ...]
  double at_mark = -1;  // -1: the load ended before the mark

 private:
  void loop() {
    double next = every_ > 0 ? every_ : 1e300;
    bool marked = false;
    std::unique_lock lk(m_);
    for (;;) {
      // When the load reaches the mark, if it is running now.
      const double mark_at = !marked && load_t0_ >= 0 ? load_t0_ + (mark_ - load_done_) : 1e300;
      const double wake = std::min(next, mark_at);
      const double started = load_t0_;
      cv_.wait_for(lk, std::chrono::duration<double>(std::max(0.0, std::min(wake - (steady_now() - t0_), 3600.0))),
                   [&] { return stop_ || load_t0_ != started; });
      if (stop_) return;
      const double t = steady_now() - t0_;
      if (!marked && load_t0_ >= 0 && load_done_ + (t - load_t0_) >= mark_) at_mark = server_.rss_mib(), marked = true;
      if (t >= next) series.push_back({t, server_.rss_mib()}), next += every_;
    }
  }
  const ServerProcess& server_;
  const double every_, mark_, t0_;
  double load_t0_ = -1, load_done_ = 0;  // the running load phase's start (-1: none), the load time before it
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

std::string fmt(double v, const char* f = "%.1f") {
  if (v < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

int run_serve_bench(const ServeBenchOptions& in) {
  ServeBenchOptions o = in;
  if (o.workload != "I2" && o.workload != "I3")
    throw core::ConfigError("unknown serving workload '" + o.workload + "' (allowed: I2, I3)");
  if (o.concurrency == 0) o.concurrency = o.workload == "I2" ? 16 : 64;
  if (o.slots == 0) o.slots = std::min(o.concurrency, 64);
  if (o.requests == 0 && o.duration_s <= 0) o.requests = 2 * int64_t(o.concurrency);
  if (o.concurrency < 1 || o.slots < 1 || o.requests < 0 || o.prompt_tokens < 1 || o.new_tokens < 2 ||
      o.threads < 0 || o.single_requests < 1 || o.rounds < 1)
    throw core::ConfigError("concurrency, slots, prompt tokens, single requests and rounds must be >= 1, new tokens >= 2");
  if (!(o.temperature >= 0)) throw core::ConfigError("temperature must be >= 0 (0 = greedy)");
  if (!(o.duration_s >= 0) || !(o.rss_every_s > 0))
    throw core::ConfigError("--duration-s must be >= 0 (0: a count of requests) and --rss-every-s positive");
  const fs::path root = repo_root();
  const std::string data_dir = o.data_dir.empty() ? (root / "data" / "kjv-gpt2").string() : o.data_dir;
  std::string weights_note = "checkpoint " + o.checkpoint;
  const std::string ckpt = o.checkpoint.empty() ? default_checkpoint(root, std::max(1, o.threads), &weights_note)
                                                : o.checkpoint;
  const int64_t max_requests = o.requests > 0 ? o.requests : 1 << 30;
  const auto prompts = read_prompts(data_dir, o.prompt_tokens, std::min<int64_t>(max_requests, 4096));
  std::fprintf(stderr, "bench serve %s: %s; %d concurrent, %lld-token prompts, %lld new tokens, %d slots, %d threads\n",
               o.workload.c_str(), weights_note.c_str(), o.concurrency, (long long)o.prompt_tokens,
               (long long)o.new_tokens, o.slots, o.threads);

  ServerProcess server(self_exe(),
                       {"--model", ckpt, "--port", "0", "--slots", std::to_string(o.slots), "--max-queue",
                        std::to_string(std::max(o.concurrency, 1)), "--threads", std::to_string(o.threads)},
                       300);
  std::fprintf(stderr, "  %s\n", server.start_line().c_str());
  const double rss_start = server.rss_mib();

  // Rounds: a single-stream phase, then the load, again and again, so that
  // the machine's drift hits both alike; the ratio is taken per round.
  const int rounds = o.duration_s > 0 ? 1 : o.rounds;
  const double mark_s = o.duration_s > 0 ? 0.1 * o.duration_s : 60.0;
  std::vector<StreamResult> single;
  std::vector<std::vector<StreamResult>> per_thread(size_t(o.concurrency));
  std::vector<double> single_round_tok_s, load_round_tok_s, round_ratio;
  double wall = 0, server_ticks = 0, own_ticks = 0, busy = 0, span_ticks = 0;
  RssSampler rss(server, o.rss_every_s, mark_s);
  {
    StreamClient c(server.port());
    const StreamResult warm = c.complete(prompts[0], o.new_tokens, o.temperature);
    if (!warm.error.empty()) throw core::Error("the first request failed: " + warm.error);
  }
  for (int round = 0; round < rounds; ++round) {
    double round_tokens = 0, round_time = 0;
    {
      StreamClient c(server.port());
      for (int i = 0; i < o.single_requests; ++i) {
        single.push_back(c.complete(prompts[size_t(round * o.single_requests + i + 1) % prompts.size()], o.new_tokens, o.temperature));
        const StreamResult& r = single.back();
        if (!r.error.empty()) throw core::Error("a single-stream request failed: " + r.error);
        round_tokens += double(r.tokens);
        round_time += r.e2e_s;
      }
    }
    single_round_tok_s.push_back(round_tokens / round_time);
    std::fprintf(stderr, "  round %d/%d: single stream %.0f output tok/s; load: %d streams ...\n", round + 1, rounds,
                 single_round_tok_s.back(), o.concurrency);
    std::atomic<int64_t> next{0};
    std::vector<std::vector<StreamResult>> got(size_t(o.concurrency));
    const auto [busy0, total0] = machine_cpu_ticks();
    const double server_ticks0 = server.cpu_ticks(), own_ticks0 = own_cpu_ticks();
    const double t0 = steady_now();
    rss.begin_load();
    {
      std::vector<std::thread> threads;
      for (int k = 0; k < o.concurrency; ++k)
        threads.emplace_back([&, k] {
          StreamClient c(server.port());
          for (;;) {
            const int64_t i = next++;
            if (i >= max_requests || (o.duration_s > 0 && steady_now() - t0 >= o.duration_s)) break;
            got[size_t(k)].push_back(c.complete(prompts[size_t(i) % prompts.size()], o.new_tokens, o.temperature));
          }
        });
      for (std::thread& t : threads) t.join();
    }
    rss.end_load();
    const double round_wall = steady_now() - t0;
    const auto [busy1, total1] = machine_cpu_ticks();
    server_ticks += server.cpu_ticks() - server_ticks0;
    own_ticks += own_cpu_ticks() - own_ticks0;
    busy += busy1 - busy0;
    span_ticks += total1 - total0;
    wall += round_wall;
    int64_t round_out = 0;
    for (size_t k = 0; k < got.size(); ++k)
      for (StreamResult& r : got[k]) {
        if (r.error.empty()) round_out += r.tokens;
        per_thread[k].push_back(std::move(r));
      }
    load_round_tok_s.push_back(double(round_out) / round_wall);
    round_ratio.push_back(load_round_tok_s.back() / single_round_tok_s.back());
  }
  rss.stop();
  const double rss_end = server.rss_mib();
  std::string exit_how;
  const int exit_code = server.stop(60, &exit_how);

  // Summary.
  std::vector<double> single_ttft, single_itl, single_tpot;
  for (const StreamResult& r : single) {
    single_ttft.push_back(r.ttft_s);
    single_itl.insert(single_itl.end(), r.gaps_s.begin(), r.gaps_s.end());
    single_tpot.push_back((r.e2e_s - r.ttft_s) / double(r.tokens - 1));
  }
  const double single_tok_s = median(single_round_tok_s);
  const double single_decode_tok_s = 1.0 / median(single_tpot);
  const Pct s_ttft = percentiles_ms(single_ttft), s_itl = percentiles_ms(single_itl),
            s_tpot = percentiles_ms(single_tpot);
  std::vector<double> ttft, itl, tpot, e2e;
  int64_t ok = 0, errors = 0, tokens = 0, chunks = 0;
  json error_examples = json::array();
  for (const auto& v : per_thread)
    for (const StreamResult& r : v) {
      if (!r.error.empty()) {
        ++errors;
        if (error_examples.size() < 5) error_examples.push_back(r.error);
        continue;
      }
      ++ok;
      tokens += r.tokens;
      chunks += r.chunks;
      ttft.push_back(r.ttft_s);
      e2e.push_back(r.e2e_s);
      tpot.push_back((r.e2e_s - r.ttft_s) / double(r.tokens - 1));
      itl.insert(itl.end(), r.gaps_s.begin(), r.gaps_s.end());
    }
  const Pct p_ttft = percentiles_ms(ttft), p_itl = percentiles_ms(itl), p_tpot = percentiles_ms(tpot),
            p_e2e = percentiles_ms(e2e);
  const double agg_tok_s = median(load_round_tok_s), req_s = double(ok) / wall, ratio = median(round_ratio);
  auto share = [&](double t) { return span_ticks > 0 ? 100.0 * t / span_ticks : -1.0; };
  const double server_pct = share(server_ticks), own_pct = share(own_ticks);
  const double others_pct = span_ticks > 0 ? std::max(0.0, share(busy - server_ticks - own_ticks)) : -1;
  auto spread = [](const std::vector<double>& v, const char* f) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, *std::min_element(v.begin(), v.end()));
    std::string out = std::string("[") + buf + "-";
    std::snprintf(buf, sizeof buf, f, *std::max_element(v.begin(), v.end()));
    return out + buf + "]";
  };
  auto growth = [](double from, double to) { return from > 0 && to > 0 ? 100.0 * (to / from - 1) : 0.0; };

  char sampling[48] = "greedy";
  if (o.temperature > 0) std::snprintf(sampling, sizeof sampling, "temperature %g", o.temperature);
  std::printf("\n== bench serve %s: %d concurrent streams, %lld-token prompts, %lld new tokens, %s, "
              "%d slots, %d engine threads ==\n",
              o.workload.c_str(), o.concurrency, (long long)o.prompt_tokens, (long long)o.new_tokens, sampling, o.slots,
              o.threads);
  std::printf("server: %s\n", server.start_line().c_str());
  std::printf("single stream (%d requests per round): %.0f %s output tok/s (decode %.0f tok/s = 1 / median TPOT); "
              "p50 TTFT %.2f ms, ITL %.2f ms, TPOT %.2f ms\n",
              o.single_requests, single_tok_s, spread(single_round_tok_s, "%.0f").c_str(), single_decode_tok_s,
              s_ttft.p50, s_itl.p50, s_tpot.p50);
  std::printf("%-22s %10s %10s %10s\n", "latency (ms)", "p50", "p90", "p99");
  const std::pair<const char*, const Pct*> rows[] = {
      {"TTFT", &p_ttft}, {"inter-token (ITL)", &p_itl}, {"TPOT", &p_tpot}, {"end-to-end", &p_e2e}};
  for (const auto& [name, p] : rows) std::printf("%-22s %10.2f %10.2f %10.2f\n", name, p->p50, p->p90, p->p99);
  std::printf("requests: %lld ok, %lld errors in %.2f s over %d rounds: %.2f req/s, %.0f %s output tok/s = %.2fx %s "
              "single stream (medians [min-max] over rounds; the ratio per round)\n",
              (long long)ok, (long long)errors, wall, rounds, req_s, agg_tok_s, spread(load_round_tok_s, "%.0f").c_str(),
              ratio, spread(round_ratio, "%.2f").c_str());
  for (const auto& e : error_examples) std::printf("  error: %s\n", e.get<std::string>().c_str());
  std::printf("content chunks %lld for %lld tokens\n", (long long)chunks, (long long)tokens);
  // The growth over the mark may be negative (fmt() prints negatives as "-", its "not measured").
  char over_mark[64] = "";
  if (rss.at_mark > 0) std::snprintf(over_mark, sizeof over_mark, ", %+.1f%% over the mark", growth(rss.at_mark, rss_end));
  std::printf("server RSS MiB: start %s, after %g s %s, end %s (%+.1f%% over start%s)\n", fmt(rss_start).c_str(),
              mark_s, fmt(rss.at_mark).c_str(), fmt(rss_end).c_str(), growth(rss_start, rss_end), over_mark);
  std::printf("CPU during the load (share of the machine): server %s%%, load generator %s%%, others %s%%\n",
              fmt(server_pct).c_str(), fmt(own_pct).c_str(), fmt(others_pct).c_str());
  std::printf("server on SIGTERM: %s\n", exit_how.c_str());

  const std::string path = o.json_path.empty()
                               ? (root / "bench" / "results" / ("serve_" + o.workload + ".json")).string()
                               : o.json_path;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  const json report = {
      {"workload", o.workload},
      {"weights", weights_note},
      {"concurrency", o.concurrency},
      {"slots", o.slots},
      {"threads", o.threads},
      {"prompt_tokens", o.prompt_tokens},
      {"new_tokens", o.new_tokens},
      {"temperature", o.temperature},
      {"requests_target", o.requests > 0 ? json(o.requests) : json(nullptr)},  // null: until the duration ends
      {"duration_s", o.duration_s},
      {"server", server.start_line()},
      {"rounds", rounds},
      {"single_stream",
       {{"requests", o.single_requests * rounds},
        {"round_output_tokens_per_s", single_round_tok_s},
        {"output_tokens_per_s", single_tok_s},
        {"decode_tokens_per_s", single_decode_tok_s},
        {"ttft_ms", to_json(s_ttft)},
        {"itl_ms", to_json(s_itl)},
        {"tpot_ms", to_json(s_tpot)}}},
      {"completed", ok},
      {"errors", errors},
      {"error_examples", error_examples},
      {"wall_s", wall},
      {"requests_per_s", req_s},
      {"output_tokens", tokens},
      {"content_chunks", chunks},
      {"output_tokens_per_s", agg_tok_s},
      {"round_output_tokens_per_s", load_round_tok_s},
      {"vs_single_stream", ratio},
      {"round_vs_single_stream", round_ratio},
      {"ttft_ms", to_json(p_ttft)},
      {"itl_ms", to_json(p_itl)},
      {"tpot_ms", to_json(p_tpot)},
      {"e2e_ms", to_json(p_e2e)},
      {"rss_mib",
       {{"start", rss_start},
        {"mark_s", mark_s},
        {"at_mark", rss.at_mark > 0 ? json(rss.at_mark) : json(nullptr)},
        {"end", rss_end},
        {"growth_pct_over_start", growth(rss_start, rss_end)},
        {"growth_pct_over_mark", rss.at_mark > 0 ? json(growth(rss.at_mark, rss_end)) : json(nullptr)},
        {"series", rss.series}}},
      {"cpu_pct", {{"server", server_pct}, {"load_generator", own_pct}, {"others", others_pct}}},
      {"server_exit_code", exit_code},
      {"server_exit", exit_how},
      {"cpu", monitor::cpu_model()},
      {"date", now_iso()}};
  core::write_file_atomic(path, report.dump(2) + "\n");
  std::printf("report: %s\n", shown(path).c_str());
  return errors == 0 && exit_code == 0 && ok > 0 ? 0 : 1;
}

}  // namespace brisk::bench

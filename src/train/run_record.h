// What a finished GPT run leaves in its directory for `brisk report` and
// for the recommendations (run_record.cpp): run_summary.json -- the facts
// only the trainer knows (measured peak, CPU flags, threads and cores, the
// memory plan, machine RAM and peak RSS, precision path, loader workers, the
// --profile table) -- and recommendations.json, computed from it and the
// run's metrics.jsonl (monitor/advice.h). Called once, by rank 0, at the
// end of a run.
#pragma once

#include <string>

#include "brisk/models/gpt.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/config.h"

namespace brisk::train {

struct RunFacts {
  const TrainConfig* cfg = nullptr;
  const PrecisionChoice* precision = nullptr;
  double peak_gflops = 0;   // what MFU was measured against (the whole job's)
  bool peak_bf16 = false;
  int threads = 0;          // the CPU backend's; 0 on a GPU
  int world = 1;
  int64_t batch_local = 0;  // this rank's share of train.batch: what its plan holds
  std::string device_name;  // the GPU's description; the CPU model is read here
  std::string profile;      // the --profile table, "" without it
};

// Writes run_summary.json and recommendations.json into cfg.out_dir. The
// memory plan is the train program's, as the start-up line printed it.
// Throws IoError when the disk refuses.
void write_run_record(const RunFacts& facts, models::Gpt& model, const optim::AdamW& adamw);

}  // namespace brisk::train

// The [dist] section of a training config (docs/distributed.md).
#pragma once

#include <string>

namespace brisk::dist {

struct DistConfig {
  double bucket_mb = 25;    // gradient bucket size, MiB
  int zero = 0;             // 0: every rank keeps all optimizer state; 1: AdamW state sharded across ranks
  double timeout_s = 300;   // a collective waiting longer ends the rank (comm_thread.h)
  std::string backend = "auto";  // "auto" (nccl with train.device = "cuda", mpi otherwise), "mpi", "nccl"
};

}  // namespace brisk::dist

// How this process was started: alone (the default: no MPI at run time), or
// as one rank of a job that mpirun, srun or another MPI launcher started.
// Only a launched process initialises MPI, so `brisk train` on its own never
// needs mpirun.
#pragma once

#include <memory>
#include <string>

#include "brisk/core/communicator.h"

namespace brisk::dist {

struct Launch {
  bool launched = false;  // an MPI launcher started this process
  int rank = 0, size = 1;
  // The ranks on this machine and this one's index among them (threads per
  // rank, the GPU a rank uses); 1 and 0 where the launcher does not say.
  int local_size = 1, local_rank = 0;
  std::string launcher;   // "mpirun", "slurm", "pmi" or "" (alone)
};
// From the launcher's environment (OMPI_COMM_WORLD_*, PMIX_*/PMI_*, SLURM_*).
Launch detect_launch();

// Whether this build can talk MPI (Open MPI's development files were found
// when it was configured).
bool mpi_available();

// Initialises MPI (threads serialised: collectives run on dist::CommThread)
// and returns the world communicator; MPI is finalised when it is destroyed.
// One per process. Throws ConfigError when MPI is unavailable.
std::unique_ptr<core::Communicator> connect_mpi();

}  // namespace brisk::dist
